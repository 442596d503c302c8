package router

import (
	"bufio"
	"context"
	"fmt"
	"github.com/smg-project/smg/router/admission"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// safety bounds a wait that only fails a broken test; nothing sleeps on it.
const safety = 10 * time.Second

func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(safety):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// SSE passes through event by event: the client reads each event before the
// engine writes the next one. An HTTP stream forms no pile (the spec counts
// streaming gRPC generations only), but each event is progress.
func TestSSEPassesThroughEventByEvent(t *testing.T) {
	h := newHarness(t, nil)
	next := make(chan struct{})
	e := newEngine(t, "sse", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			fmt.Fprintf(w, "data: {\"token\":%d}\n\n", i)
			w.(http.Flusher).Flush()
			select {
			case <-next:
			case <-r.Context().Done():
				return
			}
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	h.apply(e.worker())
	req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"`+testModel+`","stream":true,"messages":[]}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	rd := bufio.NewReader(resp.Body)
	for i := range 3 {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("data: {\"token\":%d}\n", i); line != want {
			t.Fatalf("event %d: %q, want %q", i, line, want)
		}
		if _, err := rd.ReadString('\n'); err != nil { // blank line closing the event
			t.Fatal(err)
		}
		if obs := observation(h.r, "sse"); obs.StreamsInFlight != 0 || obs.LastProgress.IsZero() {
			t.Fatalf("pile = %d, last progress %v while streaming over HTTP, want no pile and progress", obs.StreamsInFlight, obs.LastProgress)
		}
		next <- struct{}{} // the engine writes the next event only now
	}
	rest, _ := io.ReadAll(rd)
	if string(rest) != "data: [DONE]\n\n" {
		t.Fatalf("tail %q", rest)
	}
}

// A client that disconnects cancels the upstream request.
func TestClientDisconnectCancelsUpstream(t *testing.T) {
	h := newHarness(t, nil)
	canceled := make(chan struct{})
	e := newEngine(t, "slow", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		close(canceled)
	})
	h.apply(e.worker())
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/v1/completions",
		strings.NewReader(`{"model":"`+testModel+`","stream":true,"prompt":"hi"}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(resp.Body).ReadString('\n')
	if line != "data: first\n" {
		t.Fatalf("first event %q", line)
	}
	cancel()
	resp.Body.Close()
	waitFor(t, canceled, "the upstream request to be canceled")
	if e.hits.Load() != 1 {
		t.Fatalf("engine hit %d times, want 1 (no retry after a client left)", e.hits.Load())
	}
}

// Retries happen only before the first byte reaches the client.
func TestRetriesOnlyBeforeFirstByte(t *testing.T) {
	t.Run("5xx before any byte is retried elsewhere", func(t *testing.T) {
		h := newHarness(t, func(o *Options) { o.Policy = PolicyRoundRobin })
		bad := newEngine(t, "bad", func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusBadGateway)
		})
		good := newEngine(t, "good", nil)
		h.apply(bad.worker(), good.worker())
		for range 4 {
			if a := h.post(testModel, "", "x"); a.status != http.StatusOK || a.servedBy() != "good" {
				t.Fatalf("got %d from %q", a.status, a.servedBy())
			}
		}
		if testutil.ToFloat64(h.r.metrics.retries) != float64(bad.hits.Load()) || bad.hits.Load() == 0 {
			t.Fatalf("retries %v, bad hits %d", testutil.ToFloat64(h.r.metrics.retries), bad.hits.Load())
		}
	})
	t.Run("connection refused is retried and reported", func(t *testing.T) {
		h := newHarness(t, func(o *Options) { o.Policy = PolicyRoundRobin })
		dead := newEngine(t, "dead", nil)
		dead.srv.Close()
		good := newEngine(t, "good", nil)
		h.apply(dead.worker(), good.worker())
		for range 4 {
			if a := h.post(testModel, "", "x"); a.status != http.StatusOK || a.servedBy() != "good" {
				t.Fatalf("got %d from %q", a.status, a.servedBy())
			}
		}
		obs := observation(h.r, "dead")
		if obs.ConnectionFailures == 0 {
			t.Fatal("refused connections not reported as connection failures")
		}
		if observation(h.r, "dead").ConnectionFailures != 0 {
			t.Fatal("connection failures not reset by Observations")
		}
	})
	t.Run("a stream broken after its first byte is not retried", func(t *testing.T) {
		h := newHarness(t, nil)
		e := newEngine(t, "breaks", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: one\n\n")
			w.(http.Flusher).Flush()
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close() // reset mid-stream
			}
		})
		h.apply(e.worker())
		req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/chat/completions",
			strings.NewReader(`{"model":"`+testModel+`","stream":true,"messages":[]}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil {
			t.Fatalf("a broken upstream stream ended cleanly for the client: %q", body)
		}
		if !strings.HasPrefix(string(body), "data: one\n\n") || !strings.Contains(string(body), `data: {"error":{"type":"server_error","code":"upstream_error"`) {
			t.Fatalf("client got %q, want the first event then an explicit error event", body)
		}
		if e.hits.Load() != 1 || testutil.ToFloat64(h.r.metrics.retries) != 0 {
			t.Fatalf("hits %d retries %v: retried after the first byte", e.hits.Load(), testutil.ToFloat64(h.r.metrics.retries))
		}
		if observation(h.r, "breaks").ConnectionFailures != 1 {
			t.Fatal("a mid-stream reset is a connection failure")
		}
	})
	t.Run("--disable-retries forwards the first failure", func(t *testing.T) {
		h := newHarness(t, func(o *Options) { o.DisableRetries = true; o.Policy = PolicyRoundRobin })
		bad := newEngine(t, "bad", func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusServiceUnavailable)
		})
		good := newEngine(t, "good", nil)
		h.apply(bad.worker(), good.worker())
		statuses := map[int]int{}
		for range 4 {
			statuses[h.post(testModel, "", "x").status]++
		}
		if statuses[http.StatusServiceUnavailable] != 2 || statuses[http.StatusOK] != 2 {
			t.Fatalf("statuses %v, want 2 x 503 and 2 x 200", statuses)
		}
	})
}

