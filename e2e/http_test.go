package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// client is shared by the tests; every call also carries its own deadline.
var client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}}

const model = "sim-model" // the simulator's default model id

// ---- admin API (control plane REST) ----

// admin talks to a control plane's REST admin API (or smg launch's port).
type admin struct {
	base   string
	token  string       // Authorization: Bearer token, when set
	client *http.Client // nil: the package's client
}

// workerView is the part of a GET /workers entry the tests read.
type workerView struct {
	WorkerID string `json:"worker_id"`
	Spec     struct {
		URL      string `json:"url"`
		Overload *struct {
			WaitingRequests *int     `json:"waiting_requests"`
			TokenUsage      *float64 `json:"token_usage"`
		} `json:"overload"`
		BootstrapPort *int `json:"bootstrap_port"`
	} `json:"spec"`
	Thresholds struct {
		WaitingRequests int     `json:"waiting_requests"`
		TokenUsage      float64 `json:"token_usage"`
	} `json:"thresholds"`
	Health     string `json:"health"`
	Ready      bool   `json:"ready"`
	EngineLoad *struct {
		Source          string `json:"source"`
		WaitingRequests int    `json:"waiting_requests"`
		RunningRequests int    `json:"running_requests"`
		ReportedAt      string `json:"reported_at"`
	} `json:"engine_load"`
	Verdict struct {
		Vetoed         bool   `json:"vetoed"`
		Veto           string `json:"veto"`
		Overloaded     bool   `json:"overloaded"`
		Liveness       string `json:"liveness"`
		LivenessReason string `json:"liveness_reason"`
	} `json:"verdict"`
	AgentNode string `json:"agent_node"`
	Model     string `json:"model"`
	Admission *struct {
		Window u64            `json:"window"`
		Source string         `json:"source"`
		Shares map[string]u64 `json:"shares"`
		// A learned window: the limit learned and what fixed it.
		Learned   float64 `json:"learned"`
		LearnedBy string  `json:"learned_by"`
		// Under --worker-token-budget.
		TokenBudget u64            `json:"token_budget"`
		TokenSource string         `json:"token_source"`
		TokenShares map[string]u64 `json:"token_shares"`
	} `json:"admission"`
}

// routerView is one entry of GET /routers.
type routerView struct {
	RouterID        string `json:"router_id"`
	AppliedRevision u64    `json:"applied_revision"`
	Lag             u64    `json:"lag"`
}

// u64 reads a uint64 that protojson writes as a string ("6") or a number.
type u64 uint64

func (v *u64) UnmarshalJSON(b []byte) error {
	n, err := strconv.ParseUint(strings.Trim(string(b), `"`), 10, 64)
	*v = u64(n)
	return err
}

func (a admin) httpClient() *http.Client {
	if a.client != nil {
		return a.client
	}
	return client
}

func (a admin) do(method, path string, body []byte) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := a.httpClient().Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// workers returns GET /workers by URL, or an error to poll past.
func (a admin) workers() (map[string]workerView, error) {
	code, b, err := a.do(http.MethodGet, "/workers", nil)
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("GET /workers: %d %s", code, b)
	}
	var list struct {
		Workers []workerView `json:"workers"`
	}
	if err := json.Unmarshal(b, &list); err != nil {
		return nil, fmt.Errorf("GET /workers: %v: %s", err, b)
	}
	m := make(map[string]workerView, len(list.Workers))
	for _, w := range list.Workers {
		m[w.Spec.URL] = w
	}
	return m, nil
}

