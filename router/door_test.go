package router

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/smg-project/smg/internal/testutil"

	"github.com/smg-project/smg/router/admission"
)

func running(n int64) func(*Worker) { return func(w *Worker) { w.Running = n } }

// least_load's waiting cap: a worker whose reported waiting plus this
// router's dispatches since that report reaches the cap is skipped, even
// when its load is the lowest; when every worker is capped, least load wins.
func TestLeastLoadWaitingCap(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.Policy = PolicyLeastLoad; o.LeastLoadWaitingCap = 4 })
	a, b := newEngine(t, "a", nil), newEngine(t, "b", nil)
	h.apply(a.worker(waiting(3)), b.worker(running(20)))
	if got := h.post(testModel, "", "x").servedBy(); got != "a" {
		t.Fatalf("first request went to %s, want a (least loaded, waiting 3 under the cap 4)", got)
	}
	for i := range 4 {
		if got := h.post(testModel, "", "x").servedBy(); got != "b" {
			t.Fatalf("request %d went to %s, want b: a's waiting 3 + 1 dispatch reached the cap", i, got)
		}
	}
	// b's 4 dispatches since its report reach the cap too: every worker is
	// capped, and the least loaded (a: 4 against b: 24) is taken.
	if got := h.post(testModel, "", "x").servedBy(); got != "a" {
		t.Fatalf("every worker capped: went to %s, want the least loaded (a)", got)
	}
	// Without the cap, a takes requests until its load reaches b's.
	h2 := newHarness(t, func(o *Options) { o.Policy = PolicyLeastLoad })
	h2.apply(a.worker(waiting(3)), b.worker(running(20)))
	for i := range 5 {
		if got := h2.post(testModel, "", "x").servedBy(); got != "a" {
			t.Fatalf("no cap: request %d went to %s, want a", i, got)
		}
	}
}

// schedHarness is a router with the priority scheduler on, a capacity of
// capacity slots and the YAML doc as its configuration.
func schedHarness(t *testing.T, capacity int, doc string, mutate func(*Options)) (*harness, *lockedBuffer) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "scheduler.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	opts := DefaultOptions()
	opts.DisableRetries = true
	opts.MaxConcurrentRequests = capacity
	opts.PrioritySchedulerEnabled = true
	opts.PrioritySchedulerConfig = path
	if mutate != nil {
		mutate(&opts)
	}
	reg := prometheus.NewRegistry()
	r, err := New(opts, slog.New(slog.NewTextHandler(logs, nil)), reg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(r.Handler())
	t.Cleanup(srv.Close)
	return &harness{t: t, r: r, reg: reg, srv: srv}, logs
}

// lockedBuffer is a log sink safe for concurrent writers.
type lockedBuffer = testutil.SyncBuffer

