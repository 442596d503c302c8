package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// e2eKeyFile writes key to a file readable by its owner only.
func e2eKeyFile(t *testing.T, key string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "provider.key")
	if err := os.WriteFile(p, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// registerProvider registers an external worker of localModel at provider
// (its OpenAI base URL) and waits for it to be Ready.
func registerProvider(t *testing.T, a admin, provider, localModel, providerModel, keyPath, extra string) {
	t.Helper()
	body := fmt.Sprintf(`{"url":%q,"model_id":%q,"provider":{"model":%q,"api_key_ref":"file:%s"%s}}`,
		provider+"/v1", localModel, providerModel, keyPath, extra)
	code, resp, err := a.do(http.MethodPost, "/workers", []byte(body))
	if err != nil || code != http.StatusAccepted {
		t.Fatalf("POST /workers = %d %s %v", code, resp, err)
	}
	a.waitReady(t, provider+"/v1#"+localModel)
}

// smg launch in front of a fake provider (the simulator with an API key):
// requests for the local model reach the provider under its model name
// with the key from the file, and come back under the local name, streamed
// or not. The key appears nowhere else: not in the logs (at debug), not in
// /metrics, not in GET /workers, not in error bodies, even when the
// provider refuses a key and echoes it. A provider that goes down opens the
// breaker: after --cb-failure-threshold failures requests are answered at
// once without reaching it.
func TestProviderKeyStaysWithTheProvider(t *testing.T) {
	const key, wrongKey = "sk-e2e-provider-secret-7f3a", "sk-e2e-wrong-key-91bc"
	sim := startSMG(t, "provider", "sim", "--port", "0", "--model", "gpt-provider", "--api-key", key, "--log-level", "debug")
	provider := sim.lines(1, 20*time.Second)[0]
	lp, base := launchProc(t, "launch", nil, "--provider-allow-insecure-loopback", "--log-level", "debug",
		"--cb-failure-threshold", "2", "--disable-retries")
	a := admin{base: base}
	registerProvider(t, a, provider, "local-model", "gpt-provider", e2eKeyFile(t, key), `,"headers":{"X-Extra":"1"}`)
	registerProvider(t, a, provider, "local-wrong", "gpt-provider", e2eKeyFile(t, wrongKey), "")
	a.waitRoutersApplied(t, 1)

	var bodies []string
	for _, stream := range []bool{false, true} {
		ans := chatModel(base, "local-model", 8, stream, 30*time.Second)
		if err := map[bool]func() error{false: ans.completeJSON, true: ans.completeStream}[stream](); err != nil {
			t.Fatalf("stream=%v: %v", stream, err)
		}
		if !strings.Contains(string(ans.body), `"model":"local-model"`) || strings.Contains(string(ans.body), "gpt-provider") {
			t.Fatalf("stream=%v: the answer's model is not the local name: %s", stream, ans.body)
		}
		bodies = append(bodies, string(ans.body))
	}
	wrong := chatModel(base, "local-wrong", 8, false, 30*time.Second)
	if wrong.status != http.StatusBadGateway {
		t.Fatalf("refused key: %d %s", wrong.status, wrong.body)
	}
	bodies = append(bodies, string(wrong.body))
	var e struct{ Error struct{ Message string } }
	if json.Unmarshal(wrong.body, &e) != nil || !strings.Contains(e.Error.Message, "refused this router's credentials") {
		t.Fatalf("refused key: %s", wrong.body)
	}

	_, workers, _ := a.do(http.MethodGet, "/workers", nil)
	_, metrics, _ := a.do(http.MethodGet, "/metrics", nil)
	if !strings.Contains(string(workers), `"kind":"external"`) {
		t.Fatalf("GET /workers does not show the external workers: %s", workers)
	}
	sim.kill() // the outage
	for i := range 2 {
		if ans := chatModel(base, "local-model", 8, false, 30*time.Second); ans.status != http.StatusBadGateway {
			t.Fatalf("provider down, attempt %d: %d %s", i, ans.status, ans.body)
		} else {
			bodies = append(bodies, string(ans.body))
		}
	}
	ans := chatModel(base, "local-model", 8, false, 30*time.Second)
	if ans.status != http.StatusServiceUnavailable {
		t.Fatalf("breaker open: %d %s", ans.status, ans.body)
	}
	bodies = append(bodies, string(ans.body))
	_, metricsAfter, _ := a.do(http.MethodGet, "/metrics", nil)
	if !strings.Contains(string(metricsAfter), `smg_router_circuit_breaker_transitions_total{to="open"} 1`) {
		t.Errorf("no breaker opening in /metrics:\n%s", grepLines(string(metricsAfter), "breaker"))
	}
	lp.kill()
	for where, text := range map[string]string{
		"the launch log": lp.stderr.String(), "/metrics": string(metrics) + string(metricsAfter),
		"GET /workers": string(workers), "answers": strings.Join(bodies, "\n"),
	} {
		for _, secret := range []string{key, wrongKey, key[:12], wrongKey[:12]} {
			if strings.Contains(text, secret) {
				t.Errorf("%s shows the key (%q)", where, secret)
			}
		}
	}
}

// grepLines are the lines of text containing s.
func grepLines(text, s string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