func observation(r *Router, id string) WorkerObservation {
	for _, w := range r.Observations().Workers {
		if w.WorkerID == id {
			return w
		}
	}
	return WorkerObservation{}
}

// Deadlines and 5xx answers are not connection failures: they never arm the
// unreachable veto.
func TestUpstreamErrorClassification(t *testing.T) {
	// The router classifies with internal/netfail like the agent and the
	// control plane: a name that does not resolve or a host or network
	// that is down is a connection failure here too.
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&net.OpError{Op: "dial", Err: fmt.Errorf("x")}, "connection"},
		{&net.OpError{Op: "dial", Err: &net.DNSError{Err: "no such host", Name: "gone.invalid", IsNotFound: true}}, "connection"},
		{&net.OpError{Op: "read", Err: &os.SyscallError{Syscall: "read", Err: syscall.EHOSTDOWN}}, "connection"},
		{&net.OpError{Op: "read", Err: &os.SyscallError{Syscall: "read", Err: syscall.ENETDOWN}}, "connection"},
		{context.DeadlineExceeded, "timeout"},
		{context.Canceled, "other"},
	} {
		if got := classifyUpstreamError(tc.err); got != tc.want {
			t.Errorf("%v: %s, want %s", tc.err, got, tc.want)
		}
	}
	if got := classifyUpstreamError(io.ErrUnexpectedEOF); got != "connection" {
		t.Errorf("unexpected EOF: %s", got)
	}

	h := newHarness(t, func(o *Options) { o.RequestTimeoutSecs = 1; o.DisableRetries = true })
	fail := newEngine(t, "fail", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(500) })
	h.apply(fail.worker())
	h.post(testModel, "", "x")
	if obs := observation(h.r, "fail"); obs.ConnectionFailures != 0 {
		t.Fatal("a 5xx answer counted as a connection failure")
	}
}

