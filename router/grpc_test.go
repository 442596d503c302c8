package router

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"bufio"
	"context"
	sglangpb "github.com/smg-project/smg/gen/sglang/grpc/scheduler"
	commonpb "github.com/smg-project/smg/gen/smg/grpc/common"
	"github.com/smg-project/smg/internal/enginegrpc"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

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
	wordDelta    = regexp.MustCompile(`"delta":\{"content":"[a-z]+ "\}`)
)

// normalize blanks what differs by run: ids and creation times.
func normalize(body string) string {
	body = idField.ReplaceAllString(body, `"id":"ID"`)
	return createdField.ReplaceAllString(body, `"created":0`)
}

// TestGoldenTranscriptsHTTPAndGRPC: the same request through an HTTP
// simulated engine and a gRPC one (same seed) reaches the client as the
// same stream or JSON body, byte for byte but for ids and times: role
// chunk, content deltas, finish_reason, usage, [DONE]. A prompt of token
// ids, a text and a chat are counted the same by both (the model's
// tokenizer, the chat rendered with its template), so usage is compared too.
func TestGoldenTranscriptsHTTPAndGRPC(t *testing.T) {
	cases := []struct {
		name, path, body string
	}{
		{"chat stream with usage", "/v1/chat/completions",
			`{"stream":true,"stream_options":{"include_usage":true},"max_tokens":12,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello there"}]}`},
		{"chat stream", "/v1/chat/completions", `{"stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`},
		{"chat", "/v1/chat/completions", `{"max_tokens":7,"messages":[{"role":"user","content":"hi"}]}`},
		{"completion stream of ids", "/v1/completions",
			`{"stream":true,"stream_options":{"include_usage":true},"max_tokens":9,"prompt":[5,6,7,8,9,10,11]}`},
		{"completion of ids", "/v1/completions", `{"max_tokens":6,"prompt":[5,6,7,8]}`},
		{"completion stream of text", "/v1/completions", `{"stream":true,"max_tokens":4,"prompt":"the man said"}`},
		{"completion of text", "/v1/completions", `{"max_tokens":5,"prompt":"Write a haiku about the sea, please."}`},
		{"chat stream with logprobs", "/v1/chat/completions",
			`{"stream":true,"logprobs":true,"top_logprobs":3,"max_tokens":6,"messages":[{"role":"user","content":"hi"}]}`},
		{"chat with logprobs", "/v1/chat/completions", `{"logprobs":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`},
		{"chat with top logprobs", "/v1/chat/completions",
			`{"logprobs":true,"top_logprobs":20,"max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`},
		{"completion stream with logprobs", "/v1/completions", `{"stream":true,"logprobs":2,"max_tokens":7,"prompt":[5,6,7]}`},
		{"completion with logprobs", "/v1/completions", `{"logprobs":0,"max_tokens":6,"prompt":[5,6,7,8]}`},
		{"completion with logprobs 5", "/v1/completions", `{"logprobs":5,"max_tokens":4,"prompt":[5,6,7,8]}`},
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
				httpBody, grpcBody := normalize(got[0].body), normalize(got[1].body)
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
				asked := strings.Contains(body, `"logprobs"`)
				answered := strings.Contains(grpcBody, `"token_logprobs":[`) || strings.Contains(grpcBody, `"content":[{"token":`)
				if asked != answered {
					t.Errorf("logprobs asked %v, answered %v: %s", asked, answered, grpcBody)
				}
			})
		}
	}
}

// pollFor polls cond (an effect that lands asynchronously, on another
// goroutine or process) for up to 5 s.
func pollFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestClientDisconnectAbortsGeneration: a client that leaves mid-stream
// gets its generation aborted on the engine (the simulator counts the Abort
// call), and the pile it formed while streaming is released. While it
// streams, the pile counts it and each token batch is progress.
func TestClientDisconnectAbortsGeneration(t *testing.T) {
	for _, flavor := range []string{sim.FlavorVLLM, sim.FlavorSGLang} {
		t.Run(flavor, func(t *testing.T) {
			s := startSimGRPC(t, flavor, func(o *sim.Options) { o.ITL = 20 * time.Millisecond; o.EOSProbability = 0 })
			h := newHarness(t, nil)
			h.apply(Worker{ID: "g", URL: s.GRPCURL(), Model: testModel, Healthy: true})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/v1/chat/completions", strings.NewReader(
				`{"model":"`+testModel+`","stream":true,"max_tokens":2000,"messages":[{"role":"user","content":"go on"}]}`))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			sc := bufio.NewScanner(resp.Body)
			for events := 0; events < 3 && sc.Scan(); {
				if strings.HasPrefix(sc.Text(), "data: ") {
					events++
				}
			}
			obs := observation(h.r, "g")
			if obs.StreamsInFlight != 1 || obs.LastProgress.IsZero() || obs.PromptTokensInFlight != 0 {
				t.Fatalf("while streaming: %+v, want a pile of 1, progress, no prompt in hand", obs)
			}
			cancel()
			resp.Body.Close()
			pollFor(t, "the engine to count the Abort", func() bool { return s.GRPCAborts() == 1 })
			pollFor(t, "the pile to empty", func() bool { return observation(h.r, "g").StreamsInFlight == 0 })
		})
	}
}

