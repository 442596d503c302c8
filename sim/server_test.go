package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func fastOptions() Options {
	o := DefaultOptions()
	o.ITL = time.Millisecond
	o.MaxRunningRequests = 8
	o.PrefillTokensPerSec = 1e6
	o.SGLangMetricsInterval = 1
	return o
}

func startSim(t *testing.T, o Options) *Server {
	t.Helper()
	s, err := Start("127.0.0.1:0", o, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func post(t *testing.T, ctx context.Context, url, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func getBody(t *testing.T, url string) (int, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// sse is what a client reads from one stream.
type sse struct {
	role, content []string
	finish        []string
	usage         *struct{ PromptTokens, CompletionTokens, TotalTokens int }
	done          bool
	errMsg        string
}

func readSSE(t *testing.T, r io.Reader) sse {
	t.Helper()
	var out sse
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			out.done = true
			continue
		}
		var ev struct {
			Choices []struct {
				Text  *string `json:"text"`
				Delta struct {
					Role    string  `json:"role"`
					Content *string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
				TotalTokens      int `json:"total_tokens"`
			} `json:"usage"`
			Error *struct{ Message string } `json:"error"`
		}
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("chunk is not JSON: %v: %s", err, line)
		}
		if ev.Error != nil {
			out.errMsg = ev.Error.Message
		}
		if ev.Usage != nil {
			out.usage = &struct{ PromptTokens, CompletionTokens, TotalTokens int }{ev.Usage.PromptTokens, ev.Usage.CompletionTokens, ev.Usage.TotalTokens}
		}
		for _, c := range ev.Choices {
			if c.Delta.Role != "" {
				out.role = append(out.role, c.Delta.Role)
			}
			text := c.Text
			if text == nil {
				text = c.Delta.Content
			}
			if text != nil && *text != "" {
				out.content = append(out.content, *text)
			}
			if c.FinishReason != nil {
				out.finish = append(out.finish, *c.FinishReason)
			}
		}
	}
	return out
}

func scrape(t *testing.T, base string) map[string]*dto.MetricFamily {
	t.Helper()
	fams, err := scrapeErr(base)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

func scrapeErr(base string) (map[string]*dto.MetricFamily, error) {
	req, _ := http.NewRequest(http.MethodGet, base+"/metrics", nil)
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

// gauge reads name{labels...} from a scrape (label pairs as "k", "v", ...).
func gauge(fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	f := fams[name]
	if f == nil {
		return -1
	}
next:
	for _, m := range f.Metric {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, lp := range m.Label {
				if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	return -1
}

// eventually polls cond until it holds, failing after five seconds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(5 * time.Second)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func TestOpenAISurface(t *testing.T) {
	s := startSim(t, fastOptions())
	ctx := t.Context()

	resp := post(t, ctx, s.URL()+"/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"hello"}],
		"max_tokens":7,"stream":true,"stream_options":{"include_usage":true}}`)
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("content type %q", ct)
	}
	got := readSSE(t, resp.Body)
	resp.Body.Close()
	if len(got.content) != 7 || !got.done || !slices.Equal(got.role, []string{"assistant"}) || !slices.Contains(got.finish, "length") {
		t.Errorf("chat stream: %d tokens, done %v, roles %v, finish %v", len(got.content), got.done, got.role, got.finish)
	}
	// Usage counts the chat as the model's tokenizer does, rendered with its
	// template: what a router's gRPC path counts for the same chat.
	tok, _ := simModel()
	prompt := len(tok.Encode("user: hello\nassistant: "))
	if got.usage == nil || got.usage.CompletionTokens != 7 || got.usage.PromptTokens != prompt || got.usage.TotalTokens != prompt+7 {
		t.Errorf("chat stream usage %+v, want %d prompt + 7 completion", got.usage, prompt)
	}

	resp = post(t, ctx, s.URL()+"/v1/completions", `{"prompt":"abcdefgh","max_completion_tokens":4,"stream":true}`)
	got = readSSE(t, resp.Body)
	resp.Body.Close()
	if len(got.content) != 4 || !got.done || got.usage != nil {
		t.Errorf("completion stream: %d tokens, done %v, usage %+v (no include_usage: want none)", len(got.content), got.done, got.usage)
	}

	for _, c := range []struct{ path, body, object string }{
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_tokens":5}`, "chat.completion"},
		{"/v1/completions", `{"prompt":[1,2,3,4,5,6],"max_tokens":5}`, "text_completion"},
	} {
		resp = post(t, ctx, s.URL()+c.path, c.body)
		var body struct {
			Object  string
			Choices []struct {
				Text    string
				Message struct{ Content string }
			}
			Usage struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
			}
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		text := body.Choices[0].Text + body.Choices[0].Message.Content
		if body.Object != c.object || body.Usage.CompletionTokens != 5 || len(strings.Fields(text)) != 5 {
			t.Errorf("%s: object %q, usage %+v, text %q", c.path, body.Object, body.Usage, text)
		}
		if c.path == "/v1/completions" && body.Usage.PromptTokens != 6 {
			t.Errorf("token-id prompt counted %d tokens, want 6", body.Usage.PromptTokens)
		}
	}

	resp = post(t, ctx, s.URL()+"/v1/completions", `{"model":"other","prompt":"x"}`)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown model: status %d, want 404", resp.StatusCode)
	}
	if code, b := getBody(t, s.URL()+"/v1/models"); code != 200 || !bytes.Contains(b, []byte(`"id":"sim-model"`)) {
		t.Errorf("/v1/models: %d %s", code, b)
	}
	if code, _ := getBody(t, s.URL()+"/health"); code != 200 {
		t.Errorf("/health: %d", code)
	}
}

func familyNames(fams map[string]*dto.MetricFamily) []string {
	var names []string
	for n := range fams {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func TestVLLMMetrics(t *testing.T) {
	o := fastOptions()
	o.DPSize = 2
	s := startSim(t, o)
	resp := post(t, t.Context(), s.URL()+"/v1/completions", `{"prompt":"hello","max_tokens":20,"stream":true}`)
	got := readSSE(t, resp.Body)
	resp.Body.Close()
	fams := scrape(t, s.URL())
	want := []string{
		"process_start_time_seconds", "vllm:cache_config_info",
		"vllm:generation_tokens_total", "vllm:iteration_tokens_total", "vllm:kv_cache_usage_perc",
		"vllm:num_preemptions_total", "vllm:num_requests_running", "vllm:num_requests_waiting",
		"vllm:prompt_tokens_total", "vllm:request_success_total",
	}
	if names := familyNames(fams); !slices.Equal(names, want) {
		t.Errorf("metric names\n got %v\nwant %v", names, want)
	}
	if typ := fams["vllm:iteration_tokens_total"].GetType(); typ != dto.MetricType_HISTOGRAM {
		t.Errorf("iteration_tokens_total is %v, want histogram", typ)
	}
	for _, rk := range []string{"0", "1"} {
		if v := gauge(fams, "vllm:num_requests_running", "model_name", "sim-model", "engine", rk); v != 0 {
			t.Errorf("engine %s running %v, want 0 with labels model_name and engine", rk, v)
		}
	}
	gen := gauge(fams, "vllm:generation_tokens_total", "engine", "0") + gauge(fams, "vllm:generation_tokens_total", "engine", "1")
	steps := gauge(fams, "vllm:iteration_tokens_total", "engine", "0") + gauge(fams, "vllm:iteration_tokens_total", "engine", "1")
	if gen != float64(len(got.content)) || gen != 20 {
		t.Errorf("generation_tokens_total %v, want the 20 streamed", gen)
	}
	if steps != 20 { // one prefill step (first token) + 19 decode steps
		t.Errorf("iteration_tokens_total count %v, want one per step: 20", steps)
	}
	if done := gauge(fams, "vllm:request_success_total", "finished_reason", "length"); done != 1 {
		t.Errorf("request_success_total{length} %v, want 1", done)
	}
	// The KV cache's config, as stock vLLM labels it: its capacity in blocks
	// of 16 tokens, per engine; no max_num_seqs (the window stays untold).
	blocks := strconv.Itoa(o.KVCapacityTokens / 16)
	for _, rk := range []string{"0", "1"} {
		if v := gauge(fams, "vllm:cache_config_info", "engine", rk, "block_size", "16", "num_gpu_blocks", blocks); v != 1 {
			t.Errorf("engine %s cache_config_info{block_size=16,num_gpu_blocks=%s} = %v, want 1", rk, blocks, v)
		}
	}
}

func TestSGLangSurfaces(t *testing.T) {
	o := fastOptions()
	o.Flavor, o.DPSize, o.TPSize = FlavorSGLang, 2, 2
	s := startSim(t, o)
	_, b := getBody(t, s.URL()+"/v1/loads")
	var loads struct {
		Loads []loadEntry
	}
	if err := json.Unmarshal(b, &loads); err != nil || len(loads.Loads) != 2 {
		t.Fatalf("/v1/loads %s: %v", b, err)
	}
	for i, l := range loads.Loads {
		if l.DPRank != i || l.MaxRunningRequests != 8 || l.MaxTotalNumTokens != o.KVCapacityTokens {
			t.Errorf("load %d: %+v", i, l)
		}
	}
	for _, key := range []string{`"num_running_reqs"`, `"num_waiting_reqs"`, `"token_usage"`, `"gen_throughput"`, `"max_running_requests"`} {
		if !bytes.Contains(b, []byte(key)) {
			t.Errorf("/v1/loads lacks %s", key)
		}
	}
	_, b = getBody(t, s.URL()+"/get_load")
	var legacy []map[string]float64
	if err := json.Unmarshal(b, &legacy); err != nil || len(legacy) != 2 || len(legacy[0]) != 4 {
		t.Errorf("/get_load %s: %v", b, err)
	}
	_, b = getBody(t, s.URL()+"/server_info")
	var info struct {
		MaxRunningRequests int `json:"max_running_requests"`
	}
	if err := json.Unmarshal(b, &info); err != nil || info.MaxRunningRequests != 8 {
		t.Errorf("/server_info %s: %v", b, err)
	}
	if code, b := getBody(t, s.URL()+"/v1/models"); code != 200 || !bytes.Contains(b, []byte(`"sim-model"`)) {
		t.Errorf("/v1/models: %d %s", code, b)
	}
	fams := scrape(t, s.URL())
	want := []string{
		"process_start_time_seconds",
		"sglang:cache_hit_rate", "sglang:gen_throughput", "sglang:generation_tokens_total",
		"sglang:max_running_requests", "sglang:max_total_num_tokens", "sglang:num_queue_reqs",
		"sglang:num_requests_total", "sglang:num_running_reqs", "sglang:num_used_tokens",
		"sglang:prompt_tokens_total", "sglang:token_usage",
	}
	if names := familyNames(fams); !slices.Equal(names, want) {
		t.Errorf("metric names\n got %v\nwant %v", names, want)
	}
	if n := len(fams["sglang:num_queue_reqs"].Metric); n != 4 {
		t.Errorf("num_queue_reqs has %d series, want 4 (2 tp x 2 dp)", n)
	}
	if v := gauge(fams, "sglang:num_queue_reqs", "tp_rank", "1", "dp_rank", "1", "model_name", "sim-model"); v != 0 {
		t.Errorf("num_queue_reqs{tp_rank=1,dp_rank=1} = %v", v)
	}
}

func TestFreezeKeepsHealthAndMetrics(t *testing.T) {
	s := startSim(t, fastOptions())
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	resp := post(t, ctx, s.URL()+"/v1/completions", `{"prompt":"x","max_tokens":50000,"stream":true}`)
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	s.SetFault(Fault{Freeze: true})
	if !s.Fault().Freeze {
		t.Fatal("Fault() does not report the freeze")
	}
	queued := make(chan struct{})
	go func() { // queues behind the wedge; the test's end cancels it
		defer close(queued)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+"/v1/completions", strings.NewReader(`{"prompt":"y","max_tokens":5}`))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	defer func() { cancel(); <-queued }()
	eventually(t, "a queue on the frozen engine", func() bool {
		return gauge(scrape(t, s.URL()), "vllm:num_requests_waiting") == 1
	})
	if code, _ := getBody(t, s.URL()+"/health"); code != 200 {
		t.Errorf("/health on a frozen engine: %d, want 200", code)
	}
	if v := gauge(scrape(t, s.URL()), "vllm:num_requests_running"); v != 1 {
		t.Errorf("frozen engine reports running %v, want 1", v)
	}
}

func TestSilentMetrics(t *testing.T) {
	for _, flavor := range []string{FlavorVLLM, FlavorSGLang} {
		o := fastOptions()
		o.Flavor = flavor
		o.Fault.SilentMetrics = true
		s := startSim(t, o)
		if names := familyNames(scrape(t, s.URL())); !slices.Equal(names, []string{"process_start_time_seconds"}) {
			t.Errorf("%s silent metrics carry %v", flavor, names)
		}
		if flavor == FlavorSGLang {
			if _, b := getBody(t, s.URL()+"/v1/loads"); !bytes.Contains(b, []byte(`"loads":[]`)) {
				t.Errorf("silent /v1/loads: %s", b)
			}
		}
		s.SetFault(Fault{})
		if _, ok := scrape(t, s.URL())[flavor+":num_"+map[string]string{FlavorVLLM: "requests_waiting", FlavorSGLang: "queue_reqs"}[flavor]]; !ok {
			t.Errorf("%s: load series did not come back after clearing", flavor)
		}
	}
}

func TestGarbageMetrics(t *testing.T) {
	o := fastOptions()
	o.Flavor = FlavorSGLang
	s := startSim(t, o)
	s.SetFault(Fault{GarbageMetrics: true})
	if _, err := scrapeErr(s.URL()); err == nil {
		t.Error("garbage exposition parsed")
	}
	for _, path := range []string{"/v1/loads", "/get_load"} {
		_, b := getBody(t, s.URL()+path)
		if json.Valid(b) {
			t.Errorf("garbage %s is valid JSON: %s", path, b)
		}
	}
	s.SetFault(Fault{})
	scrape(t, s.URL())
}

func TestResetFault(t *testing.T) {
	s := startSim(t, fastOptions())
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	resp := post(t, ctx, s.URL()+"/v1/completions", `{"prompt":"x","max_tokens":50000,"stream":true}`)
	defer resp.Body.Close()
	if err := s.SetFault(Fault{Reset: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, resp.Body); err == nil {
		t.Error("open stream survived the reset")
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	// The peer's reset reaches the client as ECONNRESET or EOF on a read, or
	// as EPIPE when it lands while the request is still being written.
	if _, err := client.Get(s.URL() + "/health"); err == nil || !strings.Contains(err.Error(), "reset") && !strings.Contains(err.Error(), "EOF") && !errors.Is(err, syscall.EPIPE) {
		t.Errorf("request during reset: err %v, want a connection reset", err)
	}
	s.SetFault(Fault{})
	if resp, err := client.Get(s.URL() + "/health"); err != nil || resp.StatusCode != 200 {
		t.Errorf("after clearing reset: %v", err)
	}
}

func TestKillAndReviveThroughSibling(t *testing.T) {
	fleet, err := StartFleet("127.0.0.1", 0, 2, fastOptions(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, s := range fleet {
			s.Close()
		}
	})
	victim := fleet[1]
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	stream := post(t, ctx, victim.URL()+"/v1/completions", `{"prompt":"x","max_tokens":50000,"stream":true}`)
	defer stream.Body.Close()

	resp := post(t, ctx, fleet[0].URL()+"/sim/fault", `{"engine":1,"kill":true}`)
	var st FaultState
	json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if st.Engine != 1 || !st.Kill || st.URL != victim.URL() {
		t.Fatalf("kill answer %+v", st)
	}
	if _, err := io.Copy(io.Discard, stream.Body); err == nil {
		t.Error("open stream was not cut by the kill")
	}
	if _, err := http.Get(victim.URL() + "/health"); err == nil {
		t.Error("killed engine still answers")
	}
	if _, b := getBody(t, fleet[0].URL()+"/sim/fault?engine=1"); !bytes.Contains(b, []byte(`"kill":true`)) {
		t.Errorf("GET fault of the killed engine: %s", b)
	}
	resp = post(t, ctx, fleet[0].URL()+"/sim/fault", `{"engine":1,"kill":false}`)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("revive: status %d", resp.StatusCode)
	}
	if code, _ := getBody(t, victim.URL()+"/health"); code != 200 {
		t.Errorf("revived engine /health: %d", code)
	}
	if v := gauge(scrape(t, victim.URL()), "vllm:generation_tokens_total"); v != 0 {
		t.Errorf("revived engine kept its counters (%v): want a fresh process", v)
	}
	if fleet[0].Fault() != (Fault{}) {
		t.Errorf("the sibling's own faults changed: %+v", fleet[0].Fault())
	}
}

func TestSelfKillWithDuration(t *testing.T) {
	s := startSim(t, fastOptions())
	resp := post(t, t.Context(), s.URL()+"/sim/fault", `{"kill":true,"duration":"300ms"}`)
	var st FaultState
	json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if !st.Kill {
		t.Fatalf("self kill answer %+v", st)
	}
	eventually(t, "the kill to land", func() bool { return s.Fault().Kill })
	eventually(t, "the engine to come back", func() bool {
		resp, err := http.Get(s.URL() + "/health")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200 && !s.Fault().Kill
	})
}

func TestControlHandlerScopes(t *testing.T) {
	fleet, err := StartFleet("127.0.0.1", 0, 3, fastOptions(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, s := range fleet {
			s.Close()
		}
	})
	ctl := httptest.NewServer(ControlHandler(fleet))
	defer ctl.Close()
	resp := post(t, t.Context(), ctl.URL+"/sim/fault", `{"engine":2,"slow":4,"silent_metrics":true}`)
	resp.Body.Close()
	if got := fleet[2].Fault(); got.Slow != 4 || !got.SilentMetrics || fleet[1].Fault() != (Fault{}) {
		t.Errorf("engine 2 fault %+v, engine 1 %+v", got, fleet[1].Fault())
	}
	resp = post(t, t.Context(), ctl.URL+"/sim/fault", `{"freeze":true}`) // no engine: all of them
	var all []FaultState
	json.NewDecoder(resp.Body).Decode(&all)
	resp.Body.Close()
	if len(all) != 3 || !all[0].Freeze || !all[2].Freeze || all[2].Slow != 4 {
		t.Errorf("fleet-wide patch: %+v", all)
	}
	resp = post(t, t.Context(), fleet[0].URL()+"/sim/fault", `{"clear":true}`) // own port: only engine 0
	resp.Body.Close()
	if fleet[0].Fault() != (Fault{}) || !fleet[1].Fault().Freeze {
		t.Errorf("clear on engine 0's port: 0 = %+v, 1 = %+v", fleet[0].Fault(), fleet[1].Fault())
	}
	resp = post(t, t.Context(), ctl.URL+"/sim/fault?engine=9", `{}`)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("unknown engine: status %d, want 400", resp.StatusCode)
	}
}

func TestClientDisconnectFreesRequest(t *testing.T) {
	s := startSim(t, fastOptions())
	ctx, cancel := context.WithCancel(t.Context())
	resp := post(t, ctx, s.URL()+"/v1/completions", `{"prompt":"x","max_tokens":50000,"stream":true}`)
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if v := gauge(scrape(t, s.URL()), "vllm:num_requests_running"); v != 1 {
		t.Fatalf("running %v, want 1", v)
	}
	cancel()
	resp.Body.Close()
	eventually(t, "the disconnected request to be freed", func() bool {
		f := scrape(t, s.URL())
		return gauge(f, "vllm:num_requests_running") == 0 && gauge(f, "vllm:kv_cache_usage_perc") == 0 &&
			gauge(f, "vllm:request_success_total", "finished_reason", "abort") == 1
	})
}

func TestPDOverHTTP(t *testing.T) {
	po, do := fastOptions(), fastOptions()
	po.Flavor, do.Flavor = FlavorSGLang, FlavorSGLang
	po.Role, do.Role = RolePrefill, RoleDecode
	prefill, decode := startSim(t, po), startSim(t, do)
	host, port := "127.0.0.1", strings.TrimPrefix(prefill.URL(), "http://127.0.0.1:")
	body := fmt.Sprintf(`{"prompt":"hello world","max_tokens":12,"stream":true,"bootstrap_host":%q,"bootstrap_port":%s,"bootstrap_room":42}`, host, port)
	prefillDone := make(chan sse, 1)
	go func() {
		resp := post(t, t.Context(), prefill.URL()+"/v1/completions", body)
		defer resp.Body.Close()
		prefillDone <- readSSE(t, resp.Body)
	}()
	resp := post(t, t.Context(), decode.URL()+"/v1/completions", body)
	got := readSSE(t, resp.Body)
	resp.Body.Close()
	if len(got.content) != 12 || got.errMsg != "" || !got.done {
		t.Errorf("decode leg: %d tokens, error %q", len(got.content), got.errMsg)
	}
	if p := <-prefillDone; len(p.content) != 1 || p.errMsg != "" {
		t.Errorf("prefill leg: %d tokens, error %q; want the first token only", len(p.content), p.errMsg)
	}
	// The prefill tells its bootstrap port (its own HTTP port, where KV is
	// handed over) where SGLang does; the decode engine has none.
	bport := prefill.Addr()[strings.LastIndexByte(prefill.Addr(), ':')+1:]
	if code, b := getBody(t, prefill.URL()+"/server_info"); code != 200 || !bytes.Contains(b, []byte(`"disaggregation_mode":"prefill"`)) ||
		!bytes.Contains(b, []byte(`"disaggregation_bootstrap_port":`+bport)) {
		t.Errorf("prefill /server_info: %s, want disaggregation_bootstrap_port %s", b, bport)
	}
	if code, b := getBody(t, decode.URL()+"/server_info"); code == 200 && !bytes.Contains(b, []byte(`"disaggregation_bootstrap_port":null`)) {
		t.Errorf("decode /server_info: %s, want no bootstrap port", b)
	}
	resp = post(t, t.Context(), decode.URL()+"/v1/completions", `{"prompt":"x"}`)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("decode request without bootstrap fields: %d, want 400", resp.StatusCode)
	}
}

func TestPrefillBootstrapTimeoutOverHTTP(t *testing.T) {
	o := fastOptions()
	o.Flavor, o.Role, o.BootstrapTimeout = FlavorSGLang, RolePrefill, 100*time.Millisecond
	s := startSim(t, o)
	resp := post(t, t.Context(), s.URL()+"/v1/completions", `{"prompt":"x","bootstrap_room":1,"bootstrap_host":"127.0.0.1","bootstrap_port":1}`)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusInternalServerError || !bytes.Contains(b, []byte("bootstrap timeout")) {
		t.Errorf("unclaimed prefill: %d %s, want 500 bootstrap timeout", resp.StatusCode, b)
	}
	if v := gauge(scrape(t, s.URL()), "sglang:num_used_tokens"); v != 0 {
		t.Errorf("prefill still holds %v KV tokens", v)
	}
}

func TestOptionsValidate(t *testing.T) {
	if err := DefaultOptions().Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	for name, mut := range map[string]func(*Options){
		"flavor": func(o *Options) { o.Flavor = "tgi" }, "role": func(o *Options) { o.Role = "x" },
		"window": func(o *Options) { o.MaxRunningRequests = 0 }, "itl": func(o *Options) { o.ITL = 0 },
		"dp": func(o *Options) { o.DPSize = 0 }, "eos": func(o *Options) { o.EOSProbability = 1 },
	} {
		o := DefaultOptions()
		mut(&o)
		if o.Validate() == nil {
			t.Errorf("%s: invalid options accepted", name)
		}
		if _, err := Start("127.0.0.1:0", o, nil); err == nil {
			t.Errorf("%s: Start accepted invalid options", name)
		}
	}
}

func TestSeedMakesOutputRepeatable(t *testing.T) {
	text := func(seed uint64) string {
		o := fastOptions()
		o.Seed, o.EOSProbability = seed, 0.05
		s := startSim(t, o)
		var all strings.Builder
		for range 3 {
			resp := post(t, t.Context(), s.URL()+"/v1/completions", `{"prompt":"x","max_tokens":60}`)
			var body struct {
				Choices []struct {
					Text         string
					FinishReason string `json:"finish_reason"`
				}
			}
			json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
			all.WriteString(body.Choices[0].Text + "|" + body.Choices[0].FinishReason + "\n")
		}
		return all.String()
	}
	a, b, c := text(7), text(7), text(8)
	if a != b {
		t.Errorf("same seed, different output:\n%s\n%s", a, b)
	}
	if a == c {
		t.Error("different seeds gave the same output")
	}
}

// A chat stream's body starts with the first output, as in vLLM: a request
// that waits or prefills sends headers and nothing else, so a gateway sees no
// progress from an engine that produces none.
func TestChatStreamSendsNothingBeforeTheFirstToken(t *testing.T) {
	s := startSim(t, fastOptions())
	s.SetFault(Fault{Freeze: true})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	resp := post(t, ctx, s.URL()+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true}`)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	// The headers arrived while the engine is frozen; the body has not begun.
	eventually(t, "the request on the frozen engine", func() bool {
		return gauge(scrape(t, s.URL()), "vllm:num_requests_running")+gauge(scrape(t, s.URL()), "vllm:num_requests_waiting") == 1
	})
	br := bufio.NewReader(resp.Body)
	began := make(chan struct{})
	go func() {
		defer close(began)
		_, _ = br.Peek(1)
	}()
	select { // a negative check on real sockets needs a window of real time
	case <-began:
		t.Fatal("a frozen engine sent body bytes before any token")
	case <-time.After(300 * time.Millisecond):
	}
	s.SetFault(Fault{})
	<-began
	body, err := io.ReadAll(br)
	if err != nil {
		t.Fatal(err)
	}
	events := strings.Split(strings.TrimSpace(string(body)), "\n\n")
	if len(events) < 3 || !strings.Contains(events[0], `"role":"assistant"`) || !strings.Contains(events[1], `"content":"`) {
		t.Fatalf("stream = %q, want the role chunk then the tokens", body)
	}
}

// List-valued bootstrap fields name one room per prompt of a batch; a list
// that does not match the prompts is a clear 400.
func TestBatchedBootstrapFieldsMustMatchThePrompts(t *testing.T) {
	o := fastOptions()
	o.Flavor, o.Role = FlavorSGLang, RoleDecode
	s := startSim(t, o)
	for body, want := range map[string]string{
		`{"prompt":["a","b","c"],"bootstrap_host":["h","h","h"],"bootstrap_port":[1,1,1],"bootstrap_room":[1,2]}`: "bootstrap_room has 2 entries for 3 prompts",
		`{"prompt":["a","b"],"bootstrap_host":["h"],"bootstrap_port":[1,1],"bootstrap_room":[1,2]}`:               "one entry per prompt",
		`{"prompt":["a","b"],"bootstrap_host":"h","bootstrap_port":1,"bootstrap_room":["x"]}`:                     "bootstrap_room",
	} {
		resp := post(t, t.Context(), s.URL()+"/v1/completions", body)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !bytes.Contains(b, []byte(want)) {
			t.Errorf("%s: %d %s, want 400 naming %q", body, resp.StatusCode, b, want)
		}
	}
}

// Logprobs asked for out of range, or of the wrong type, are a 400 naming
// the field on both routes.
func TestLogprobsOutOfRange(t *testing.T) {
	s := startSim(t, fastOptions())
	for _, c := range []struct{ path, body, want string }{
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":21}`, "top_logprobs must be between 0 and 20"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"top_logprobs":2}`, "top_logprobs needs logprobs"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"logprobs":3}`, "logprobs must be a boolean"},
		{"/v1/completions", `{"prompt":"hi","logprobs":-1}`, "logprobs must be an integer between 0 and 20"},
		{"/v1/completions", `{"prompt":"hi","logprobs":true}`, "logprobs must be an integer between 0 and 20"},
	} {
		resp := post(t, t.Context(), s.URL()+c.path, c.body)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !bytes.Contains(b, []byte(c.want)) {
			t.Errorf("%s %s: %d %s, want 400 naming %q", c.path, c.body, resp.StatusCode, b, c.want)
		}
	}
}

// A revive is a restarted process: its process_start_time_seconds is later
// than the killed one's, as a restarted engine's is (how the control plane
// tells a restart it never saw unreachable).
func TestReviveMovesTheStartTime(t *testing.T) {
	s := startSim(t, fastOptions())
	before := gauge(scrape(t, s.URL()), "process_start_time_seconds")
	if before <= 0 {
		t.Fatalf("process_start_time_seconds %v, want the start time", before)
	}
	if err := s.SetFault(Fault{Kill: true}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetFault(Fault{}); err != nil {
		t.Fatal(err)
	}
	if after := gauge(scrape(t, s.URL()), "process_start_time_seconds"); !(after > before) {
		t.Fatalf("process_start_time_seconds %v after a revive, want later than %v", after, before)
	}
}