// metricValue reads one series from the harness's registry (0 if absent).
func (h *harness) metricValue(name string, labels map[string]string) float64 {
	h.t.Helper()
	mfs, err := h.reg.Gather()
	if err != nil {
		h.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				return m.GetCounter().GetValue()
			case m.Gauge != nil:
				return m.GetGauge().GetValue()
			case m.Histogram != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return 0
}

// noReservations keeps tests small: SMG's default reservations (160 slots)
// do not fit a capacity of a few.
const noReservations = `
classes:
  system: {reserved: 0}
  interactive: {reserved: 0, queue_timeout_secs: 0.2}
  default: {queue_size: 0}
api_keys:
  sk-batch: batch
  sk-chat: chat
tenant_policies:
  "auth:chat": {max_class: interactive}
  "auth:batch": {max_class: bulk}
`

func (h *harness) sendAs(key, priority, prompt string) answer {
	h.t.Helper()
	req, err := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/chat/completions",
		strings.NewReader(fmt.Sprintf(`{"model":%q,"stream":true,"messages":[{"role":"user","content":%q}]}`, testModel, prompt)))
	if err != nil {
		h.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if priority != "" {
		req.Header.Set("x-smg-priority", priority)
	}
	return do(h.t, req)
}

// A bulk request still waiting for its engine's first byte is preempted by
// an interactive one: its client gets only SMG's preemption answer (even
// though the engine had sent its headers) and its upstream request is
// cancelled; the interactive request is served.
func TestPreemptionBeforeFirstByte(t *testing.T) {
	h, _ := schedHarness(t, 1, noReservations, nil)
	upstreamCancelled := make(chan struct{})
	entered := make(chan string, 2)
	e := newEngine(t, "w", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), "bulk-job") {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush() // headers out, like an engine that queues the request
			entered <- "bulk"
			<-r.Context().Done()
			close(upstreamCancelled)
			return
		}
		entered <- "chat"
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"ok\":true}\n\ndata: [DONE]\n\n")
	})
	h.apply(e.worker())
	bulk := make(chan answer, 1)
	go func() { bulk <- h.sendAs("sk-batch", "bulk", "bulk-job") }()
	if got := <-entered; got != "bulk" {
		t.Fatalf("engine saw %s first", got)
	}
	chat := h.sendAs("sk-chat", "interactive", "chat")
	if chat.status != http.StatusOK || chat.servedBy() != "w" {
		t.Fatalf("interactive: %d %s", chat.status, chat.body)
	}
	b := <-bulk
	if b.status != http.StatusServiceUnavailable || b.errorCode() != CodeSchedulerPreempted ||
		b.header.Get(ErrorCodeHeader) != CodeSchedulerPreempted || b.header.Get("X-SMG-Preempted") != "true" ||
		b.header.Get("Retry-After") != "1" || b.servedBy() != "" {
		t.Fatalf("preempted answer: %d %v %s", b.status, b.header, b.body)
	}
	want := `{"error":{"type":"server_error","code":"scheduler_preempted","message":"Preempted by a higher-priority request before the first byte; retry","param":null}}`
	if b.body != want {
		t.Fatalf("preempted body %s, want %s", b.body, want)
	}
	waitFor(t, upstreamCancelled, "the preempted upstream request to be cancelled")
	if v := h.metricValue("smg_scheduler_preemption_total", map[string]string{"victim_class": "bulk", "by_class": "interactive"}); v != 1 {
		t.Fatalf("smg_scheduler_preemption_total = %v, want 1", v)
	}
	if v := h.metricValue("smg_scheduler_admit_total", map[string]string{"class": "bulk", "outcome": "preempted"}); v != 1 {
		t.Fatalf("admit_total{bulk,preempted} = %v, want 1", v)
	}
}

// A request that has sent a byte is never preempted: the interactive request
// waits in its queue and times out with 408 scheduler_queue_timeout; a full
// default queue answers 429 scheduler_queue_full. Both carry the JSON body
// and X-SMG-Error-Code.
func TestStartedRequestKeepsItsSlot(t *testing.T) {
	h, _ := schedHarness(t, 1, noReservations, nil)
	release := make(chan struct{})
	e := newEngine(t, "w", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"first\":true}\n\n")
		w.(http.Flusher).Flush()
		<-release
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	})
	h.apply(e.worker())
	bulk := make(chan answer, 1)
	go func() { bulk <- h.sendAs("sk-batch", "bulk", "bulk-job") }()
	// The router stamps progress right after the first chunk passed the
	// ticket's first-byte check.
	waitUntil(t, func() bool { return h.r.view.Load().states[0].lastProgress.Load() != 0 })
	chat := h.sendAs("sk-chat", "interactive", "chat")
	if chat.status != http.StatusRequestTimeout || chat.errorCode() != CodeSchedulerQueueTimeout ||
		chat.header.Get(ErrorCodeHeader) != CodeSchedulerQueueTimeout {
		t.Fatalf("interactive behind a started request: %d %v %s", chat.status, chat.header, chat.body)
	}
	full := h.sendAs("", "", "anonymous default request")
	if full.status != http.StatusTooManyRequests || full.errorCode() != CodeSchedulerQueueFull ||
		full.header.Get(ErrorCodeHeader) != CodeSchedulerQueueFull || !strings.Contains(full.body, `"type":"rate_limit_error"`) {
		t.Fatalf("full default queue: %d %v %s", full.status, full.header, full.body)
	}
	close(release)
	if b := <-bulk; b.status != http.StatusOK || !strings.Contains(b.body, "[DONE]") {
		t.Fatalf("the started bulk request was not served whole: %d %s", b.status, b.body)
	}
}

