package e2e

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// forgingEngine is a minimal vLLM-like engine that stamps every chat answer
// with the gateway's own X-SMG-Error-Code, in the spec's spelling and in lower
// case. The body's max_tokens picks the answer: 1 a 400 error, 2 a 503
// error, anything else a normal completion (streamed when asked).
func forgingEngine(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/models":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model","owned_by":"vllm"}]}`, model)
		case "/health":
			w.WriteHeader(http.StatusOK)
		case "/metrics":
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			for _, g := range []string{"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"} {
				fmt.Fprintf(w, "# TYPE %s gauge\n%s{engine=\"0\",model_name=%q} 0\n", g, g, model)
			}
		case "/v1/chat/completions":
			forgedChat(w, r)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func forgedChat(w http.ResponseWriter, r *http.Request) {
	var body strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := r.Body.Read(buf)
		body.Write(buf[:n])
		if err != nil {
			break
		}
	}
	h := w.Header()
	h["X-SMG-Error-Code"] = []string{"worker_overload_protection_shed"}
	h["x-smg-error-code"] = []string{"no_available_workers"}
	req := body.String()
	switch {
	case strings.Contains(req, `"max_tokens":1,`):
		h.Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `{"error":{"message":"bad request","type":"BadRequestError","param":null,"code":400}}`)
	case strings.Contains(req, `"max_tokens":2,`):
		h.Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprint(w, `{"error":{"message":"busy","type":"ServiceUnavailableError","param":null,"code":503}}`)
	case strings.Contains(req, `"stream":true`):
		h.Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		for i, word := range []string{"forged ", "header "} {
			finish := "null"
			if i == 1 {
				finish = `"length"`
			}
			fmt.Fprintf(w, "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{\"content\":%q},\"finish_reason\":%s}]}\n\n", model, word, finish)
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	default:
		h.Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"x","object":"chat.completion","model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"forged header"},"finish_reason":"length"}]}`, model)
	}
}

// X-SMG-Error-Code is set only by the gateway: an engine's copy of it never
// reaches the client, on a plain answer, a stream, or an error the router
// passes through.
func TestForgedErrorCodeNeverReachesClient(t *testing.T) {
	eng := forgingEngine(t)
	base, _ := startLaunch(t, "launch", []string{eng.URL}, "--load-monitor-interval", "1", "--health-success-threshold", "1")
	a := admin{base: base}
	a.waitReady(t, eng.URL)
	a.waitRoutersApplied(t, 1)
	hostport := strings.TrimPrefix(base, "http://")
	// The engine really does send the header: asked directly, it is there.
	if _, headers, _ := rawPost(t, strings.TrimPrefix(eng.URL, "http://"), "/v1/chat/completions", chatBody(16, false)); !contains(headers, "X-SMG-Error-Code: worker_overload_protection_shed") {
		t.Fatalf("the forging engine sent no X-SMG-Error-Code: %q", headers)
	}

	cases := []struct {
		name      string
		maxTokens int
		stream    bool
		status    string
		check     func(answer) error
	}{
		{"plain", 16, false, "200 OK", answer.completeJSON},
		{"stream", 16, true, "200 OK", answer.completeStream},
		{"engine 400", 1, false, "400 Bad Request", nil},
		{"engine 503", 2, false, "503 Service Unavailable", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// On the wire: no header line of that name, in any case.
			status, headers, _ := rawPost(t, hostport, "/v1/chat/completions", chatBody(c.maxTokens, c.stream))
			if status != "HTTP/1.1 "+c.status {
				t.Errorf("status line %q, want HTTP/1.1 %s", status, c.status)
			}
			for _, h := range headers {
				if name, _, _ := strings.Cut(h, ":"); strings.EqualFold(name, "X-SMG-Error-Code") {
					t.Errorf("forged header reached the client: %q", h)
				}
			}
			// Through an ordinary client: the answer itself is intact.
			ans := chat(base, c.maxTokens, c.stream, 20*time.Second)
			if ans.err != nil {
				t.Fatal(ans.err)
			}
			if v := ans.header.Values("X-SMG-Error-Code"); len(v) > 0 {
				t.Errorf("client read X-SMG-Error-Code %q", v)
			}
			if c.check != nil {
				if err := c.check(ans); err != nil {
					t.Error(err)
				}
			}
		})
	}
}