// breakerHarness is a router with a breaker of threshold 3 failures, 2
// successes and timeoutSecs on the returned clock, sending to one engine
// that answers 500 while failing is set (it starts set).
func breakerHarness(t *testing.T, name string, timeoutSecs int) (*harness, *engine, *atomic.Bool, *fakeClock) {
	failing := &atomic.Bool{}
	failing.Store(true)
	clock := newFakeClock()
	h := newHarness(t, func(o *Options) {
		clock.opts(o)
		o.DisableRetries = true
		o.CBFailureThreshold = 3
		o.CBSuccessThreshold = 2
		o.CBTimeoutDurationSecs = timeoutSecs
	})
	e := newEngine(t, name, func(w http.ResponseWriter, _ *http.Request) {
		if failing.Load() {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	return h, e, failing, clock
}

// Circuit breaker: opens after --cb-failure-threshold failures, half-opens
// after its timeout, closes after --cb-success-threshold successes, and any
// contact the control plane reports closes it at once.
func TestCircuitBreaker(t *testing.T) {
	h, e, failing, clock := breakerHarness(t, "flaky", 30)
	h.apply(e.worker())
	for range 3 {
		if a := h.post(testModel, "", "x"); a.status != http.StatusInternalServerError {
			t.Fatalf("got %d", a.status)
		}
	}
	if a := h.post(testModel, "", "x"); a.errorCode() != CodeNoAvailableWorkers {
		t.Fatalf("open breaker: got %d %s, want no_available_workers", a.status, a.body)
	}
	if e.hits.Load() != 3 {
		t.Fatalf("open breaker let a request through (%d hits)", e.hits.Load())
	}

	// Control plane contact closes it at once.
	h.r.ContactSeen("flaky")
	failing.Store(false)
	if a := h.post(testModel, "", "x"); a.status != http.StatusOK {
		t.Fatalf("after ContactSeen got %d %s", a.status, a.body)
	}

	// Trip again, then let the timeout pass: half-open lets requests through.
	failing.Store(true)
	for range 3 {
		h.post(testModel, "", "x")
	}
	if a := h.post(testModel, "", "x"); a.errorCode() != CodeNoAvailableWorkers {
		t.Fatal("breaker did not reopen")
	}
	clock.advance(29 * time.Second)
	if a := h.post(testModel, "", "x"); a.errorCode() != CodeNoAvailableWorkers {
		t.Fatal("breaker half-opened before its timeout")
	}
	clock.advance(time.Second)
	failing.Store(false)
	for range 2 {
		if a := h.post(testModel, "", "x"); a.status != http.StatusOK {
			t.Fatalf("half-open: got %d", a.status)
		}
	}
	v := h.r.view.Load()
	if st := v.states[v.index("flaky")].breaker.state.Load(); st != breakerClosed {
		t.Fatalf("breaker state %d after the success threshold, want closed", st)
	}
	if testutil.ToFloat64(h.r.metrics.breakers.WithLabelValues("open")) != 2 {
		t.Fatal("want two open transitions counted")
	}
}

// A fresh load report (the engine answered the control plane's poll since
// the breaker opened: a restart faster than the unreachable rule) half-opens
// the breaker at once instead of after its timeout: successes close it, and
// one failure reopens it for a whole timeout. A snapshot with the same
// report is no evidence.
func TestBreakerHalfOpensOnFreshReport(t *testing.T) {
	h, e, failing, clock := breakerHarness(t, "restarted", 60)
	w := e.worker()
	w.LoadRevision = 1
	h.apply(w)
	shut := func(when string) {
		t.Helper()
		if a := h.post(testModel, "", "x"); a.errorCode() != CodeNoAvailableWorkers {
			t.Fatalf("%s: got %d %s, want the breaker open (no_available_workers)", when, a.status, a.body)
		}
	}
	trip := func() {
		t.Helper()
		for range 3 {
			h.post(testModel, "", "x")
		}
		shut("after the failure threshold")
	}
	trip()
	h.apply(w)
	shut("the same report again")

	w.LoadRevision = 2
	h.apply(w)
	failing.Store(false)
	for range 2 {
		if a := h.post(testModel, "", "x"); a.status != http.StatusOK {
			t.Fatalf("after a fresh report: got %d %s, want the request through", a.status, a.body)
		}
	}
	v := h.r.view.Load()
	if st := v.states[v.index("restarted")].breaker.state.Load(); st != breakerClosed {
		t.Fatalf("breaker state %d after the success threshold, want closed", st)
	}

	// A report while the worker still fails for this router: one request
	// goes through, its failure reopens the breaker for a whole timeout.
	failing.Store(true)
	trip()
	w.LoadRevision = 3
	h.apply(w)
	hits := e.hits.Load()
	if a := h.post(testModel, "", "x"); a.status != http.StatusInternalServerError {
		t.Fatalf("half-open: got %d, want the request through to the failing worker", a.status)
	}
	shut("a half-open failure")
	clock.advance(59 * time.Second)
	shut("before the timeout after the half-open failure")
	if got := e.hits.Load() - hits; got != 1 {
		t.Fatalf("%d requests reached the failing worker after the report, want 1", got)
	}
	if got := testutil.ToFloat64(h.r.metrics.breakers.WithLabelValues("half_open")); got != 2 {
		t.Fatalf("%v half-open transitions counted, want 2", got)
	}
}

// A failure while half-open reopens the breaker for another timeout.
func TestBreakerHalfOpenFailureReopens(t *testing.T) {
	cfg := &breakerConfig{failureThreshold: 2, successThreshold: 2, timeout: 10}
	var b breaker
	b.failure(cfg, 0)
	if !b.failure(cfg, 1) || b.allow(cfg, 5) {
		t.Fatal("want open after two failures")
	}
	if !b.allow(cfg, 11) {
		t.Fatal("want half-open after the timeout")
	}
	if !b.failure(cfg, 12) || b.allow(cfg, 15) {
		t.Fatal("a half-open failure must reopen")
	}
	if b.success(cfg, 23) || !b.success(cfg, 24) {
		t.Fatal("two successes after the timeout must close it")
	}
}

// Fresh reports about a worker that keeps failing this router cut the
// breaker's timeout short less and less often: 1 s after the first cut, then
// 2 s, 4 s..., until the gap reaches the timeout; a close starts over.
func TestBreakerEvidenceCutsBackOff(t *testing.T) {
	const s = int64(1e9)
	cfg := &breakerConfig{failureThreshold: 1, successThreshold: 1, timeout: 60 * s}
	var b breaker
	b.failure(cfg, 0)
	cutAt := func(now int64) bool {
		cut := b.evidence(cfg, now)
		if cut && !b.allow(cfg, now) {
			t.Fatalf("cut at %v s but not allowed", float64(now)/1e9)
		}
		return cut
	}
	now := int64(0)
	for i, gap := range []int64{0, 1, 2, 4, 8, 16, 32} {
		now += gap * s
		if gap > 0 && cutAt(now-s/10) {
			t.Fatalf("cut %d came %v s after the last, before its gap of %d s", i, float64(gap*s-s/10)/1e9, gap)
		}
		if !cutAt(now) {
			t.Fatalf("cut %d (%d s after the last) refused", i, gap)
		}
		if !b.failure(cfg, now) {
			t.Fatalf("the half-open failure after cut %d did not reopen", i)
		}
	}
	// The gap has reached the timeout: evidence no longer cuts it short.
	if cutAt(now + 59*s) {
		t.Fatal("a cut 59 s after the last, with the gap at the 60 s timeout")
	}
	if !b.allow(cfg, now+60*s) || !b.success(cfg, now+60*s) {
		t.Fatal("want half-open after the timeout and a close")
	}
	b.failure(cfg, now+61*s)
	if !cutAt(now + 62*s) {
		t.Fatal("after a close the first cut comes at once")
	}
}

// Admission: a full queue answers 429 admission_queue_full with Retry-After.
func TestAdmissionQueueFull(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.MaxConcurrentRequests = 1; o.QueueSize = 0 })
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	e := newEngine(t, "w", func(w http.ResponseWriter, _ *http.Request) {
		entered <- struct{}{}
		<-release
	})
	h.apply(e.worker())
	done := make(chan answer)
	go func() { done <- h.post(testModel, "", "first") }()
	waitFor(t, entered, "the first request to hold the only slot")
	a := h.post(testModel, "", "second")
	close(release)
	<-done
	if a.status != http.StatusTooManyRequests || a.errorCode() != CodeAdmissionQueueFull ||
		a.header.Get("Retry-After") == "" || a.header.Get(ErrorCodeHeader) != CodeAdmissionQueueFull {
		t.Fatalf("got %d %v %s", a.status, a.header, a.body)
	}
}

// Request errors: bad JSON, oversized body, unknown model, unknown route.
func TestRequestErrors(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.MaxPayloadSize = 64 })
	e := newEngine(t, "w", nil)
	h.apply(e.worker())
	cases := []struct {
		name, path, body string
		status           int
		code             string
	}{
		{"bad json", "/v1/chat/completions", `{"model":`, 400, CodeInvalidJSON},
		{"not an object", "/v1/completions", `[1,2]`, 400, CodeInvalidJSON},
		{"null", "/v1/chat/completions", ` null `, 400, CodeInvalidJSON},
		{"string", "/generate", `"x"`, 400, CodeInvalidJSON},
		{"too large", "/v1/completions", `{"prompt":"` + strings.Repeat("x", 100) + `"}`, 413, CodePayloadTooLarge},
		{"unknown model", "/v1/embeddings", `{"model":"nope","input":"x"}`, 404, CodeModelNotFound},
	}
	for _, c := range cases {
		a := h.send(c.path, c.body, "")
		if a.status != c.status || a.errorCode() != c.code || a.header.Get(ErrorCodeHeader) != c.code {
			t.Errorf("%s: got %d %s, want %d %s", c.name, a.status, a.body, c.status, c.code)
		}
	}
	if a := h.get("/v1/nothing"); a.status != 404 || a.errorCode() != CodeNotFound {
		t.Errorf("unknown route: %d %s", a.status, a.body)
	}
	if a := h.get("/v1/chat/completions"); a.status != 405 || a.errorCode() != CodeMethodNotAllowed || a.header.Get("Allow") != "POST" {
		t.Errorf("GET on a POST route: %d %s Allow=%q", a.status, a.body, a.header.Get("Allow"))
	}
	if a := h.send("/loads", `{}`, ""); a.status != 405 || a.header.Get("Allow") != "GET, HEAD" {
		t.Errorf("POST on /loads: %d %s Allow=%q", a.status, a.body, a.header.Get("Allow"))
	}
	if e.hits.Load() != 0 {
		t.Fatal("a rejected request reached the worker")
	}
}

