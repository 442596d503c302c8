package router

import (
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/smg-project/smg/sim"
)

// startSimGRPC starts a simulator serving gRPC (of flavor) beside HTTP.
func startSimGRPC(t *testing.T, flavor string, mutate func(*sim.Options)) *sim.Server {
	return startSim(t, func(o *sim.Options) {
		o.GRPC, o.Flavor = true, flavor
		if mutate != nil {
			mutate(o)
		}
	})
}

var (
	idField      = regexp.MustCompile(`"id":"[^"]*"`)
	createdField = regexp.MustCompile(`"created":\d+`)
	promptUsage  = regexp.MustCompile(`"prompt_tokens":\d+,"completion_tokens":(\d+),"total_tokens":\d+`)
)

// normalize blanks what differs by run: ids and creation times, and (for a
// text prompt, which the simulator's HTTP surface counts at four characters
// a token while its gRPC engine counts the router's token ids) the prompt
// token counts.
func normalize(body string, promptCounts bool) string {
	body = idField.ReplaceAllString(body, `"id":"ID"`)
	body = createdField.ReplaceAllString(body, `"created":0`)
	if promptCounts {
		body = promptUsage.ReplaceAllString(body, `"prompt_tokens":P,"completion_tokens":$1,"total_tokens":T`)
	}
	return body
}

// TestGoldenTranscriptsHTTPAndGRPC: the same request through an HTTP
// simulated engine and a gRPC one (same seed) reaches the client as the
// same stream or JSON body, byte for byte but for ids and times: role
// chunk, content deltas, finish_reason, usage, [DONE]. A prompt of token
// ids is counted the same by both, so its usage is compared too.
func TestGoldenTranscriptsHTTPAndGRPC(t *testing.T) {
	cases := []struct {
		name, path, body string
		textPrompt       bool
	}{
		{"chat stream with usage", "/v1/chat/completions",
			`{"stream":true,"stream_options":{"include_usage":true},"max_tokens":12,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello there"}]}`, true},
		{"chat stream", "/v1/chat/completions", `{"stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, true},
		{"chat", "/v1/chat/completions", `{"max_tokens":7,"messages":[{"role":"user","content":"hi"}]}`, true},
		{"completion stream of ids", "/v1/completions",
			`{"stream":true,"stream_options":{"include_usage":true},"max_tokens":9,"prompt":[5,6,7,8,9,10,11]}`, false},
		{"completion of ids", "/v1/completions", `{"max_tokens":6,"prompt":[5,6,7,8]}`, false},
		{"completion stream of text", "/v1/completions", `{"stream":true,"max_tokens":4,"prompt":"the man said"}`, true},
	}
	for _, flavor := range []string{sim.FlavorVLLM, sim.FlavorSGLang} {
		for _, c := range cases {
			t.Run(flavor+"/"+c.name, func(t *testing.T) {
				body := `{"model":"` + testModel + `",` + c.body[1:]
				var got [2]answer
				for i, grpc := range []bool{false, true} {
					s := startSimGRPC(t, flavor, nil)
					h := newHarness(t, nil)
					url := s.URL()
					if grpc {
						url = s.GRPCURL()
					}
					h.apply(Worker{ID: "w", URL: url, Model: testModel, Healthy: true})
					got[i] = h.send(c.path, body, "")
					if got[i].status != http.StatusOK {
						t.Fatalf("grpc=%v: %d %s", grpc, got[i].status, got[i].body)
					}
				}
				httpBody, grpcBody := normalize(got[0].body, c.textPrompt), normalize(got[1].body, c.textPrompt)
				if httpBody != grpcBody {
					t.Fatalf("the answers differ\nHTTP: %s\ngRPC: %s", httpBody, grpcBody)
				}
				for _, h := range []string{"Content-Type", "Cache-Control"} {
					if got[0].header.Get(h) != got[1].header.Get(h) {
						t.Errorf("%s: HTTP %q, gRPC %q", h, got[0].header.Get(h), got[1].header.Get(h))
					}
				}
				if strings.Contains(body, `"stream":true`) && !strings.HasSuffix(grpcBody, "data: [DONE]\n\n") {
					t.Errorf("stream does not end with [DONE]: %s", grpcBody)
				}
			})
		}
	}
}