// The tenant comes from the API key; the header cannot raise a class above
// the tenant's ceiling (counted), and an unknown value is default (counted).
func TestTenantClampAndUnknownPriority(t *testing.T) {
	h, _ := schedHarness(t, 4, noReservations, nil)
	h.apply(newEngine(t, "w", nil).worker())
	h.sendAs("sk-batch", "system", "x")
	h.sendAs("sk-chat", "urgent!", "x")
	h.sendAs("", "interactive", "x") // no API key: the default ceiling (default)
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"smg_scheduler_clamp_total", map[string]string{"tenant": "auth:batch", "requested_class": "system", "effective_class": "bulk"}, 1},
		{"smg_scheduler_clamp_total", map[string]string{"tenant": "ip:127.0.0.1", "requested_class": "interactive", "effective_class": "default"}, 1},
		{"smg_scheduler_unknown_priority_value_total", map[string]string{"tenant": "auth:chat"}, 1},
		{"smg_scheduler_admit_total", map[string]string{"class": "bulk", "outcome": "admitted"}, 1},
		{"smg_scheduler_admit_total", map[string]string{"class": "default", "outcome": "admitted"}, 2},
		{"smg_scheduler_admit_total", map[string]string{"class": "system", "outcome": "admitted"}, 0},
	} {
		if v := h.metricValue(c.name, c.labels); v != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, v, c.want)
		}
	}
}

// A bad configuration never fails the start: an ERROR names the problem and
// the fallback, and the rate limiting path admits instead.
func TestSchedulerFailSafe(t *testing.T) {
	for name, c := range map[string]struct{ doc, problem string }{
		"bad yaml":          {"classes: [", "scheduler config"},
		"unknown class":     {"classes:\n  gold: {reserved: 1}\n", "classes.gold: unknown class"},
		"over capacity":     {"classes:\n  system: {reserved: 4}\n", "reservations over capacity"},
		"default over cap.": {"", "reservations over capacity: the classes reserve 160 slots"},
	} {
		t.Run(name, func(t *testing.T) {
			h, logs := schedHarness(t, 2, c.doc, nil)
			out := logs.String()
			_, limiter := h.r.door.(*admission.Limiter)
			if h.r.sched != nil || !limiter || !strings.Contains(out, "level=ERROR") ||
				!strings.Contains(out, c.problem) || !strings.Contains(out, "rate limiting path") {
				t.Fatalf("sched=%v door=%T log: %s", h.r.sched, h.r.door, out)
			}
			h.apply(newEngine(t, "w", nil).worker())
			if a := h.post(testModel, "", "x"); a.status != http.StatusOK {
				t.Fatalf("fallback path: %d %s", a.status, a.body)
			}
		})
	}
}

// heldStreamEngines are streaming engines, one per name, that count the
// requests reaching them (hits) and answer none until release is called
// (at cleanup at the latest, before the engines close).
func heldStreamEngines(t *testing.T, names ...string) (hits *atomic.Int64, release func(), engines []*engine) {
	hits = new(atomic.Int64)
	gate := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	handler := func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		hits.Add(1)
		<-gate
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}
	for _, name := range names {
		engines = append(engines, newEngine(t, name, handler))
	}
	t.Cleanup(release) // registered after the engines: runs before they close
	return hits, release, engines
}

