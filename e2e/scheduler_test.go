package e2e

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// schedulerYAML gives two API keys their tenants and ceilings, drops SMG's
// default reservations (160 slots do not fit a capacity of 1), makes the
// default queue refuse at once and the bulk queue time out after a second.
const schedulerYAML = `
classes:
  system: {reserved: 0}
  interactive: {reserved: 0}
  default: {queue_size: 0}
  bulk: {queue_timeout_secs: 1}
api_keys:
  sk-batch-team: batch
  sk-chat-app: chat
tenant_policies:
  "auth:chat": {max_class: interactive}
  "auth:batch": {max_class: bulk}
`

// sendAs sends a streamed chat completion with an API key and a priority.
func sendAs(base, apiKey, priority, content string) answer {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions",
		bytes.NewReader(chatBodyWith(content, 8, true)))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	if priority != "" {
		req.Header.Set("x-smg-priority", priority)
	}
	resp, err := client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: b, err: err}
}

// checkAnswer asserts SMG's exact refusal: status, JSON body, X-SMG-Error-Code
// and the extra headers.
func checkAnswer(t *testing.T, what string, a answer, status int, body string, headers map[string]string) {
	t.Helper()
	if a.err != nil || a.status != status || string(a.body) != body || a.header.Get("Content-Type") != "application/json" {
		t.Errorf("%s: %d %v %q (err %v), want %d %s", what, a.status, a.header, a.body, a.err, status, body)
		return
	}
	for k, v := range headers {
		if got := a.header.Get(k); got != v {
			t.Errorf("%s: header %s = %q, want %q", what, k, got, v)
		}
	}
}

// The priority scheduler end to end (smg launch + smg sim): a bulk request
// that the engine is still prefilling is preempted by an interactive one and
// its client receives nothing but SMG's 503 (no byte of the stream); the
// batch tenant cannot raise its class with the header (its "system" request
// queues as bulk, preempts nobody and times out with 408); a full queue is
// 429. Every refusal carries the JSON body and X-SMG-Error-Code.
func TestPrioritySchedulerEndToEnd(t *testing.T) {
	t.Parallel()
	sims := startSims(t, 1, "--prefill-tokens-per-sec", "200", "--itl-ms", "5")
	cfg := filepath.Join(t.TempDir(), "scheduler.yaml")
	if err := os.WriteFile(cfg, []byte(schedulerYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	base, _ := startLaunch(t, "launch-sched", sims, "--priority-scheduler-enabled",
		"--priority-scheduler-config", cfg, "--max-concurrent-requests", "1", "--disable-retries")
	admin{base: base}.waitReady(t, sims...)
	long := strings.Repeat("a long document to summarise ", 80) // ~600 tokens: ~3 s of prefill

	// 1. Preemption before the first byte.
	bulk := make(chan answer, 1)
	go func() { bulk <- sendAs(base, "sk-batch-team", "bulk", long) }()
	waitFor(t, 10*time.Second, "the bulk request to reach the engine", func() (bool, string) {
		st := getSimStats(t, sims[0], false)
		return st.Running+st.Waiting == 1, "engine idle"
	})
	chatAnswer := sendAs(base, "sk-chat-app", "interactive", "hi")
	if err := chatAnswer.completeStream(); err != nil {
		t.Fatalf("interactive request: %v", err)
	}
	checkAnswer(t, "preempted bulk request", <-bulk, http.StatusServiceUnavailable,
		`{"error":{"type":"server_error","code":"scheduler_preempted","message":"Preempted by a higher-priority request before the first byte; retry","param":null}}`,
		map[string]string{"X-SMG-Error-Code": "scheduler_preempted", "X-SMG-Preempted": "true", "Retry-After": "1"})

	// 2. A default request holds the slot while the engine prefills it; the
	// batch tenant's "system" request is clamped to bulk: it cannot preempt
	// and times out in the bulk queue; another default request finds the
	// default queue full.
	held := make(chan answer, 1)
	go func() { held <- sendAs(base, "", "", long) }()
	waitFor(t, 10*time.Second, "the default request to reach the engine", func() (bool, string) {
		st := getSimStats(t, sims[0], false)
		return st.Running+st.Waiting == 1, "engine idle"
	})
	checkAnswer(t, "batch tenant asking for system", sendAs(base, "sk-batch-team", "system", "hi"), http.StatusRequestTimeout,
		`{"error":{"type":"invalid_request_error","code":"scheduler_queue_timeout","message":"Timed out waiting in the bulk queue","param":null}}`,
		map[string]string{"X-SMG-Error-Code": "scheduler_queue_timeout", "Retry-After": "1"})
	checkAnswer(t, "second default request", sendAs(base, "", "default", "hi"), http.StatusTooManyRequests,
		`{"error":{"type":"rate_limit_error","code":"scheduler_queue_full","message":"Too many requests: the default queue is full","param":null}}`,
		map[string]string{"X-SMG-Error-Code": "scheduler_queue_full", "Retry-After": "1"})
	if err := (<-held).completeStream(); err != nil {
		t.Fatalf("the default request was disturbed by the clamped one: %v", err)
	}

	m, err := scrape(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"smg_scheduler_preemption_total", []string{"victim_class", "bulk", "by_class", "interactive"}, 1},
		{"smg_scheduler_clamp_total", []string{"tenant", "auth:batch", "requested_class", "system", "effective_class", "bulk"}, 1},
		{"smg_scheduler_admit_total", []string{"class", "bulk", "outcome", "rejected_queue_timeout"}, 1},
		{"smg_scheduler_admit_total", []string{"class", "default", "outcome", "rejected_queue_full"}, 1},
		{"smg_scheduler_admit_total", []string{"class", "system"}, 0},
	} {
		if got := metricSum(m, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}
