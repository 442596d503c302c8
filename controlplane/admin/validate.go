package admin

import (
	"cmp"
	"math"
	"net"
	"net/http"
	"net/url"
	"strings"

	"golang.org/x/net/http/httpguts"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/secretref"
	"github.com/smg-project/smg/internal/workerurl"
)

// Bounds of a spec and its provider block. Each is far above any real engine's need and
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
	MaxProviderTimeoutSecs     = 3600
	maxProviderHeaders         = 32
	maxProviderHeaderValue     = 4096
	providerModelSeparator     = "#" // an external worker's url: base#model
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

// providerHeadersRefused are headers the router sets itself (or must never
// send on a client's behalf) for a provider.
var providerHeadersRefused = map[string]bool{
	"Authorization": true, "Host": true, "Content-Length": true, "Content-Type": true, "Cookie": true,
	"Connection": true, "Proxy-Connection": true, "Keep-Alive": true, "Proxy-Authorization": true, "Te": true,
	"Trailer": true, "Transfer-Encoding": true, "Upgrade": true, "Accept-Encoding": true,
}

// normalizeProvider checks an external worker's spec and puts it in
// canonical form (in place): its url is the provider's base URL and the
// local model, base#model, so one provider serves several models as
// distinct workers (the id derives from the url). The provider is never
// contacted here. plainLoopback allows http:// to a loopback address
// (--provider-allow-insecure-loopback, for tests with a local fake).
func normalizeProvider(spec *smgv1.WorkerSpec, o workerurl.Options, plainLoopback bool) error {
	p := spec.GetProvider()
	base, _, _ := strings.Cut(spec.GetUrl(), providerModelSeparator) // a stored url carries its model already
	u, err := workerurl.Normalize(base, o)
	if err != nil {
		return errBadRequest("url", "%s", err.Error())
	}
	switch {
	case strings.HasPrefix(u, "https://"):
	case strings.HasPrefix(u, "http://") && plainLoopback && loopbackURL(u):
	case strings.HasPrefix(u, "http://") && plainLoopback:
		return errBadRequest("url", "url %s: a provider is reached over https:// (plain http:// only to a loopback address under --provider-allow-insecure-loopback)", u)
	default:
		return errBadRequest("url", "url %s: a provider is reached over https:// only: its API key must not cross the network in clear", u)
	}
	spec.ModelId = cmp.Or(spec.GetModelId(), p.GetModel())
	p.Model = cmp.Or(p.GetModel(), spec.GetModelId())
	if spec.GetModelId() == "" {
		return errBadRequest("model_id", "an external worker needs model_id (the local model name) or provider.model")
	}
	if strings.Contains(spec.GetModelId(), providerModelSeparator) {
		return errBadRequest("model_id", "model_id of an external worker must not contain %q", providerModelSeparator)
	}
	spec.Url = u + providerModelSeparator + spec.GetModelId()
	spec.ConnectionMode = ""
	return nil
}

func loopbackURL(u string) bool {
	pu, err := url.Parse(u)
	return err == nil && (pu.Hostname() == "localhost" || net.ParseIP(pu.Hostname()).IsLoopback()) // a nil IP is no loopback
}

// validateProvider checks the fields of an external worker that have no
// meaning for it (it has no load feed, no node, no PD role) and its
// provider block. The key reference is resolved here, so a missing or
// world-readable key file, or an unset variable, is refused at once,
// naming it (never the key).
func validateProvider(s *smgv1.WorkerSpec) error {
	p := s.GetProvider()
	switch {
	case s.GetWorkerType() != "" && s.GetWorkerType() != "regular":
		return errBadRequest("worker_type", "an external worker is regular: a provider has no prefill/decode role")
	case s.GetApiKey() != "":
		return errBadRequest("api_key", "an external worker's key is given by reference in provider.api_key_ref (env:NAME or file:/path), never in api_key")
	case s.GetOverload() != nil:
		return errBadRequest("overload", "an external worker has no load feed, so it is never flagged: it takes no overload block")
	case s.GetNode() != "":
		return errBadRequest("node", "an external worker is not on a node: no agent covers it")
	case s.DpSize != nil || s.BootstrapPort != nil || s.LoadMonitorIntervalSecs != nil || s.MaxRunningRequests != nil:
		return errBadRequest("provider", "dp_size, bootstrap_port, load_monitor_interval_secs and max_running_requests describe an engine, not a provider")
	case len(p.GetModel()) > maxShortString:
		return errBadRequest("provider.model", "provider.model must be at most %d bytes", maxShortString)
	case p.TimeoutSecs != nil && (p.GetTimeoutSecs() < 1 || p.GetTimeoutSecs() > MaxProviderTimeoutSecs):
		return errBadRequest("provider.timeout_secs", "provider.timeout_secs must be 1-%d, got %d", MaxProviderTimeoutSecs, p.GetTimeoutSecs())
	case !budget(p.GetSpillRequestsPerSec()):
		return errBadRequest("provider.spill_requests_per_sec", "provider.spill_requests_per_sec must be a finite number >= 0")
	case !budget(p.GetSpillTokensPerSec()):
		return errBadRequest("provider.spill_tokens_per_sec", "provider.spill_tokens_per_sec must be a finite number >= 0")
	case len(p.GetHeaders()) > maxProviderHeaders:
		return errBadRequest("provider.headers", "provider.headers must have at most %d entries", maxProviderHeaders)
	}
	for k, v := range p.GetHeaders() {
		name := http.CanonicalHeaderKey(k)
		switch {
		case !httpguts.ValidHeaderFieldName(k) || len(k) > maxShortString:
			return errBadRequest("provider.headers", "provider.headers: %q is not a header name", k)
		case providerHeadersRefused[name] || strings.HasPrefix(name, "X-Smg-"):
			return errBadRequest("provider.headers", "provider.headers: %s is set by the router, not by the spec", name)
		case len(v) > maxProviderHeaderValue || strings.ContainsAny(v, "\r\n\x00"):
			return errBadRequest("provider.headers", "provider.headers: the value of %s must be one line of at most %d bytes", name, maxProviderHeaderValue)
		}
	}
	if ref := p.GetApiKeyRef(); ref != "" {
		if _, err := secretref.Resolve(ref); err != nil {
			return errBadRequest("provider.api_key_ref", "provider.api_key_ref: %s", err.Error())
		}
	}
	return nil
}

func budget(v float64) bool { return v >= 0 && !math.IsInf(v, 0) }