// With running windows on, the scheduler's capacity is the sum of this
// router's shares, live: a snapshot that grants more admits waiters, and the
// requests waiting in the scheduler are reported by class as window demand
// so the allocator can grow this router's shares for them.
func TestSchedulerCapacityFromShares(t *testing.T) {
	h, _ := schedHarness(t, -1, noReservations, func(o *Options) { o.WorkerAdmissionWindow = true })
	hits, release, engines := heldStreamEngines(t, "w", "w2")
	e, e2 := engines[0], engines[1]
	share := func(n int64) func(*Worker) {
		return func(w *Worker) { w.AdmissionRooms = 4; w.WindowShare = n }
	}
	h.apply(e.worker(share(1)), e2.worker(share(1)))
	answers := make(chan answer, 3)
	for range 3 {
		go func() { answers <- h.sendAs("sk-batch", "bulk", "bulk-job") }()
	}
	waitUntil(t, func() bool {
		return h.metricValue("smg_scheduler_queue_depth", map[string]string{"class": "bulk"}) == 1 &&
			hits.Load() == 2
	})
	if v := h.metricValue("smg_scheduler_utilization", nil); v != 1 {
		t.Fatalf("utilization %v with 2 slots of 2 in flight", v)
	}
	for _, d := range h.r.Observations().Demand {
		if d.WaitingByClass[admission.Bulk] != 1 || d.Waiting != 1 || d.InFlight != 1 {
			t.Fatalf("demand %+v: want the scheduler's waiting bulk request reported by class", d)
		}
	}
	h.apply(e.worker(share(2)), e2.worker(share(1))) // the control plane grants one more room
	waitUntil(t, func() bool { return hits.Load() == 3 })
	release()
	for range 3 {
		if a := <-answers; a.status != http.StatusOK {
			t.Fatalf("bulk request: %d %s", a.status, a.body)
		}
	}
}

// The scheduler admits by model: a request whose model's rooms are all
// taken waits in the scheduler although another model's worker has a free
// room (a capacity of 2 in all), and its demand is reported on its model's
// worker only, so the allocator grows no share of the other model for it.
func TestSchedulerCapacityPerModel(t *testing.T) {
	h, _ := schedHarness(t, -1, noReservations, func(o *Options) { o.WorkerAdmissionWindow = true })
	hits, release, engines := heldStreamEngines(t, "w", "w2")
	e, other := engines[0], engines[1]
	h.apply(e.worker(func(w *Worker) { w.AdmissionRooms, w.WindowShare = 1, 1 }),
		other.worker(func(w *Worker) { w.AdmissionRooms, w.WindowShare, w.Model = 1, 1, "other-model" }))
	answers := make(chan answer, 2)
	for range 2 {
		go func() { answers <- h.sendAs("sk-batch", "bulk", "bulk-job") }()
	}
	waitUntil(t, func() bool {
		return h.metricValue("smg_scheduler_queue_depth", map[string]string{"class": "bulk"}) == 1 && hits.Load() == 1
	})
	for _, d := range h.r.Observations().Demand {
		want := int64(0)
		if d.WorkerID == e.name {
			want = 1
		}
		if d.WaitingByClass[admission.Bulk] != want || d.Waiting != want {
			t.Fatalf("demand %+v: want the waiting request on its model's worker only", d)
		}
	}
	release()
	for range 2 {
		if a := <-answers; a.status != http.StatusOK {
			t.Fatalf("request: %d %s", a.status, a.body)
		}
	}
	if hits.Load() != 2 {
		t.Fatalf("%d requests reached the engines, want 2", hits.Load())
	}
}

// In --retry-after-mode estimated a scheduler refusal says when a retry would
// be admitted: the interval before any completion is seen, then (queued
// ahead + 1) / completion rate, from the router's own completions.
func TestSchedulerRefusalCarriesEstimate(t *testing.T) {
	now := time.Unix(10000, 0)
	h, _ := schedHarness(t, 1, noReservations, func(o *Options) {
		o.RetryAfterMode = RetryAfterEstimated
		o.LoadMonitorInterval = 10
		o.Now = func() time.Time { return now }
	})
	release := make(chan struct{})
	e := newEngine(t, "w", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		<-release
	})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	h.apply(e.worker())
	held := make(chan answer, 1)
	go func() { held <- h.sendAs("", "", "hold the only slot") }()
	waitUntil(t, func() bool { return e.hits.Load() == 1 })
	if a := h.sendAs("", "", "x"); a.status != http.StatusTooManyRequests || a.header.Get("Retry-After") != "10" {
		t.Fatalf("no completion seen: %d Retry-After %q, want 429 with the interval", a.status, a.header.Get("Retry-After"))
	}
	for range 100 { // 0.5 completions per second on the meter's 10 s time constant
		now = now.Add(2 * time.Second)
		h.r.completions.add(now)
	}
	if a := h.sendAs("", "", "x"); a.status != http.StatusTooManyRequests || a.header.Get("Retry-After") != "2" {
		t.Fatalf("at ~0.5 completions/s with nobody queued: %d Retry-After %q, want 2", a.status, a.header.Get("Retry-After"))
	}
	once.Do(func() { close(release) })
	<-held
}