// routers returns GET /routers: the control plane's revision and its routers.
func (a admin) routers() (uint64, []routerView, error) {
	code, b, err := a.do(http.MethodGet, "/routers", nil)
	if err != nil {
		return 0, nil, err
	}
	if code != http.StatusOK {
		return 0, nil, fmt.Errorf("GET /routers: %d %s", code, b)
	}
	var r struct {
		Revision u64          `json:"revision"`
		Routers  []routerView `json:"routers"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return 0, nil, fmt.Errorf("GET /routers: %v: %s", err, b)
	}
	return uint64(r.Revision), r.Routers, nil
}

// waitReady waits until every url is a Ready worker.
func (a admin) waitReady(t *testing.T, urls ...string) map[string]workerView {
	t.Helper()
	var ws map[string]workerView
	waitFor(t, 20*time.Second, "workers ready", func() (bool, string) {
		var err error
		if ws, err = a.workers(); err != nil {
			return false, err.Error()
		}
		for _, u := range urls {
			if w, ok := ws[u]; !ok || !w.Ready {
				return false, fmt.Sprintf("%s: %+v", u, ws[u])
			}
		}
		return true, ""
	})
	return ws
}

// waitVerdicts waits until each url's overloaded flag reads as want says.
func (a admin) waitVerdicts(t *testing.T, want map[string]bool) {
	t.Helper()
	waitFor(t, 20*time.Second, "overload verdicts", func() (bool, string) {
		ws, err := a.workers()
		if err != nil {
			return false, err.Error()
		}
		for u, over := range want {
			w, ok := ws[u]
			if !ok || w.Verdict.Overloaded != over {
				return false, fmt.Sprintf("%s: want overloaded=%v, have %+v load %+v", u, over, w.Verdict, w.EngineLoad)
			}
		}
		return true, ""
	})
}

// waitRoutersApplied waits until n routers are connected and each has applied
// at least the control plane's revision at the time of the call, so a verdict
// read before it is in every router's snapshot.
func (a admin) waitRoutersApplied(t *testing.T, n int) {
	t.Helper()
	var target uint64
	waitFor(t, 20*time.Second, "routers to apply the current revision", func() (bool, string) {
		rev, rs, err := a.routers()
		if err != nil {
			return false, err.Error()
		}
		if target == 0 {
			target = rev
		}
		if len(rs) != n {
			return false, fmt.Sprintf("%d routers, want %d: %+v", len(rs), n, rs)
		}
		for _, r := range rs {
			if uint64(r.AppliedRevision) < target {
				return false, fmt.Sprintf("router %s at %d, want >= %d", r.RouterID, r.AppliedRevision, target)
			}
		}
		return true, ""
	})
}

// ---- OpenAI API ----

// answer is one client request's outcome.
type answer struct {
	status int
	header http.Header
	body   []byte
	err    error // transport error or timeout
}

func chatBody(maxTokens int, stream bool) []byte {
	return chatBodyWith("hello there", maxTokens, stream)
}

func chatBodyWith(content string, maxTokens int, stream bool) []byte {
	return chatBodyFor(model, content, maxTokens, stream)
}

func chatBodyFor(modelID, content string, maxTokens int, stream bool) []byte {
	return []byte(fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":%d,"stream":%v}`,
		modelID, content, maxTokens, stream))
}

// chat sends one chat completion to base and reads the whole answer.
func chat(base string, maxTokens int, stream bool, timeout time.Duration) answer {
	return chatModel(base, model, maxTokens, stream, timeout)
}

// chatModel is chat for a given model id.
func chatModel(base, modelID string, maxTokens int, stream bool, timeout time.Duration) answer {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(chatBodyFor(modelID, "hello there", maxTokens, stream)))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: b, err: err}
}