// Every proxied route reaches the worker at the same path; a body without a
// model goes to any worker.
func TestRoutesForwardPathAndBody(t *testing.T) {
	h := newHarness(t, nil)
	var gotPath, gotBody atomic.Value
	e := newEngine(t, "w", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		gotPath.Store(r.URL.Path)
		gotBody.Store(string(b))
	})
	h.apply(e.worker())
	for _, path := range []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/generate"} {
		body := `{"text":"hello","sampling_params":{"max_new_tokens":4}}`
		if a := h.send(path, body, ""); a.status != http.StatusOK {
			t.Fatalf("%s: %d %s", path, a.status, a.body)
		}
		if gotPath.Load() != path || gotBody.Load() != body {
			t.Fatalf("%s forwarded as %v with %v", path, gotPath.Load(), gotBody.Load())
		}
	}
}

// /readyz turns ready with the first snapshot; /health always answers.
func TestReadyzAndHealth(t *testing.T) {
	h := newHarness(t, nil)
	if a := h.get("/readyz"); a.status != http.StatusServiceUnavailable {
		t.Fatalf("/readyz before Apply: %d", a.status)
	}
	if a := h.get("/health"); a.status != http.StatusOK {
		t.Fatalf("/health: %d", a.status)
	}
	if a := h.post(testModel, "", "x"); a.status != http.StatusServiceUnavailable || a.errorCode() != CodeNoAvailableWorkers {
		t.Fatalf("request before any snapshot: %d %s", a.status, a.body)
	}
	h.apply()
	if a := h.get("/readyz"); a.status != http.StatusOK {
		t.Fatalf("/readyz after Apply: %d", a.status)
	}
}

