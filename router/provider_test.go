package router

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/smg-project/smg/sim"
)

const (
	providerModel = "provider-model"
	providerKey   = "sk-test-provider-key-0123456789"
)

// startProvider is a fake provider: the simulator serving providerModel,
// with an API key check.
func startProvider(t *testing.T, mutate func(*sim.Options)) *sim.Server {
	return startSim(t, func(o *sim.Options) {
		o.Model, o.APIKey = providerModel, providerKey
		if mutate != nil {
			mutate(o)
		}
	})
}

// keyFile writes the provider key to a file readable by its owner only.
func keyFile(t *testing.T, key string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "provider-key")
	if err := os.WriteFile(p, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// external is an external worker of testModel at the fake provider.
func external(id string, s *sim.Server, keyRef string) Worker {
	return Worker{ID: id, URL: s.URL() + "/v1#" + testModel, Model: testModel, Healthy: true,
		Provider: &Provider{Model: providerModel, KeyRef: keyRef, Headers: [][2]string{{"X-Provider-Extra", "1"}}}}
}

// A request routed to an external worker reaches the provider with the
// provider's model name and the key from its reference (the sim refuses
// anything else), never with the client's credentials; the answer comes
// back under the local model name, streamed or not.
func TestExternalWorkerRewritesModelAndSendsKey(t *testing.T) {
	h := newHarness(t, nil)
	p := startProvider(t, nil)
	h.apply(external("ext", p, "file:"+keyFile(t, providerKey)))

	body := `{"model":"` + testModel + `","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer client-token")
	a := do(t, req)
	if a.status != http.StatusOK {
		t.Fatalf("non-streaming: %d %s", a.status, a.body)
	}
	var got struct{ Model string }
	if err := json.Unmarshal([]byte(a.body), &got); err != nil || got.Model != testModel {
		t.Fatalf("answer's model %q (%v), want %q: %s", got.Model, err, testModel, a.body)
	}
	if strings.Contains(a.body, providerModel) {
		t.Fatalf("the provider's model name reached the client: %s", a.body)
	}

	stream := `{"model":"` + testModel + `","stream":true,"max_tokens":6,"messages":[{"role":"user","content":"hi"}]}`
	resp, err := http.Post(h.srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(stream))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	events, done := 0, false
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "data: [DONE]":
			done = true
		case strings.HasPrefix(line, "data: "):
			events++
			var ev struct{ Model string }
			if err := json.Unmarshal([]byte(line[6:]), &ev); err != nil || ev.Model != testModel {
				t.Fatalf("event's model %q (%v): %s", ev.Model, err, line)
			}
		}
	}
	if resp.StatusCode != http.StatusOK || !done || events < 2 {
		t.Fatalf("stream: status %d, %d events, done=%v", resp.StatusCode, events, done)
	}
}

// The key from an environment reference works the same; a key the provider
// refuses becomes this router's 502 (the provider's 401 echoes the start of
// the key it got), and a reference that cannot be read is a 502 naming
// neither the key nor the file, counted, with the file named in the log
// only.
func TestExternalWorkerKeyErrors(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.DisableRetries = true })
	p := startProvider(t, nil)
	t.Setenv("SMG_TEST_PROVIDER_KEY", providerKey)
	h.apply(external("ext", p, "env:SMG_TEST_PROVIDER_KEY"))
	if a := h.post(testModel, "", "hi"); a.status != http.StatusOK {
		t.Fatalf("env key: %d %s", a.status, a.body)
	}

	h.apply(external("ext", p, "file:"+keyFile(t, "sk-wrong-key-abcdef")))
	a := h.post(testModel, "", "hi")
	if a.status != http.StatusBadGateway || strings.Contains(a.body, "sk-") || !strings.Contains(a.body, "refused this router's credentials") {
		t.Fatalf("refused key: %d %s", a.status, a.body)
	}

	missing := filepath.Join(t.TempDir(), "absent-key")
	h.apply(external("ext2", p, "file:"+missing))
	a = h.post(testModel, "", "hi")
	if a.status != http.StatusBadGateway || strings.Contains(a.body, missing) || !strings.Contains(a.body, "API key is not available") {
		t.Fatalf("unreadable key: %d %s", a.status, a.body)
	}
	if n := testutil.ToFloat64(h.r.providers.keyErrors.WithLabelValues(external("ext2", p, "").URL)); n != 1 {
		t.Fatalf("smg_router_provider_key_errors_total = %v, want 1", n)
	}
}

// A provider's 429 reaches the client with its Retry-After, is counted,
// and is not retried; the worker is held out of routing until then, so the
// next requests go to the engine beside it instead of into the provider's
// limit.
func TestProviderThrottleHoldsTheWorker(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.Policy = PolicyRoundRobin })
	p := startProvider(t, func(o *sim.Options) { o.Fault.Throttle = 7 })
	local := startSim(t, nil)
	ext := external("ext", p, "file:"+keyFile(t, providerKey))
	h.apply(ext)
	a := h.post(testModel, "", "hi")
	if a.status != http.StatusTooManyRequests || a.header.Get("Retry-After") != "7" {
		t.Fatalf("throttled: %d Retry-After %q %s", a.status, a.header.Get("Retry-After"), a.body)
	}
	if n := testutil.ToFloat64(h.r.metrics.retries); n != 0 {
		t.Fatalf("a provider's 429 was retried %v times", n)
	}
	h.apply(ext, Worker{ID: "local", URL: local.URL(), Model: testModel, Healthy: true})
	for range 4 {
		if a := h.post(testModel, "", "hi"); a.status != http.StatusOK {
			t.Fatalf("with the provider held: %d %s", a.status, a.body)
		}
	}
	if n := testutil.ToFloat64(h.r.providers.throttled.WithLabelValues(ext.URL)); n != 1 {
		t.Fatalf("smg_router_provider_throttled_total = %v, want 1 (the held provider got no more requests)", n)
	}
	st := h.r.states["ext"]
	if hold := time.Duration(st.breaker.heldUntil.Load() - h.r.now()); hold < 5*time.Second || hold > 7*time.Second {
		t.Fatalf("held for %v more, want about 7 s", hold)
	}
}

// A provider that answers nothing fails the attempt at its timeout (504),
// and its failures open the breaker: the next request is answered at once
// without reaching it. A provider that is down (connection refused) opens
// the breaker the same way.
func TestSilentOrDownProviderOpensTheBreaker(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.DisableRetries = true; o.CBFailureThreshold = 2 })
	p := startProvider(t, func(o *sim.Options) { o.Fault.Freeze = true })
	ext := external("ext", p, "file:"+keyFile(t, providerKey))
	ext.Provider.Timeout = 300 * time.Millisecond
	h.apply(ext)
	for i := range 2 {
		began := time.Now()
		a := h.post(testModel, "", "hi")
		if a.status != http.StatusGatewayTimeout || time.Since(began) > 5*time.Second {
			t.Fatalf("attempt %d on a silent provider: %d after %v: %s", i, a.status, time.Since(began), a.body)
		}
	}
	if a := h.post(testModel, "", "hi"); a.status != http.StatusServiceUnavailable || a.errorCode() != CodeNoAvailableWorkers {
		t.Fatalf("breaker open: %d %s", a.status, a.body)
	}

	down := startProvider(t, nil)
	ext2 := external("ext2", down, "file:"+keyFile(t, providerKey))
	_ = down.Close()
	h.apply(ext2)
	for range 2 {
		if a := h.post(testModel, "", "hi"); a.status != http.StatusBadGateway {
			t.Fatalf("provider down: %d %s", a.status, a.body)
		}
	}
	if a := h.post(testModel, "", "hi"); a.status != http.StatusServiceUnavailable {
		t.Fatalf("breaker open on the down provider: %d %s", a.status, a.body)
	}
}

func TestModelRewrites(t *testing.T) {
	cases := []struct{ in, want string }{
		{`{"model":"a","x":1}`, `{"model":"loc","x":1}`},
		{`{ "x" : {"model":"inner"} , "model" : "a" }`, `{ "x" : {"model":"inner"} , "model" : "loc" }`},
		{`{"x":1}`, `{"x":1}`},
		{`[1]`, `[1]`},
		{`{"mod\u0065l":"a"}`, `{"mod\u0065l":"a"}`}, // an escaped key: left as it is
		{`not json`, `not json`},
	}
	for _, c := range cases {
		if got := string(replaceModel([]byte(c.in), "loc")); got != c.want {
			t.Errorf("replaceModel(%s) = %s, want %s", c.in, got, c.want)
		}
	}
	for in, want := range map[string]string{
		`{"x":1}`:            `{"model":"p\"q","x":1}`,
		` {} `:               ` {"model":"p\"q"} `,
		`{"model":null}`:     `{"model":"p\"q"}`,
		`{"a":[],"model":1}`: `{"a":[],"model":"p\"q"}`,
	} {
		if got := string(withModel([]byte(in), `p"q`)); got != want {
			t.Errorf("withModel(%s) = %s, want %s", in, got, want)
		}
	}
	lines := map[string]string{
		"data: {\"model\":\"p\",\"c\":[1]}\n": "data: {\"model\":\"loc\",\"c\":[1]}\n",
		"data: [DONE]\n":                      "data: [DONE]\n",
		": keep-alive\n":                      ": keep-alive\n",
		"data:{\"model\":\"p\"}\r\n":          "data:{\"model\":\"loc\"}\r\n",
	}
	for in, want := range lines {
		if got := string(rewriteSSELine([]byte(in), "loc")); got != want {
			t.Errorf("rewriteSSELine(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestProviderRetryAfter(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for v, want := range map[string]time.Duration{
		"": time.Second, "0": time.Second, "junk": time.Second, "3": 3 * time.Second, "2.5": 2500 * time.Millisecond,
		"999999": maxProviderHold, now.Add(20 * time.Second).Format(http.TimeFormat): 20 * time.Second,
		now.Add(-time.Hour).Format(http.TimeFormat): time.Second,
	} {
		if got := providerRetryAfter(http.Header{"Retry-After": {v}}, now); got != want {
			t.Errorf("Retry-After %q: hold %v, want %v", v, got, want)
		}
	}
}