// With running windows the reservations meet a capacity only once shares
// arrive: SMG's default ones (160 slots) over a router's shares are scaled
// down and warned about once, since scaled to fit they leave the default
// class next to nothing; reservations that fit say nothing.
func TestSchedulerWarnsReservationsOverShares(t *testing.T) {
	const warning = "reservations exceed this router's capacity"
	share := func(n int64) func(*Worker) {
		return func(w *Worker) { w.AdmissionRooms = 8; w.WindowShare = n }
	}
	fleet := func(o *Options) { o.WorkerAdmissionWindow = true }
	h, logs := schedHarness(t, -1, "", fleet)
	e := newEngine(t, "w", nil)
	h.apply(e.worker(share(3)))
	h.apply(e.worker(share(4)))
	if out := logs.String(); strings.Count(out, warning) != 1 || !strings.Contains(out, "level=WARN") ||
		!strings.Contains(out, "reserved=160 capacity=3") {
		t.Fatalf("want one warning naming 160 reserved over capacity 3, log: %s", out)
	}
	h, logs = schedHarness(t, -1, noReservations, fleet)
	h.apply(newEngine(t, "w", nil).worker(share(3)))
	if out := logs.String(); strings.Contains(out, warning) {
		t.Fatalf("reservations that fit warned: %s", out)
	}
}

// least_load with --least-load-prefill-first: the prompt tokens waiting for
// prefill on a worker rank before its load, the other routers' (as the
// control plane sent them) and this router's own in flight alike; without
// the flag the load alone decides.
func TestLeastLoadPrefillFirst(t *testing.T) {
	ahead := func(n int64) func(*Worker) { return func(w *Worker) { w.PromptTokensAhead = n } }
	a, b := newEngine(t, "a", nil), newEngine(t, "b", nil)
	plain := newHarness(t, func(o *Options) { o.Policy = PolicyLeastLoad })
	plain.apply(a.worker(running(1), ahead(1500)), b.worker(running(5)))
	if got := plain.post(testModel, "", "x").servedBy(); got != "a" {
		t.Fatalf("without the flag: went to %s, want a (running 1 against 5)", got)
	}

	h := newHarness(t, func(o *Options) { o.Policy = PolicyLeastLoad; o.LeastLoadPrefillFirst = true })
	h.apply(a.worker(running(1), ahead(1500)), b.worker(running(5)))
	for i := range 3 {
		if got := h.post(testModel, "", "x").servedBy(); got != "b" {
			t.Fatalf("request %d went to %s, want b: 1500 prompt tokens wait for prefill on a, none on b", i, got)
		}
	}

	// This router's own prompt in flight on c (no first byte yet) ranks it
	// behind d, though d runs more.
	release := make(chan struct{})
	started := make(chan struct{})
	c := newEngine(t, "c", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		close(started)
		<-release
		fmt.Fprint(w, `{"worker":"c"}`)
	})
	d := newEngine(t, "d", nil)
	h2 := newHarness(t, func(o *Options) { o.Policy = PolicyLeastLoad; o.LeastLoadPrefillFirst = true })
	h2.apply(c.worker(running(1)), d.worker(running(2)))
	done := make(chan string)
	go func() { done <- h2.post(testModel, "", strings.Repeat("a long prompt ", 100)).servedBy() }()
	<-started
	if got := h2.post(testModel, "", "x").servedBy(); got != "d" {
		t.Fatalf("with a prompt of this router in flight on c: went to %s, want d", got)
	}
	close(release)
	if got := <-done; got != "c" {
		t.Fatalf("the first request went to %s, want c (running 1 against 2)", got)
	}
}