// /v1/models and /loads come from the snapshot; /metrics shows the spec's
// counters with every stage pre-created at 0.
func TestModelsLoadsMetrics(t *testing.T) {
	h := newHarness(t, nil)
	a, b := newEngine(t, "a", nil), newEngine(t, "b", nil)
	wb := b.worker(vetoed(VetoWedged), waiting(4))
	wb.Model = "other-model"
	wb.VetoReason = "no progress for 3s"
	h.apply(a.worker(), wb)
	models := h.get("/v1/models").body
	for _, m := range []string{testModel, "other-model"} {
		if !strings.Contains(models, `"id":"`+m+`"`) {
			t.Fatalf("/v1/models lacks %s: %s", m, models)
		}
	}
	loads := h.get("/loads").body
	for _, s := range []string{`"worker_id":"b"`, `"veto":"wedged"`, `"waiting":4`, `"veto_reason":"no progress for 3s"`} {
		if !strings.Contains(loads, s) {
			t.Fatalf("/loads lacks %s: %s", s, loads)
		}
	}
	metrics := h.get("/metrics").body
	for _, name := range []string{"smg_worker_overload_fallback_total", "smg_worker_liveness_fallback_total",
		"smg_worker_overload_shed_total"} {
		for _, stage := range stages {
			if line := fmt.Sprintf("%s{stage=%q} 0", name, stage); !strings.Contains(metrics, line) {
				t.Fatalf("/metrics lacks %s", line)
			}
		}
	}
}