// TestGRPCRequestRefusedBeforeDispatch: a prompt over the model's context, a
// template that cannot render a message, token ids outside the vocabulary
// and logprobs asked for out of range are refused with 400 invalid_request
// naming the field before the engine sees anything; other routes are 501.
func TestGRPCRequestRefusedBeforeDispatch(t *testing.T) {
	s := startSimGRPC(t, sim.FlavorVLLM, func(o *sim.Options) { o.KVCapacityTokens = 256 })
	h := newHarness(t, nil)
	h.apply(Worker{ID: "g", URL: s.GRPCURL(), Model: testModel, Healthy: true})
	long := strings.Repeat("the man ", 200)
	for _, c := range []struct{ path, body, want string }{
		{"/v1/completions", `{"prompt":"` + long + `"}`, "maximum context length is 256 tokens"},
		{"/v1/completions", `{"prompt":"the man","max_tokens":300}`, "(2 in the prompt, 300 in the completion)"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"},{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`,
			`messages[1]: content[0]: part of type \"image_url\" is not supported`},
		{"/v1/chat/completions", `{"messages":[{"content":"hi"}]}`, "messages[0]: role is missing"},
		{"/v1/completions", `{"prompt":[1,2,99999999]}`, "prompt[2]: token id 99999999 is outside the vocabulary"},
		{"/v1/chat/completions", `{"logprobs":true,"top_logprobs":21,"messages":[{"role":"user","content":"hi"}]}`,
			"top_logprobs must be between 0 and 20"},
		{"/v1/chat/completions", `{"logprobs":true,"top_logprobs":-1,"messages":[{"role":"user","content":"hi"}]}`,
			"top_logprobs must be between 0 and 20"},
		{"/v1/chat/completions", `{"logprobs":true,"top_logprobs":"3","messages":[{"role":"user","content":"hi"}]}`, "top_logprobs"},
		{"/v1/chat/completions", `{"top_logprobs":2,"messages":[{"role":"user","content":"hi"}]}`, "top_logprobs needs logprobs set to true"},
		{"/v1/chat/completions", `{"logprobs":1,"messages":[{"role":"user","content":"hi"}]}`, "logprobs must be a boolean"},
		{"/v1/completions", `{"prompt":"hi","logprobs":21}`, "logprobs must be an integer between 0 and 20"},
		{"/v1/completions", `{"prompt":"hi","logprobs":true}`, "logprobs must be an integer between 0 and 20"},
	} {
		a := h.send(c.path, `{"model":"`+testModel+`",`+c.body[1:], "")
		if a.status != http.StatusBadRequest || a.errorCode() != CodeInvalidRequest || !strings.Contains(a.body, c.want) {
			t.Errorf("%s %s: %d %s, want 400 invalid_request with %q", c.path, c.body[:min(len(c.body), 60)], a.status, a.body, c.want)
		}
	}
	if a := h.send("/v1/embeddings", `{"model":"`+testModel+`","input":"`+long+`"}`, ""); a.status != http.StatusBadRequest ||
		!strings.Contains(a.body, "maximum context length is 256 tokens") {
		t.Errorf("embeddings over the context: %d %s", a.status, a.body)
	}
	if n := s.GRPCRequests(); n != 0 {
		t.Errorf("the engine took %d requests, want none", n)
	}
}

// fakeEngine is an SGLang servicer whose Generate and tokenizer a test
// writes: what a broken or hostile engine sends.
type fakeEngine struct {
	sglangpb.UnimplementedSglangSchedulerServer
	archive  []byte
	generate func(*sglangpb.GenerateRequest, grpc.ServerStreamingServer[sglangpb.GenerateResponse]) error
	url      string
}

