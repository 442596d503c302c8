package admin

import (
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

// Bounds of a provider block.
const (
	MaxProviderTimeoutSecs = 3600
	maxProviderHeaders     = 32
	maxProviderHeaderValue = 4096
	providerModelSeparator = "#"
)

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
	if spec.GetModelId() == "" {
		spec.ModelId = p.GetModel()
	}
	if p.GetModel() == "" {
		p.Model = spec.GetModelId()
	}
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
	if err != nil {
		return false
	}
	host := pu.Hostname()
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
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