// Load-aware policies add this router's dispatches since the last report to
// the reported load; a new report resets that count.
func TestLoadAwareCountsDispatchesSinceReport(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.Policy = PolicyLeastLoad })
	a, b := newEngine(t, "a", nil), newEngine(t, "b", nil)
	h.apply(a.worker(waiting(3)), b.worker())
	for i := range 3 {
		if got := h.post(testModel, "", "x").servedBy(); got != "b" {
			t.Fatalf("request %d went to %s, want b until its dispatches reach a's reported load", i, got)
		}
	}
	// b now counts 3 dispatches; a new report for b (0 waiting) resets them.
	wb := b.worker()
	wb.LoadRevision = 1
	wa := a.worker(waiting(1))
	h.apply(wa, wb)
	if got := h.post(testModel, "", "x").servedBy(); got != "b" {
		t.Fatalf("after b's new report the request went to %s, want b", got)
	}
	// Same report revision: the count carries across snapshots.
	h.apply(wa, wb)
	v := h.r.view.Load()
	if d := v.states[v.index("b")].dispatched.Load(); d != 1 {
		t.Fatalf("dispatches since report = %d, want 1", d)
	}
}

func TestDrainAndStopEndEveryRequestExplicitly(t *testing.T) {
	h := newHarness(t, nil)
	release := make(chan struct{})
	e := newEngine(t, "slow", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		<-release // a stream that outlives the shutdown grace
	})
	t.Cleanup(func() { close(release) })
	h.apply(e.worker())

	req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"`+testModel+`","stream":true,"messages":[]}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first := make([]byte, len("data: one\n\n"))
	if _, err := io.ReadFull(resp.Body, first); err != nil {
		t.Fatal(err)
	}

	h.r.Drain()
	ready, err := http.Get(h.srv.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	ready.Body.Close()
	if ready.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/readyz while draining = %d, want 503", ready.StatusCode)
	}
	fresh, err := http.Post(h.srv.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"`+testModel+`","messages":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	fresh.Body.Close()
	if fresh.StatusCode != http.StatusServiceUnavailable || fresh.Header.Get(ErrorCodeHeader) != CodeShuttingDown {
		t.Fatalf("new request while draining: %d %q", fresh.StatusCode, fresh.Header.Get(ErrorCodeHeader))
	}

	h.r.Stop() // the grace is over: the stream in flight ends with an error event
	rest, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(rest), `"code":"router_shutting_down"`) {
		t.Fatalf("stream cut at shutdown without an explicit error: %q", rest)
	}
}