func (f *fakeEngine) HealthCheck(context.Context, *sglangpb.HealthCheckRequest) (*sglangpb.HealthCheckResponse, error) {
	return &sglangpb.HealthCheckResponse{Healthy: true}, nil
}

func (f *fakeEngine) GetModelInfo(context.Context, *sglangpb.GetModelInfoRequest) (*sglangpb.GetModelInfoResponse, error) {
	return &sglangpb.GetModelInfoResponse{ServedModelName: testModel, MaxContextLength: 4096}, nil
}

func (f *fakeEngine) GetServerInfo(context.Context, *sglangpb.GetServerInfoRequest) (*sglangpb.GetServerInfoResponse, error) {
	args, _ := structpb.NewStruct(map[string]any{"max_running_requests": 8})
	return &sglangpb.GetServerInfoResponse{ServerArgs: args}, nil
}

func (f *fakeEngine) GetTokenizer(_ *commonpb.GetTokenizerRequest, st grpc.ServerStreamingServer[commonpb.GetTokenizerChunk]) error {
	sum := sha256.Sum256(f.archive)
	return st.Send(&commonpb.GetTokenizerChunk{Data: f.archive, Sha256: hex.EncodeToString(sum[:])})
}

func (f *fakeEngine) Generate(req *sglangpb.GenerateRequest, st grpc.ServerStreamingServer[sglangpb.GenerateResponse]) error {
	return f.generate(req, st)
}

func (f *fakeEngine) Abort(context.Context, *sglangpb.AbortRequest) (*sglangpb.AbortResponse, error) {
	return &sglangpb.AbortResponse{Success: true}, nil
}