// completeJSON reports whether a is a whole non-streaming chat completion.
func (a answer) completeJSON() error {
	if a.err != nil {
		return a.err
	}
	if a.status != http.StatusOK {
		return fmt.Errorf("status %d: %s", a.status, a.body)
	}
	var c struct {
		Object  string `json:"object"`
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(a.body, &c); err != nil {
		return fmt.Errorf("not JSON: %v: %q", err, a.body)
	}
	if c.Object != "chat.completion" || len(c.Choices) != 1 || c.Choices[0].FinishReason == "" || c.Choices[0].Message.Content == "" {
		return fmt.Errorf("incomplete completion: %s", a.body)
	}
	return nil
}

// completeStream reports whether a is a whole SSE stream: 200, chunks, a
// finish_reason and data: [DONE] as the last event.
func (a answer) completeStream() error {
	if a.err != nil {
		return a.err
	}
	if a.status != http.StatusOK {
		return fmt.Errorf("status %d: %s", a.status, a.body)
	}
	events := sseEvents(a.body)
	if len(events) < 2 || events[len(events)-1] != "[DONE]" {
		return fmt.Errorf("stream does not end with [DONE]: %q", a.body)
	}
	finished := false
	for _, e := range events[:len(events)-1] {
		var c struct {
			Choices []struct {
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(e), &c); err != nil {
			return fmt.Errorf("event not JSON: %v: %q", err, e)
		}
		for _, ch := range c.Choices {
			finished = finished || ch.FinishReason != nil && *ch.FinishReason != ""
		}
	}
	if !finished {
		return fmt.Errorf("no finish_reason in stream: %q", a.body)
	}
	return nil
}

// errorCode returns the code of an explicit error: a JSON error body (whole
// answer) or an SSE error event, "" when there is none.
func (a answer) errorCode() string {
	var e struct {
		Error struct {
			Code any `json:"code"`
		} `json:"error"`
	}
	if a.status != http.StatusOK && json.Unmarshal(a.body, &e) == nil && e.Error.Code != nil {
		return fmt.Sprint(e.Error.Code)
	}
	for _, ev := range sseEvents(a.body) {
		if json.Unmarshal([]byte(ev), &e) == nil && e.Error.Code != nil {
			return fmt.Sprint(e.Error.Code)
		}
	}
	return ""
}

// sseEvents returns the data of every SSE event in body.
func sseEvents(body []byte) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, d)
		}
	}
	return out
}

// ---- load on an engine ----

// loadEngine holds n long streaming requests open directly on an engine (not
// through any router) until the returned release is called; release cancels
// them, so the engine aborts them and its queue empties. Each request's
// prompt is about promptTokens long (the simulator counts 4 characters a
// token) and asks for maxTokens.
func loadEngine(t *testing.T, url string, n, promptTokens, maxTokens int) (release func()) {
	t.Helper()
	body := chatBodyWith(strings.Repeat("word", promptTokens), maxTokens, true)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
			if err != nil {
				return
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				return
			}
			defer resp.Body.Close()
			_, _ = io.Copy(io.Discard, resp.Body)
		}()
	}
	var once sync.Once
	release = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(release)
	return release
}

// ---- Prometheus exposition ----

// scrape returns the text exposition at url.
func scrape(url string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %d", url, resp.StatusCode)
	}
	return string(b), err
}

// metricSum sums the samples of metric name whose labels include every
// name="value" pair given.
func metricSum(exposition, name string, labels ...string) float64 {
	var sum float64
	for _, line := range strings.Split(exposition, "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			continue
		}
		series := line[:sp]
		metric, lbls, _ := strings.Cut(series, "{")
		if metric != name {
			continue
		}
		ok := true
		for i := 0; i+1 < len(labels); i += 2 {
			if !strings.Contains(lbls, labels[i]+`="`+labels[i+1]+`"`) {
				ok = false
			}
		}
		if !ok {
			continue
		}
		if v, err := strconv.ParseFloat(line[sp+1:], 64); err == nil {
			sum += v
		}
	}
	return sum
}

// servedBy returns how many requests the engine at url finished with a full
// answer (finished_reason length or stop; aborts excluded).
func servedBy(t *testing.T, url string) int {
	t.Helper()
	m, err := scrape(url + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	return int(metricSum(m, "vllm:request_success_total", "finished_reason", "length") +
		metricSum(m, "vllm:request_success_total", "finished_reason", "stop"))
}