func TestWorkerAPIKeyIsSentAsBearerToken(t *testing.T) {
	h := newHarness(t, nil)
	got := make(chan string, 2)
	keyed := newEngine(t, "keyed", func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("Authorization")
		_, _ = io.WriteString(w, `{}`)
	})
	h.apply(keyed.worker(func(w *Worker) { w.APIKey = "engine-secret" }))
	req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"`+testModel+`","messages":[]}`))
	req.Header.Set("Authorization", "Bearer client-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if a := <-got; a != "Bearer engine-secret" {
		t.Fatalf("engine saw Authorization %q, want the worker's api_key", a)
	}
}

// Served on the router's Listener (as smg serves it), a request waiting on
// its worker ends with an explicit router_shutting_down at Stop too: it
// inherits Stop from its server's base context.
func TestStopEndsRequestsServedOnTheListener(t *testing.T) {
	for _, server := range []string{HTTPServerLean, HTTPServerNet} {
		t.Run(server, func(t *testing.T) {
			arrived, release := make(chan struct{}, 1), make(chan struct{})
			e := newEngine(t, "silent", func(w http.ResponseWriter, r *http.Request) {
				arrived <- struct{}{}
				select {
				case <-release:
				case <-r.Context().Done():
				}
			})
			t.Cleanup(func() { close(release) })
			r, addr := listeningRouter(t, server, nil, e.worker())
			go func() { <-arrived; r.Drain(); r.Stop() }()
			resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json",
				strings.NewReader(`{"model":"`+testModel+`","messages":[]}`))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get(ErrorCodeHeader) != CodeShuttingDown {
				t.Fatalf("request in flight at Stop: %d %q", resp.StatusCode, resp.Header.Get(ErrorCodeHeader))
			}
		})
	}
}

// listeningRouter is a router on --http-server server, serving workers on
// its own Listener over loopback as smg router does; it returns the address.
func listeningRouter(t *testing.T, server string, mutate func(*Options), workers ...Worker) (*Router, string) {
	t.Helper()
	opts := DefaultOptions()
	opts.HTTPServer = server
	if mutate != nil {
		mutate(&opts)
	}
	r, err := New(opts, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	r.Apply(&Snapshot{Revision: 1, Workers: workers})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := opts.Server(r.Handler())
	hs := opts.Serving(srv, false)
	go func() { _ = hs.Serve(r.Listener(ln, srv)) }()
	t.Cleanup(func() { _ = hs.Close() })
	return r, ln.Addr().String()
}

// Served on the router's Listener, a stream in flight at Stop ends with the
// explicit router_shutting_down error event: Stop ends its context through
// the server's base context, and the router tells that from the client
// leaving by the cause. A request waiting for admission gets the same answer.
func TestStopEndsStreamsServedOnTheListener(t *testing.T) {
	for _, server := range []string{HTTPServerLean, HTTPServerNet} {
		t.Run(server, func(t *testing.T) {
			release := make(chan struct{})
			e := newEngine(t, "streaming", func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = io.WriteString(w, "data: one\n\n")
				w.(http.Flusher).Flush()
				select {
				case <-release:
				case <-r.Context().Done():
				}
			})
			t.Cleanup(func() { close(release) })
			r, addr := listeningRouter(t, server, func(o *Options) {
				o.MaxConcurrentRequests, o.RateLimitTokensPerSecond, o.QueueSize = 1, 0.01, 4
			}, e.worker())
			url := "http://" + addr + "/v1/chat/completions"
			resp, err := http.Post(url, "application/json", strings.NewReader(`{"model":"`+testModel+`","stream":true,"messages":[]}`))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			first := make([]byte, len("data: one\n\n"))
			if _, err := io.ReadFull(resp.Body, first); err != nil {
				t.Fatal(err)
			}
			queued := make(chan *http.Response, 1)
			go func() {
				resp, err := http.Post(url, "application/json", strings.NewReader(`{"model":"`+testModel+`","messages":[]}`))
				if err != nil {
					t.Error(err)
					resp = nil
				}
				queued <- resp
			}()
			for deadline := time.Now().Add(10 * time.Second); r.door.Waiting(admission.Default) < 1; {
				if time.Now().After(deadline) {
					t.Fatal("the second request never queued for admission")
				}
				time.Sleep(5 * time.Millisecond)
			}
			r.Drain()
			r.Stop()
			rest, _ := io.ReadAll(resp.Body)
			if !strings.Contains(string(rest), `"code":"router_shutting_down"`) {
				t.Fatalf("stream cut at Stop without an explicit error: %q", rest)
			}
			if q := <-queued; q == nil {
				return
			} else if q.Body.Close(); q.StatusCode != http.StatusServiceUnavailable || q.Header.Get(ErrorCodeHeader) != CodeShuttingDown {
				t.Fatalf("request waiting for admission at Stop: %d %q", q.StatusCode, q.Header.Get(ErrorCodeHeader))
			}
		})
	}
}

// On both servers a request is bounded by --request-timeout-secs (504
// upstream_error, the timeout kind) and an engine's request is cut when its
// client leaves: behind the lean server with no context of the request's
// own, through the upstream connection's deadline and the server's hook.
func TestRequestTimeoutAndClientLeavingCutTheEngine(t *testing.T) {
	for _, server := range []string{HTTPServerLean, HTTPServerNet} {
		t.Run(server, func(t *testing.T) {
			arrived, cut := make(chan struct{}, 2), make(chan struct{}, 2)
			e := newEngine(t, "silent", func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body) // net/http watches for the close once the body is read
				arrived <- struct{}{}
				<-r.Context().Done() // the router closed the connection
				cut <- struct{}{}
			})
			r, addr := listeningRouter(t, server, func(o *Options) { o.RequestTimeoutSecs = 1; o.DisableRetries = true }, e.worker())
			url := "http://" + addr + "/v1/chat/completions"
			body := `{"model":"` + testModel + `","messages":[]}`
			began := time.Now()
			resp, err := http.Post(url, "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusGatewayTimeout || resp.Header.Get(ErrorCodeHeader) != CodeUpstreamError ||
				!strings.Contains(string(b), "context deadline exceeded") {
				t.Fatalf("past --request-timeout-secs: %d %q %s", resp.StatusCode, resp.Header.Get(ErrorCodeHeader), b)
			}
			if d := time.Since(began); d < time.Second || d > 5*time.Second {
				t.Fatalf("answered after %v, want the 1 s timeout", d)
			}
			<-arrived
			<-cut
			if got := testutil.ToFloat64(r.metrics.upstream.WithLabelValues("timeout")); got != 1 {
				t.Fatalf("upstream errors of kind timeout: %v, want 1", got)
			}

			// A client that leaves while the engine holds its request.
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			<-arrived
			c.Close()
			select {
			case <-cut:
			case <-time.After(900 * time.Millisecond): // well before the request's own timeout
				t.Fatal("the engine's request outlived its client")
			}
		})
	}
}