// simArchive is the simulator's tokenizer archive, read as a router reads it.
func simArchive(t *testing.T) []byte {
	s := startSimGRPC(t, sim.FlavorSGLang, nil)
	c, err := enginegrpc.New(s.GRPCURL(), enginegrpc.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	data, err := c.Tokenizer(ctx, enginegrpc.MaxTokenizerBytes)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func startFake(t *testing.T, f *fakeEngine) *fakeEngine {
	f.url = startFakeServer(t, f)
	return f
}

// startFakeServer serves srv on loopback and returns its grpc:// URL (also
// set in srv's fakeEngine).
func startFakeServer(t *testing.T, srv interface {
	sglangpb.SglangSchedulerServer
	fake() *fakeEngine
}) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	sglangpb.RegisterSglangSchedulerServer(gs, srv)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	srv.fake().url = "grpc://" + ln.Addr().String()
	return srv.fake().url
}

func (f *fakeEngine) fake() *fakeEngine { return f }

func chunk(ids ...uint32) *sglangpb.GenerateResponse {
	return &sglangpb.GenerateResponse{Response: &sglangpb.GenerateResponse_Chunk{Chunk: &sglangpb.GenerateStreamChunk{TokenIds: ids, PromptTokens: 3, CompletionTokens: uint32(len(ids))}}}
}

// TestBrokenEngineStreams: a token id outside the vocabulary, or a stream
// that ends without its completion, reaches the client as an explicit SSE
// error event naming the worker, never a hang or a clean end; the pile and
// the window room are released. Before the first token, the same failure
// is retried on another worker.
func TestBrokenEngineStreams(t *testing.T) {
	archive := simArchive(t)
	for name, c := range map[string]struct {
		gen  func(*sglangpb.GenerateRequest, grpc.ServerStreamingServer[sglangpb.GenerateResponse]) error
		want string
	}{
		"unknown token id": {func(_ *sglangpb.GenerateRequest, st grpc.ServerStreamingServer[sglangpb.GenerateResponse]) error {
			_ = st.Send(chunk(10, 11))
			return st.Send(chunk(4000000))
		}, "unknown token id 4000000"},
		"no completion": {func(_ *sglangpb.GenerateRequest, st grpc.ServerStreamingServer[sglangpb.GenerateResponse]) error {
			return st.Send(chunk(10, 11))
		}, "without a completion"},
	} {
		t.Run(name, func(t *testing.T) {
			f := startFake(t, &fakeEngine{archive: archive, generate: c.gen})
			h := newHarness(t, func(o *Options) { o.WorkerAdmissionWindow = true })
			h.apply(Worker{ID: "f", URL: f.url, Model: testModel, Healthy: true, AdmissionRooms: 4})
			a := sendCut(t, h, "/v1/chat/completions", `{"model":"`+testModel+`","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
			if !strings.Contains(a.body, `"code":"upstream_error"`) || !strings.Contains(a.body, c.want) ||
				!strings.Contains(a.body, f.url) || strings.Contains(a.body, "[DONE]") {
				t.Fatalf("got %d %s, want an upstream_error event naming %s and %q, no [DONE]", a.status, a.body, f.url, c.want)
			}
			if !strings.Contains(a.body, `"content":"it "`) {
				t.Errorf("the tokens before the failure did not reach the client: %s", a.body)
			}
			v := h.r.view.Load()
			st := v.states[v.index("f")]
			pollFor(t, "the room and the pile to be released", func() bool {
				return st.gate.InFlight() == 0 && st.streams.Load() == 0 && st.promptTokens.Load() == 0
			})
		})
	}
}

// TestTokenizerThatCannotLoad: a worker whose tokenizer archive does not
// load is left out of selection (its request retried on a good worker);
// alone and without retries, the client is told why.
func TestTokenizerThatCannotLoad(t *testing.T) {
	var zb bytes.Buffer
	zw := zip.NewWriter(&zb)
	fw, _ := zw.Create("tokenizer.json")
	_, _ = fw.Write([]byte(`{"model":{"type":"Unigram","vocab":{"a":0}}}`))
	_ = zw.Close()
	bad := startFake(t, &fakeEngine{archive: zb.Bytes(), generate: func(*sglangpb.GenerateRequest, grpc.ServerStreamingServer[sglangpb.GenerateResponse]) error {
		t.Error("Generate reached a worker whose tokenizer cannot load")
		return nil
	}})
	good := startSimGRPC(t, sim.FlavorSGLang, nil)
	h := newHarness(t, func(o *Options) { o.Policy = PolicyRoundRobin })
	h.apply(Worker{ID: "bad", URL: bad.url, Model: testModel, Healthy: true}, Worker{ID: "good", URL: good.GRPCURL(), Model: testModel, Healthy: true})
	for range 4 {
		if a := h.send("/v1/completions", `{"model":"`+testModel+`","prompt":"the","max_tokens":2}`, ""); a.status != http.StatusOK {
			t.Fatalf("%d %s", a.status, a.body)
		}
	}
	if n := good.GRPCRequests(); n != 4 {
		t.Errorf("the good worker served %d of 4", n)
	}

	h = newHarness(t, func(o *Options) { o.DisableRetries = true })
	h.apply(Worker{ID: "bad", URL: bad.url, Model: testModel, Healthy: true})
	a := h.send("/v1/completions", `{"model":"`+testModel+`","prompt":"the"}`, "")
	if a.status != http.StatusServiceUnavailable || a.errorCode() != CodeWorkerNotServable ||
		!strings.Contains(a.body, bad.url) || !strings.Contains(a.body, `model type \"Unigram\" is not supported`) {
		t.Fatalf("got %d %s", a.status, a.body)
	}
	if a := h.send("/v1/completions", `{"model":"`+testModel+`","prompt":"the"}`, ""); a.status != http.StatusServiceUnavailable || a.errorCode() != CodeNoAvailableWorkers {
		t.Fatalf("the worker is still routed to: %d %s", a.status, a.body)
	}
}

// sendCut posts body and reads the answer up to its end or its cut.
func sendCut(t *testing.T, h *harness, path, body string) answer {
	t.Helper()
	resp, err := http.Post(h.srv.URL+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// TestOpenAINodeClientThroughGRPC: the official OpenAI Node client streams a
// chat completion through the router from a gRPC worker: role, text,
// finish_reason and usage as it reads them. It needs node and the openai
// npm package: set OPENAI_NODE_MODULES to a node_modules folder holding it
// (npm install openai).
func TestOpenAINodeClientThroughGRPC(t *testing.T) {
	modules := os.Getenv("OPENAI_NODE_MODULES")
	node, err := exec.LookPath("node")
	if modules == "" || err != nil {
		t.Skip("needs node and OPENAI_NODE_MODULES (a node_modules folder with the openai package)")
	}
	s := startSimGRPC(t, sim.FlavorVLLM, func(o *sim.Options) { o.EOSProbability = 0 })
	h := newHarness(t, nil)
	h.apply(Worker{ID: "g", URL: s.GRPCURL(), Model: testModel, Healthy: true})
	// The script is run from a folder beside the modules, so that its import
	// of "openai" finds them.
	dir := t.TempDir()
	script, err := os.ReadFile("testdata/openai_stream.mjs")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "openai_stream.mjs"), script, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(modules, filepath.Join(dir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(node, filepath.Join(dir, "openai_stream.mjs"), h.srv.URL, testModel).CombinedOutput()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, out)
	}
	var got struct {
		Role, Text, Finish string
		Usage              struct {
			Prompt     int `json:"prompt_tokens"`
			Completion int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got.Role != "assistant" || len(strings.Fields(got.Text)) != 6 || got.Finish != "length" {
		t.Fatalf("the client read %s", out)
	}
	if got.Usage.Completion != 6 || got.Usage.Prompt == 0 {
		t.Fatalf("usage as the client read it: %s", out)
	}
}

// TestPDOverGRPC: a prefill/decode pair of gRPC simulators serves chat
// completions, streamed and not: both legs get the prefill engine's
// bootstrap host, port and room (the decode engine fetches the KV from the
// prefill engine's bootstrap endpoint), and the client gets the decode
// leg's tokens. The pair forms no pile.
func TestPDOverGRPC(t *testing.T) {
	for _, flavor := range []string{sim.FlavorSGLang, sim.FlavorVLLM} {
		t.Run(flavor, func(t *testing.T) {
			prefill := startSimGRPC(t, flavor, func(o *sim.Options) { o.Role = sim.RolePrefill })
			decode := startSimGRPC(t, flavor, func(o *sim.Options) { o.Role = sim.RoleDecode; o.EOSProbability = 0 })
			port, err := strconv.Atoi(prefill.Addr()[strings.LastIndexByte(prefill.Addr(), ':')+1:])
			if err != nil {
				t.Fatal(err)
			}
			h := newHarness(t, func(o *Options) { o.PDDisaggregation = true })
			h.apply(Worker{ID: "p", URL: prefill.GRPCURL(), Model: testModel, Type: TypePrefill, Healthy: true, BootstrapPort: int32(port)},
				Worker{ID: "d", URL: decode.GRPCURL(), Model: testModel, Type: TypeDecode, Healthy: true, MaxRunning: 8, WindowShare: 8})
			for _, stream := range []bool{false, true} {
				a := h.send("/v1/chat/completions", fmt.Sprintf(`{"model":%q,"stream":%v,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, testModel, stream), "")
				words := len(wordDelta.FindAllString(a.body, -1))
				if !stream {
					var b struct {
						Choices []struct{ Message struct{ Content string } }
					}
					_ = json.Unmarshal([]byte(a.body), &b)
					if len(b.Choices) == 1 {
						words = len(strings.Fields(b.Choices[0].Message.Content))
					}
				}
				if a.status != http.StatusOK || !strings.Contains(a.body, `"finish_reason":"length"`) || words != 5 {
					t.Fatalf("stream %v: %d %s", stream, a.status, a.body)
				}
				if stream && !strings.HasSuffix(a.body, "data: [DONE]\n\n") {
					t.Fatalf("stream without [DONE]: %s", a.body)
				}
			}
			if prefill.GRPCRequests() != 2 || decode.GRPCRequests() != 2 {
				t.Errorf("prefill took %d, decode %d requests, want 2 each", prefill.GRPCRequests(), decode.GRPCRequests())
			}
			if obs := observation(h.r, "d"); obs.StreamsInFlight != 0 || obs.LastProgress.IsZero() {
				t.Errorf("decode leg's observation: %+v", obs)
			}
			// A batch of two prompts with n=2, streamed and not: four
			// generations, each its own engine request with its own room on
			// both legs (the simulator refuses a room already in use), every
			// choice answered to its finish.
			for _, stream := range []bool{false, true} {
				before, beforeD := prefill.GRPCRequests(), decode.GRPCRequests()
				a := h.send("/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":["a b","c"],"n":2,"max_tokens":3,"stream":%v}`, testModel, stream), "")
				if a.status != http.StatusOK {
					t.Fatalf("a batch with n=2 over a gRPC pair (stream %v): %d %s", stream, a.status, a.body)
				}
				for i := range 4 {
					if !strings.Contains(a.body, fmt.Sprintf(`"index":%d,`, i)) {
						t.Errorf("stream %v: choice %d missing: %s", stream, i, a.body)
					}
				}
				if got := strings.Count(a.body, `"finish_reason":"length"`); got != 4 {
					t.Errorf("stream %v: %d choices finished, want 4: %s", stream, got, a.body)
				}
				if p, d := prefill.GRPCRequests()-before, decode.GRPCRequests()-beforeD; p != 4 || d != 4 {
					t.Errorf("stream %v: prefill took %d, decode %d requests, want 4 each", stream, p, d)
				}
			}
		})
	}
}

// simBootstrapPort is a prefill simulator's bootstrap port: its HTTP port.
func simBootstrapPort(t *testing.T, s *sim.Server) int32 {
	t.Helper()
	port, err := strconv.Atoi(s.Addr()[strings.LastIndexByte(s.Addr(), ':')+1:])
	if err != nil {
		t.Fatal(err)
	}
	return int32(port)
}

// TestPDPairsSpeakOneProtocol: a model whose PD workers speak HTTP and gRPC
// forms its pairs within one protocol (the legs must agree on the prompt's
// token ids), so every request is served and each gRPC prefill leg meets a
// gRPC decode leg; a model whose prefill workers speak only HTTP and decode
// workers only gRPC forms no pair, and its requests get an explicit 503
// naming the protocols instead of a pair that cannot work.
func TestPDPairsSpeakOneProtocol(t *testing.T) {
	prefillHTTP := startSim(t, func(o *sim.Options) { o.Role = sim.RolePrefill })
	prefillGRPC := startSimGRPC(t, sim.FlavorSGLang, func(o *sim.Options) { o.Role = sim.RolePrefill })
	decodeHTTP := startSim(t, func(o *sim.Options) { o.Role = sim.RoleDecode })
	decodeGRPC := startSimGRPC(t, sim.FlavorSGLang, func(o *sim.Options) { o.Role = sim.RoleDecode })
	h := newHarness(t, func(o *Options) { o.PDDisaggregation = true; o.Policy = "round_robin" })
	h.apply(
		Worker{ID: "ph", URL: prefillHTTP.URL(), Model: testModel, Type: TypePrefill, Healthy: true, BootstrapPort: simBootstrapPort(t, prefillHTTP)},
		Worker{ID: "pg", URL: prefillGRPC.GRPCURL(), Model: testModel, Type: TypePrefill, Healthy: true, BootstrapPort: simBootstrapPort(t, prefillGRPC)},
		Worker{ID: "dh", URL: decodeHTTP.URL(), Model: testModel, Type: TypeDecode, Healthy: true},
		Worker{ID: "dg", URL: decodeGRPC.GRPCURL(), Model: testModel, Type: TypeDecode, Healthy: true},
		Worker{ID: "ph2", URL: prefillHTTP.URL() + "/", Model: "other", Type: TypePrefill, Healthy: true, BootstrapPort: simBootstrapPort(t, prefillHTTP)},
		Worker{ID: "dg2", URL: decodeGRPC.GRPCURL() + "/", Model: "other", Type: TypeDecode, Healthy: true},
	)
	const total = 8
	for i := range total {
		a := h.send("/v1/chat/completions", fmt.Sprintf(`{"model":%q,"max_tokens":3,"messages":[{"role":"user","content":"hi %d"}]}`, testModel, i), "")
		if a.status != http.StatusOK {
			t.Fatalf("request %d over a mixed fleet: %d %s", i, a.status, a.body)
		}
	}
	p, d := prefillGRPC.GRPCRequests(), decodeGRPC.GRPCRequests()
	if p != d || p == 0 || p == total {
		t.Errorf("gRPC prefill legs %d, gRPC decode legs %d of %d requests: want equal, and both protocols used", p, d, total)
	}

	a := h.send("/v1/chat/completions", `{"model":"other","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`, "")
	if a.status != http.StatusServiceUnavailable || a.errorCode() != CodeNoAvailableWorkers ||
		!strings.Contains(a.body, "prefill workers speak HTTP and its decode workers gRPC") {
		t.Errorf("a model with HTTP prefill and gRPC decode workers: %d %s", a.status, a.body)
	}
	if got := h.r.view.Load().unpaired(); got != "other (prefill HTTP, decode gRPC)" {
		t.Errorf("unpaired models: %q", got)
	}
}
