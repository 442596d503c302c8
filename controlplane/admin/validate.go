package admin

import (
	"net/url"
	"strings"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// Defaults of a worker spec (facts.md, "Admin API").
const (
	DefaultPriority = 50
	DefaultCost     = 1.0
)

// validateSpec checks what can be checked without the engine and answers 400
// naming the field. The overload block is resolved later, by registration,
// because the spec says out-of-range thresholds fail the registration (202).
func validateSpec(s *smgv1.WorkerSpec) error {
	if s == nil {
		return errBadRequest("url", "url is required")
	}
	if err := validateURL(s.GetUrl()); err != nil {
		return err
	}
	switch s.GetWorkerType() {
	case "", "regular", "prefill", "decode":
	default:
		return errBadRequest("worker_type", "worker_type must be regular, prefill or decode, got %q", s.GetWorkerType())
	}
	switch s.GetConnectionMode() {
	case "", "http":
	case "grpc":
		return errGRPCUnsupported("connection_mode")
	default:
		return errBadRequest("connection_mode", "connection_mode must be http or grpc, got %q", s.GetConnectionMode())
	}
	if s.Priority != nil && s.GetPriority() < 0 {
		return errBadRequest("priority", "priority must be >= 0, got %d", s.GetPriority())
	}
	if s.Cost != nil && !(s.GetCost() >= 0) {
		return errBadRequest("cost", "cost must be >= 0, got %v", s.GetCost())
	}
	if s.DpSize != nil && s.GetDpSize() < 1 {
		return errBadRequest("dp_size", "dp_size must be >= 1, got %d", s.GetDpSize())
	}
	if s.BootstrapPort != nil && (s.GetBootstrapPort() < 1 || s.GetBootstrapPort() > 65535) {
		return errBadRequest("bootstrap_port", "bootstrap_port must be a port number (1-65535), got %d", s.GetBootstrapPort())
	}
	if s.LoadMonitorIntervalSecs != nil && s.GetLoadMonitorIntervalSecs() < 0 {
		return errBadRequest("load_monitor_interval_secs", "load_monitor_interval_secs must be >= 0, got %d", s.GetLoadMonitorIntervalSecs())
	}
	if s.MaxRunningRequests != nil && s.GetMaxRunningRequests() < 1 {
		return errBadRequest("max_running_requests", "max_running_requests must be >= 1, got %d", s.GetMaxRunningRequests())
	}
	return nil
}

func validateURL(raw string) error {
	if raw == "" {
		return errBadRequest("url", "url is required")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return errBadRequest("url", "url %q is invalid: %v", raw, err)
	}
	switch u.Scheme {
	case "http", "https":
	case "grpc", "grpcs":
		return errGRPCUnsupported("url")
	default:
		return errBadRequest("url", "url %q must start with http://, https://, grpc:// or grpcs://", raw)
	}
	if u.Host == "" || strings.ContainsAny(u.Host, " ") {
		return errBadRequest("url", "url %q has no host", raw)
	}
	return nil
}

// errGRPCUnsupported refuses a gRPC engine at once: registration could only
// fail later.
func errGRPCUnsupported(field string) error {
	return errBadRequest(field, "gRPC engines are not supported yet: register the engine's HTTP URL (http:// or https://) with connection_mode http")
}

// validateUpdate checks a PATCH. The overload block is never patchable.
func validateUpdate(u *smgv1.WorkerUpdate) error {
	if u.GetOverload() != nil {
		return errBadRequest("overload",
			"the overload block cannot be changed by PATCH; send the complete spec with PUT /workers/{worker_id}")
	}
	if u.Priority != nil && u.GetPriority() < 0 {
		return errBadRequest("priority", "priority must be >= 0, got %d", u.GetPriority())
	}
	if u.Cost != nil && !(u.GetCost() >= 0) {
		return errBadRequest("cost", "cost must be >= 0, got %v", u.GetCost())
	}
	if u.LoadMonitorIntervalSecs != nil && u.GetLoadMonitorIntervalSecs() < 0 {
		return errBadRequest("load_monitor_interval_secs", "load_monitor_interval_secs must be >= 0, got %d", u.GetLoadMonitorIntervalSecs())
	}
	if u.MaxRunningRequests != nil && u.GetMaxRunningRequests() < 1 {
		return errBadRequest("max_running_requests", "max_running_requests must be >= 1, got %d", u.GetMaxRunningRequests())
	}
	return nil
}
