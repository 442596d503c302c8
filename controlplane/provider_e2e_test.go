package controlplane_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/smg-project/smg/controlplane/admin"
	"github.com/smg-project/smg/controlplane/registry"
)

// providerKeyFile writes a key readable by its owner only (mode 0600), or
// with mode, and returns its path.
func providerKeyFile(t *testing.T, key string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "provider.key")
	if err := os.WriteFile(p, []byte(key), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// An external worker registers without the control plane contacting the
// provider: Ready at once, never probed nor polled (an engine registered
// beside it is polled meanwhile), shown as external in GET /workers with
// its key reference and its extra headers' values redacted. Two models of
// one provider are two workers.
func TestExternalWorkerRegistersWithoutContact(t *testing.T) {
	opts := fastOptions()
	opts.ProviderAllowInsecureLoopback = true
	h := startCP(t, opts)
	var hits atomic.Int64
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { hits.Add(1) }))
	t.Cleanup(provider.Close)
	engine := startSim(t, nil)
	keyPath := providerKeyFile(t, "sk-never-shown-0123", 0o600)

	body := func(model string) string {
		return fmt.Sprintf(`{"url":%q,"model_id":%q,"provider":{"model":"gpt-x","api_key_ref":"file:%s","headers":{"OpenAI-Organization":"org-hidden"}}}`,
			provider.URL+"/v1", model, keyPath)
	}
	var ids []string
	for _, model := range []string{"local-a", "local-b"} {
		r := h.do(t, http.MethodPost, "/workers", body(model))
		if r.status != http.StatusAccepted {
			t.Fatalf("POST /workers = %d %s", r.status, r.body)
		}
		id, _ := r.json(t)["worker_id"].(string)
		ids = append(ids, id)
		h.waitFor(t, "external worker Ready", ready(id))
	}
	if ids[0] == ids[1] || ids[0] != admin.WorkerID(provider.URL+"/v1#local-a") {
		t.Fatalf("worker ids %v: want one per model, from base#model", ids)
	}
	engineID := h.register(t, fmt.Sprintf(`{"url":%q}`, engine.URL()))
	first := h.reg.Get(engineID).LoadRevision
	h.waitFor(t, "the engine polled again", func(s *registry.Snapshot) bool { return s.Get(engineID).LoadRevision > first+1 })
	if n := hits.Load(); n != 0 {
		t.Fatalf("the control plane contacted the provider %d times", n)
	}
	w := h.reg.Get(ids[0])
	if w.Model != "local-a" || w.Load != nil || w.Overloaded || w.Liveness != 0 {
		t.Fatalf("external worker record: model %q load %v overloaded %v liveness %v", w.Model, w.Load, w.Overloaded, w.Liveness)
	}
	r := h.do(t, http.MethodGet, "/workers/"+ids[0], "")
	got := string(r.body)
	for _, want := range []string{`"kind":"external"`, `"api_key_ref":"file:` + keyPath + `"`, `"OpenAI-Organization":"<redacted>"`, `"model":"gpt-x"`} {
		if !strings.Contains(got, want) {
			t.Errorf("GET /workers/%s lacks %s:\n%s", ids[0], want, got)
		}
	}
	if strings.Contains(got, "org-hidden") || strings.Contains(got, "sk-never-shown") {
		t.Fatalf("GET /workers shows a secret:\n%s", got)
	}
	if r := h.do(t, http.MethodGet, "/workers/"+engineID, ""); !strings.Contains(string(r.body), `"kind":"engine"`) {
		t.Fatalf("an engine's kind: %s", r.body)
	}
	if r := h.do(t, http.MethodPatch, "/workers/"+ids[0], `{"api_key":"sk-plain"}`); r.status != http.StatusBadRequest {
		t.Fatalf("PATCH api_key on an external worker = %d %s, want 400", r.status, r.body)
	}
}

