package admin

import (
	"strings"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/workerurl"
)

// Bounds of a spec's numbers. Each is far above any real engine's need and
// low enough that one worker cannot starve its model's group:
// load_monitor_interval_secs is the group's poll interval (the smallest
// override wins), so an hour is the longest a model may go unpolled.
const (
	MaxPriority                = 1000
	MaxCost                    = 1e6
	MaxDPSize                  = 1024
	MaxLoadMonitorIntervalSecs = 3600
	MaxMaxRunningRequests      = 1 << 20
	maxLabels                  = 64
	maxShortString             = 256 // model ids, label keys and values, node names, types
	maxAPIKey                  = 4096
)

// normalizeSpec puts the spec's URL in canonical form (in place; the caller
// owns spec), so that aliases of one engine meet the duplicate check.
func normalizeSpec(spec *smgv1.WorkerSpec, o workerurl.Options) error {
	u, err := workerurl.Normalize(spec.GetUrl(), o)
	if err != nil {
		return errBadRequest("url", "%s", err.Error())
	}
	spec.Url = u
	switch grpcURL := strings.HasPrefix(u, "grpc"); {
	case grpcURL && spec.GetConnectionMode() == "http":
		return errBadRequest("connection_mode", "connection_mode http does not fit url %s: a grpc:// or grpcs:// worker is connected over gRPC", u)
	case grpcURL:
		spec.ConnectionMode = "grpc" // GET /workers shows how the worker is connected
	case spec.GetConnectionMode() == "grpc":
		return errBadRequest("connection_mode", "connection_mode grpc needs a grpc:// or grpcs:// url, got %s", u)
	}
	return nil
}

// validateSpec checks what can be checked without the engine and answers 400
// naming the field. The overload block is resolved later, by registration,
// because the spec says out-of-range thresholds fail the registration (202).
func validateSpec(s *smgv1.WorkerSpec) error {
	switch s.GetWorkerType() {
	case "", "regular", "prefill", "decode":
	default:
		return errBadRequest("worker_type", "worker_type must be regular, prefill or decode, got %q", s.GetWorkerType())
	}
	switch s.GetConnectionMode() {
	case "", "http", "grpc":
	default:
		return errBadRequest("connection_mode", "connection_mode must be http or grpc, got %q", s.GetConnectionMode())
	}
	if s.DpSize != nil && (s.GetDpSize() < 1 || s.GetDpSize() > MaxDPSize) {
		return errBadRequest("dp_size", "dp_size must be 1-%d, got %d", MaxDPSize, s.GetDpSize())
	}
	if s.BootstrapPort != nil && (s.GetBootstrapPort() < 1 || s.GetBootstrapPort() > 65535) {
		return errBadRequest("bootstrap_port", "bootstrap_port must be a port number (1-65535), got %d", s.GetBootstrapPort())
	}
	for name, v := range map[string]string{"model_id": s.GetModelId(), "runtime_type": s.GetRuntimeType(), "node": s.GetNode()} {
		if len(v) > maxShortString {
			return errBadRequest(name, "%s must be at most %d bytes, got %d", name, maxShortString, len(v))
		}
	}
	if len(s.GetModels()) > maxLabels {
		return errBadRequest("models", "models must list at most %d models, got %d", maxLabels, len(s.GetModels()))
	}
	for _, m := range s.GetModels() {
		if len(m) > maxShortString {
			return errBadRequest("models", "each of models must be at most %d bytes", maxShortString)
		}
	}
	return validateMutable(s.Priority, s.Cost, s.LoadMonitorIntervalSecs, s.MaxRunningRequests, s.GetLabels(), s.GetApiKey())
}

// validateMutable checks the fields a PATCH may change too.
func validateMutable(priority *int32, cost *float64, interval, maxRunning *int32, labels map[string]string, apiKey string) error {
	if priority != nil && (*priority < 0 || *priority > MaxPriority) {
		return errBadRequest("priority", "priority must be 0-%d, got %d", MaxPriority, *priority)
	}
	if cost != nil && !(*cost >= 0 && *cost <= MaxCost) { // NaN and ±Infinity fail too
		return errBadRequest("cost", "cost must be a finite number 0-%g, got %v", float64(MaxCost), *cost)
	}
	if interval != nil && (*interval < 0 || *interval > MaxLoadMonitorIntervalSecs) {
		return errBadRequest("load_monitor_interval_secs",
			"load_monitor_interval_secs must be 0-%d (the group polls at its smallest override, so one worker must not stop its model's polls), got %d",
			MaxLoadMonitorIntervalSecs, *interval)
	}
	if maxRunning != nil && (*maxRunning < 1 || *maxRunning > MaxMaxRunningRequests) {
		return errBadRequest("max_running_requests", "max_running_requests must be 1-%d, got %d", MaxMaxRunningRequests, *maxRunning)
	}
	if len(labels) > maxLabels {
		return errBadRequest("labels", "labels must have at most %d entries, got %d", maxLabels, len(labels))
	}
	for k, v := range labels {
		if len(k) > maxShortString || len(v) > maxShortString {
			return errBadRequest("labels", "label keys and values must be at most %d bytes", maxShortString)
		}
	}
	if len(apiKey) > maxAPIKey {
		return errBadRequest("api_key", "api_key must be at most %d bytes", maxAPIKey)
	}
	return nil
}

// validateUpdate checks a PATCH. An overload block in it is not checked: the
// spec says PATCH cannot change the block and keeps it as is, so it is dropped.
func validateUpdate(u *smgv1.WorkerUpdate) error {
	if u.Node != nil && len(u.GetNode()) > maxShortString {
		return errBadRequest("node", "node must be at most %d bytes, got %d", maxShortString, len(u.GetNode()))
	}
	return validateMutable(u.Priority, u.Cost, u.LoadMonitorIntervalSecs, u.MaxRunningRequests, u.GetLabels(), u.GetApiKey())
}
