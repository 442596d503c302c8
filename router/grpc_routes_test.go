package router

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sglangpb "github.com/smg-project/smg/gen/sglang/grpc/scheduler"
	"github.com/smg-project/smg/sim"
)

// nativeItem is one generation of a /generate answer.
type nativeItem struct {
	Text      string   `json:"text"`
	OutputIDs []uint32 `json:"output_ids"`
	MetaInfo  struct {
		ID               string          `json:"id"`
		FinishReason     json.RawMessage `json:"finish_reason"`
		PromptTokens     int             `json:"prompt_tokens"`
		CompletionTokens int             `json:"completion_tokens"`
	} `json:"meta_info"`
	Index int `json:"index"`
}

// TestGenerateOverGRPC: SGLang's native /generate served by a gRPC worker
// (both flavors): input_ids or text, sampling_params, n, batches, streamed
// and not. The text is the one /v1/completions gives for the same ids on a
// fresh engine of the same seed; the finish reason is SGLang's object.
func TestGenerateOverGRPC(t *testing.T) {
	for _, flavor := range []string{sim.FlavorSGLang, sim.FlavorVLLM} {
		t.Run(flavor, func(t *testing.T) {
			serve := func(path, body string) answer {
				s := startSimGRPC(t, flavor, func(o *sim.Options) { o.EOSProbability = 0 })
				h := newHarness(t, nil)
				h.apply(Worker{ID: "w", URL: s.GRPCURL(), Model: testModel, Healthy: true})
				a := h.send(path, body, "")
				if a.status != http.StatusOK {
					t.Fatalf("%s %s: %d %s", path, body, a.status, a.body)
				}
				return a
			}
			// One prompt of ids, not streamed: one object.
			a := serve("/generate", `{"input_ids":[5,6,7,8],"sampling_params":{"max_new_tokens":6}}`)
			var one nativeItem
			if err := json.Unmarshal([]byte(a.body), &one); err != nil {
				t.Fatalf("not one object: %v %s", err, a.body)
			}
			if len(one.OutputIDs) != 6 || one.MetaInfo.CompletionTokens != 6 || one.MetaInfo.PromptTokens != 4 ||
				string(one.MetaInfo.FinishReason) != `{"type":"length","length":6}` || one.MetaInfo.ID == "" {
				t.Errorf("/generate answer: %s", a.body)
			}
			c := serve("/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":[5,6,7,8],"max_tokens":6}`, testModel))
			var cmpl struct{ Choices []struct{ Text string } }
			if err := json.Unmarshal([]byte(c.body), &cmpl); err != nil || len(cmpl.Choices) != 1 || cmpl.Choices[0].Text != one.Text {
				t.Errorf("/generate text %q, /v1/completions %s", one.Text, c.body)
			}

			// A batch of two texts with n=2: a list of four.
			a = serve("/generate", `{"text":["hello there","the man"],"sampling_params":{"max_new_tokens":3,"n":2}}`)
			var list []nativeItem
			if err := json.Unmarshal([]byte(a.body), &list); err != nil || len(list) != 4 {
				t.Fatalf("batch with n=2: %v %s", err, a.body)
			}
			for _, it := range list {
				if len(strings.Fields(it.Text)) != 3 || len(it.OutputIDs) != 3 {
					t.Errorf("batch item: %+v", it)
				}
			}

			// Streamed: one event per token batch with the text so far and
			// the new ids, the last with the finish reason, then [DONE].
			a = serve("/generate", `{"text":"the man said","stream":true,"sampling_params":{"max_new_tokens":5}}`)
			if a.header.Get("Content-Type") != "text/event-stream" || !strings.HasSuffix(a.body, "data: [DONE]\n\n") {
				t.Fatalf("stream: %q %s", a.header.Get("Content-Type"), a.body)
			}
			var ids []uint32
			var last nativeItem
			prev := ""
			for _, line := range strings.Split(a.body, "\n") {
				data, ok := strings.CutPrefix(line, "data: ")
				if !ok || data == "[DONE]" {
					continue
				}
				var it nativeItem
				if err := json.Unmarshal([]byte(data), &it); err != nil {
					t.Fatalf("event %q: %v", data, err)
				}
				if !strings.HasPrefix(it.Text, prev) {
					t.Errorf("text went back: %q after %q", it.Text, prev)
				}
				prev = it.Text
				ids = append(ids, it.OutputIDs...)
				last = it
			}
			if len(ids) != 5 || len(strings.Fields(last.Text)) != 5 || string(last.MetaInfo.FinishReason) != `{"type":"length","length":5}` {
				t.Errorf("stream: ids %v, last %+v\n%s", ids, last, a.body)
			}
		})
	}
}

// TestGenerateStopString: a stop string ends the choice, is cut from the
// text and named as SGLang names it.
func TestGenerateStopString(t *testing.T) {
	s := startSimGRPC(t, sim.FlavorSGLang, func(o *sim.Options) { o.EOSProbability = 0 })
	h := newHarness(t, nil)
	h.apply(Worker{ID: "w", URL: s.GRPCURL(), Model: testModel, Healthy: true})
	a := h.send("/generate", `{"input_ids":[5,6],"sampling_params":{"max_new_tokens":40}}`, "")
	var full nativeItem
	if err := json.Unmarshal([]byte(a.body), &full); err != nil {
		t.Fatal(err, a.body)
	}
	words := strings.Fields(full.Text)
	stop := words[len(words)/2]
	s2 := startSimGRPC(t, sim.FlavorSGLang, func(o *sim.Options) { o.EOSProbability = 0 })
	h.apply(Worker{ID: "w2", URL: s2.GRPCURL(), Model: testModel, Healthy: true})
	a = h.send("/generate", fmt.Sprintf(`{"input_ids":[5,6],"sampling_params":{"max_new_tokens":40,"stop":" %s "}}`, stop), "")
	var cut nativeItem
	if err := json.Unmarshal([]byte(a.body), &cut); err != nil {
		t.Fatal(err, a.body)
	}
	if !strings.HasPrefix(full.Text, cut.Text) || strings.Contains(cut.Text+" ", " "+stop+" ") ||
		string(cut.MetaInfo.FinishReason) != fmt.Sprintf(`{"type":"stop","matched":" %s "}`, stop) {
		t.Errorf("stop %q: %s (uncut %q)", stop, a.body, full.Text)
	}
}

// TestEmbeddingsOverGRPC: /v1/embeddings served by a gRPC worker's Embed
// (both flavors): one embedding per input, the engine's vector as float or
// base64, usage from the engine's prompt counts.
func TestEmbeddingsOverGRPC(t *testing.T) {
	for _, flavor := range []string{sim.FlavorSGLang, sim.FlavorVLLM} {
		t.Run(flavor, func(t *testing.T) {
			s := startSimGRPC(t, flavor, nil)
			h := newHarness(t, nil)
			h.apply(Worker{ID: "w", URL: s.GRPCURL(), Model: testModel, Healthy: true})
			want := [][]float32{sim.Embedding([]uint32{5, 6, 7}), sim.Embedding([]uint32{8, 9})}
			for _, format := range []string{"float", "base64"} {
				a := h.send("/v1/embeddings", fmt.Sprintf(`{"model":%q,"input":[[5,6,7],[8,9]],"encoding_format":%q}`, testModel, format), "")
				var got struct {
					Object string
					Data   []struct {
						Object    string
						Index     int
						Embedding json.RawMessage
					}
					Model string
					Usage struct{ PromptTokens, TotalTokens int } `json:"usage"`
				}
				if err := json.Unmarshal([]byte(a.body), &got); err != nil || a.status != http.StatusOK {
					t.Fatalf("%s: %d %v %s", format, a.status, err, a.body)
				}
				if got.Object != "list" || got.Model != testModel || len(got.Data) != 2 {
					t.Fatalf("%s: %s", format, a.body)
				}
				for i, d := range got.Data {
					var vec []float32
					if format == "float" {
						_ = json.Unmarshal(d.Embedding, &vec)
					} else {
						var s string
						_ = json.Unmarshal(d.Embedding, &s)
						raw, _ := base64.StdEncoding.DecodeString(s)
						for k := 0; k+4 <= len(raw); k += 4 {
							vec = append(vec, math.Float32frombits(binary.LittleEndian.Uint32(raw[k:])))
						}
					}
					if d.Object != "embedding" || d.Index != i || !slices.Equal(vec, want[i]) {
						t.Errorf("%s: input %d: %v, want %v", format, i, vec, want[i])
					}
				}
				// The usage JSON uses snake case.
				var u struct {
					Usage struct {
						Prompt int `json:"prompt_tokens"`
						Total  int `json:"total_tokens"`
					} `json:"usage"`
				}
				_ = json.Unmarshal([]byte(a.body), &u)
				if u.Usage.Prompt != 5 || u.Usage.Total != 5 {
					t.Errorf("%s: usage %s", format, a.body)
				}
			}
			a := h.send("/v1/embeddings", fmt.Sprintf(`{"model":%q,"input":"the man said"}`, testModel), "")
			if a.status != http.StatusOK || !strings.Contains(a.body, `"index":0`) {
				t.Errorf("a text input: %d %s", a.status, a.body)
			}
		})
	}
}

// TestGRPCRoutesRefuseBadInput: what /generate and /v1/embeddings cannot
// take is a 400 naming it, before anything reaches the engine.
func TestGRPCRoutesRefuseBadInput(t *testing.T) {
	s := startSimGRPC(t, sim.FlavorSGLang, nil)
	h := newHarness(t, nil)
	h.apply(Worker{ID: "w", URL: s.GRPCURL(), Model: testModel, Healthy: true})
	for _, c := range []struct{ path, body, want string }{
		{"/generate", `{"text":"a","input_ids":[1]}`, "either text or input_ids"},
		{"/generate", `{"sampling_params":{}}`, "text or input_ids is required"},
		{"/generate", `{"text":"a","return_logprob":true}`, "return_logprob"},
		{"/generate", `{"text":["a","b"],"sampling_params":[{},{}]}`, "list of sampling_params"},
		{"/generate", `{"text":"a","sampling_params":{"json_schema":"{}"}}`, "json_schema"},
		{"/generate", `{"input_ids":[99999999]}`, "outside the vocabulary"},
		{"/generate", `{"text":"a","sampling_params":{"max_new_tokens":0}}`, "max_tokens"},
		{"/v1/embeddings", `{"model":"` + testModel + `"}`, "input is required"},
		{"/v1/embeddings", `{"model":"` + testModel + `","input":"a","dimensions":8}`, "dimensions"},
		{"/v1/embeddings", `{"model":"` + testModel + `","input":"a","encoding_format":"int8"}`, "encoding_format"},
		{"/v1/embeddings", `{"model":"` + testModel + `","input":[[1],[]]}`, "input 1 is empty"},
		{"/v1/embeddings", `{"model":"` + testModel + `","input":{"a":1}}`, "input must be"},
	} {
		a := h.send(c.path, c.body, "")
		if a.status != http.StatusBadRequest || a.errorCode() != CodeInvalidRequest || !strings.Contains(a.body, c.want) {
			t.Errorf("%s %s: %d %s, want 400 naming %q", c.path, c.body, a.status, a.body, c.want)
		}
	}
	if n := s.GRPCRequests(); n != 0 {
		t.Errorf("the engine took %d requests", n)
	}
}

// embedFake is a fake engine whose Embed a test writes.
type embedFake struct {
	fakeEngine
	embed func(*sglangpb.EmbedRequest) (*sglangpb.EmbedResponse, error)
}

func (f *embedFake) Embed(_ context.Context, r *sglangpb.EmbedRequest) (*sglangpb.EmbedResponse, error) {
	return f.embed(r)
}

// TestEmbedFailures: an Embed the engine refuses as unavailable is retried
// on another worker before anything reached the client; an engine that
// answers a non-finite value or no vector is an explicit 502, never a body
// that is not JSON.
func TestEmbedFailures(t *testing.T) {
	archive := simArchive(t)
	var calls atomic.Int64
	busy := &embedFake{fakeEngine: fakeEngine{archive: archive}, embed: func(*sglangpb.EmbedRequest) (*sglangpb.EmbedResponse, error) {
		calls.Add(1)
		return nil, status.Error(codes.Unavailable, "engine busy")
	}}
	startFakeServer(t, busy)
	good := startSimGRPC(t, sim.FlavorSGLang, nil)
	h := newHarness(t, func(o *Options) { o.Policy = "round_robin" })
	h.apply(Worker{ID: "busy", URL: busy.url, Model: testModel, Healthy: true},
		Worker{ID: "good", URL: good.GRPCURL(), Model: testModel, Healthy: true})
	for range 2 {
		a := h.send("/v1/embeddings", fmt.Sprintf(`{"model":%q,"input":[5,6]}`, testModel), "")
		if a.status != http.StatusOK {
			t.Fatalf("retried on the good worker: %d %s", a.status, a.body)
		}
	}
	if calls.Load() == 0 {
		t.Fatal("the busy worker was never tried")
	}

	for name, resp := range map[string]*sglangpb.EmbedResponse{
		"NaN":   {Embedding: []float32{1, float32(math.NaN())}, PromptTokens: 2},
		"empty": {PromptTokens: 2},
	} {
		bad := &embedFake{fakeEngine: fakeEngine{archive: archive}, embed: func(*sglangpb.EmbedRequest) (*sglangpb.EmbedResponse, error) {
			return resp, nil
		}}
		startFakeServer(t, bad)
		h := newHarness(t, nil)
		h.apply(Worker{ID: "bad", URL: bad.url, Model: testModel, Healthy: true})
		a := h.send("/v1/embeddings", fmt.Sprintf(`{"model":%q,"input":[5,6]}`, testModel), "")
		if a.status != http.StatusBadGateway || !json.Valid([]byte(a.body)) {
			t.Errorf("%s: %d %s", name, a.status, a.body)
		}
	}
}

// TestGenerateOverGRPCPair: /generate over a prefill/decode pair of gRPC
// workers, with n inside sampling_params: each generation takes its room in
// the decode window (the rooms past the one taken at selection are taken
// once the body is read), or the window's shed answers.
func TestGenerateOverGRPCPair(t *testing.T) {
	for _, window := range []int64{8, 2} {
		prefill := startSimGRPC(t, sim.FlavorSGLang, func(o *sim.Options) { o.Role = sim.RolePrefill })
		decode := startSimGRPC(t, sim.FlavorSGLang, func(o *sim.Options) { o.Role = sim.RoleDecode; o.EOSProbability = 0 })
		h := newHarness(t, func(o *Options) { o.PDDisaggregation = true })
		h.apply(Worker{ID: "p", URL: prefill.GRPCURL(), Model: testModel, Type: TypePrefill, Healthy: true, BootstrapPort: simBootstrapPort(t, prefill)},
			Worker{ID: "d", URL: decode.GRPCURL(), Model: testModel, Type: TypeDecode, Healthy: true, MaxRunning: window, WindowShare: window})
		a := h.send("/generate", `{"model":"`+testModel+`","input_ids":[5,6],"sampling_params":{"max_new_tokens":2,"n":3}}`, "")
		var list []nativeItem
		switch {
		case window == 2 && (a.status != http.StatusServiceUnavailable || a.errorCode() != CodeShed):
			t.Errorf("3 generations over a window of 2: %d %s", a.status, a.body)
		case window == 8 && (a.status != http.StatusOK || json.Unmarshal([]byte(a.body), &list) != nil || len(list) != 3):
			t.Errorf("3 generations over a window of 8: %d %s", a.status, a.body)
		case window == 8 && decode.GRPCRequests() != 3:
			t.Errorf("decode took %d requests, want 3", decode.GRPCRequests())
		}
		pollFor(t, "the decode rooms released", func() bool { return h.r.states["d"].gate.InFlight() == 0 })
	}
}