// Bad provider specs are refused with 400 naming the field and, for a key
// file, the file; nothing is registered.
func TestExternalWorkerBadInput(t *testing.T) {
	h := startCP(t, fastOptions())
	looseOpts := fastOptions()
	looseOpts.ProviderAllowInsecureLoopback = true
	loose := startCP(t, looseOpts)
	good := providerKeyFile(t, "sk-good", 0o600)
	world := providerKeyFile(t, "sk-world-readable", 0o644)
	missing := filepath.Join(t.TempDir(), "no-such.key")
	spec := func(url, provider string) string {
		return fmt.Sprintf(`{"url":%q,"model_id":"m","provider":%s}`, url, provider)
	}
	ok := fmt.Sprintf(`{"api_key_ref":"file:%s"}`, good)
	cases := []struct {
		name   string
		h      *harness
		body   string
		param  string
		inText string
	}{
		{"plain http", h, spec("http://127.0.0.1:9", ok), "url", "https:// only"},
		{"plain http off loopback, allowed for loopback only", loose, spec("http://10.1.2.3:9", ok), "url", "loopback"},
		{"missing key file", h, spec("https://api.example.com/v1", fmt.Sprintf(`{"api_key_ref":"file:%s"}`, missing)), "provider.api_key_ref", missing + " does not exist"},
		{"world-readable key file", h, spec("https://api.example.com/v1", fmt.Sprintf(`{"api_key_ref":"file:%s"}`, world)), "provider.api_key_ref", world + " is readable by every user"},
		{"unset variable", h, spec("https://api.example.com/v1", `{"api_key_ref":"env:SMG_TEST_NO_SUCH_VARIABLE"}`), "provider.api_key_ref", "SMG_TEST_NO_SUCH_VARIABLE is not set"},
		{"a key instead of a reference", h, spec("https://api.example.com/v1", `{"api_key_ref":"sk-hunter2"}`), "provider.api_key_ref", "never accepted"},
		{"plain api_key", h, `{"url":"https://api.example.com/v1","model_id":"m","api_key":"hunter2","provider":{}}`, "api_key", "api_key_ref"},
		{"no model", h, `{"url":"https://api.example.com/v1","provider":{}}`, "model_id", "model_id"},
		{"overload block", h, `{"url":"https://api.example.com/v1","model_id":"m","overload":{"waiting_requests":3},"provider":{}}`, "overload", "never flagged"},
		{"decode role", h, `{"url":"https://api.example.com/v1","model_id":"m","worker_type":"decode","provider":{}}`, "worker_type", "regular"},
		{"authorization header", h, spec("https://api.example.com/v1", `{"headers":{"authorization":"Bearer hunter2"}}`), "provider.headers", "set by the router"},
		{"header with a newline", h, spec("https://api.example.com/v1", `{"headers":{"X-A":"a\r\nX-B: b"}}`), "provider.headers", "one line"},
		{"timeout 0", h, spec("https://api.example.com/v1", `{"timeout_secs":0}`), "provider.timeout_secs", "1-3600"},
		{"negative budget", h, spec("https://api.example.com/v1", `{"spill_requests_per_sec":-1}`), "provider.spill_requests_per_sec", ">= 0"},
		{"infinite budget", h, spec("https://api.example.com/v1", `{"spill_tokens_per_sec":"Infinity"}`), "provider.spill_tokens_per_sec", "finite"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.h.do(t, http.MethodPost, "/workers", tc.body)
			if r.status != http.StatusBadRequest {
				t.Fatalf("POST = %d %s, want 400", r.status, r.body)
			}
			msg, _ := r.errorField(t, "message").(string)
			if r.errorField(t, "param") != tc.param || !strings.Contains(msg, tc.inText) {
				t.Fatalf("param %v message %q, want %q naming %q", r.errorField(t, "param"), msg, tc.param, tc.inText)
			}
			if strings.Contains(string(r.body), "hunter2") || strings.Contains(string(r.body), "sk-world") {
				t.Fatalf("the answer echoes a secret: %s", r.body)
			}
		})
	}
	for _, hh := range []*harness{h, loose} {
		if n := len(hh.reg.Snapshot().Workers()) + len(hh.reg.Snapshot().Jobs()); n != 0 {
			t.Fatalf("refused specs left %d workers and jobs", n)
		}
	}
}
