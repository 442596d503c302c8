package router

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/smg-project/smg/router/admission"
	"github.com/smg-project/smg/router/ttft"
)

// objectiveEngine prefills at 10000 tokens/s on the router's fake clock
// (its prompt plus *ahead), and holds a prompt containing "hold" until
// release is closed.
func objectiveEngine(t *testing.T, name string, clk *fakeClock, ahead *atomic.Int64, release <-chan struct{}) *engine {
	return newEngine(t, name, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var body struct{ Prompt string }
		_ = json.Unmarshal(b, &body)
		if strings.Contains(body.Prompt, "hold") {
			<-release
		}
		clk.advance(time.Duration((float64(len(body.Prompt)+2)/4 + float64(ahead.Load())) / 10000 * float64(time.Second)))
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ok":true}`)
	})
}

func withAhead(n int64) func(*Worker) { return func(w *Worker) { w.PromptTokensAhead = n } }

// warm sends 1000-token requests until every worker has a measured rate
// (10000 tokens/s).
func warm(t *testing.T, h *harness, workers ...Worker) {
	t.Helper()
	h.apply(workers...)
	v := h.r.view.Load()
	for range 100 {
		if a := h.send("/v1/completions", completion(1000, false), ""); a.status != http.StatusOK {
			t.Fatalf("warm-up: %d %s", a.status, a.body)
		}
		done := true
		for _, w := range workers {
			if _, s := v.states[v.index(w.ID)].ttft.Rate(); s != 0 {
				done = false
			}
		}
		if done {
			return
		}
	}
	t.Fatal("warm-up: a worker got no request")
}

// oneWarmEngine is a router with a TTFT objective of secs on one warm
// objectiveEngine, and the engine's work ahead unknown to the router.
func oneWarmEngine(t *testing.T, secs float64) (*fakeClock, *harness, *atomic.Int64, *engine) {
	clk := newFakeClock()
	h := newHarness(t, func(o *Options) { clk.opts(o); o.TTFTObjectiveSecs = secs })
	ahead := new(atomic.Int64)
	a := objectiveEngine(t, "a", clk, ahead, nil)
	warm(t, h, a.worker())
	return clk, h, ahead, a
}

// With an objective, a request goes only to a worker predicted to meet it,
// whatever the policy prefers.
func TestObjectiveSendsOnlyToAWorkerThatMeetsIt(t *testing.T) {
	clk := newFakeClock()
	h := newHarness(t, func(o *Options) { clk.opts(o); o.Policy = PolicyRoundRobin; o.TTFTObjectiveSecs = 0.5 })
	var ahead atomic.Int64
	a, b := objectiveEngine(t, "a", clk, &ahead, nil), objectiveEngine(t, "b", clk, &ahead, nil)
	warm(t, h, a.worker(), b.worker())
	// 20000 tokens ahead on a: 2 s predicted; b has none: 0.1 s.
	h.apply(a.worker(withAhead(20000)), b.worker())
	for range 4 {
		if got := h.send("/v1/completions", completion(1000, false), ""); got.status != http.StatusOK || got.servedBy() != "b" {
			t.Fatalf("answer %d from %q, want 200 from b (the only one meeting 0.5 s)", got.status, got.servedBy())
		}
	}
}

// When no worker is predicted to meet the objective and waiting cannot
// help, the request is refused at once with its own code and a Retry-After
// from the prediction, counted by class; the engine never sees it.
func TestObjectiveRefusesAtOnceWithRetryAfterFromThePrediction(t *testing.T) {
	_, h, _, a := oneWarmEngine(t, 0.5)
	// 25000 tokens ahead + 1000 own at 10000/s: 2.6 s predicted, 2.1 s over.
	h.apply(a.worker(withAhead(25000)))
	hits := a.hits.Load()
	got := h.send("/v1/completions", completion(1000, false), "")
	if got.status != http.StatusServiceUnavailable || got.errorCode() != CodeTTFTObjective ||
		got.header.Get(ErrorCodeHeader) != CodeTTFTObjective || got.header.Get("Retry-After") != "3" {
		t.Fatalf("answer %d %v %s, want 503 %s with Retry-After 3", got.status, got.header, got.body, CodeTTFTObjective)
	}
	if !strings.Contains(got.body, "default objective (0.5 s)") {
		t.Errorf("the refusal does not name the class and its objective: %s", got.body)
	}
	if a.hits.Load() != hits {
		t.Error("a refused request reached the engine")
	}
	if n := testutil.ToFloat64(h.r.om.refused[admission.Default]); n != 1 {
		t.Errorf("smg_ttft_objective_refused_total{class=default} = %v, want 1", n)
	}
	// The work ahead drains: admitted again.
	h.apply(a.worker(withAhead(1000)))
	if got := h.send("/v1/completions", completion(1000, false), ""); got.status != http.StatusOK {
		t.Fatalf("after the work drained: %d %s", got.status, got.body)
	}
}

// With running windows, a request whose only worker that would meet the
// objective is full waits for its room, at most until the objective could
// no longer be met (the configured wait, 30 s, is longer); then it is
// refused with the objective's answer, not the window's shed.
func TestObjectiveWaitsForARoomOnlyWhileItCouldBeMet(t *testing.T) {
	clk := newFakeClock()
	h := newHarness(t, func(o *Options) {
		clk.opts(o)
		windowsOn(PolicyRoundRobin)(o)
		o.WorkerAdmissionWaitSecs = 30 // the objective, shorter, bounds the wait
		o.TTFTObjectiveSecs = 0.4
	})
	var ahead atomic.Int64
	release := make(chan struct{})
	openRelease := gateOpen(t, release)
	a := objectiveEngine(t, "a", clk, &ahead, release)
	warm(t, h, a.worker(rooms(1)))
	hold := fmt.Sprintf(`{"model":%q,"prompt":"hold"}`, testModel)

	// Admitted after a wait: the held request ends while the next waits.
	first := make(chan answer, 1)
	go func() { first <- h.send("/v1/completions", hold, "") }()
	waitUntil(t, func() bool { return h.inFlight("a") == 1 })
	second := make(chan answer, 1)
	go func() { second <- h.send("/v1/completions", completion(1000, false), "") }()
	waitUntil(t, func() bool { return h.waiters() == 1 })
	openRelease()
	if got := <-second; got.status != http.StatusOK {
		t.Fatalf("the waiting request: %d %s", got.status, got.body)
	}
	<-first
	if n := testutil.ToFloat64(h.r.om.waits[admission.Default]); n != 1 {
		t.Errorf("smg_ttft_objective_waits_total{class=default} = %v, want 1", n)
	}

	// Refused after at most the objective: the room never frees in time.
	release2 := make(chan struct{})
	open2 := gateOpen(t, release2)
	b := objectiveEngine(t, "b", clk, &ahead, release2)
	warm(t, h, b.worker(rooms(1)))
	h.apply(b.worker(rooms(1)))
	go func() { first <- h.send("/v1/completions", hold, "") }()
	waitUntil(t, func() bool { return h.inFlight("b") == 1 })
	began := time.Now()
	got := h.send("/v1/completions", completion(1000, false), "")
	waited := time.Since(began)
	open2()
	<-first
	if got.status != http.StatusServiceUnavailable || got.errorCode() != CodeTTFTObjective || got.header.Get("Retry-After") != "1" {
		t.Fatalf("answer %d %v %s, want 503 %s, Retry-After 1", got.status, got.header, got.body, CodeTTFTObjective)
	}
	// 0.4 s objective, 0.1 s predicted: it waited about 0.3 s, never past 0.4 s.
	if waited < 250*time.Millisecond || waited > 2*time.Second {
		t.Errorf("waited %v, want about 0.3 s", waited)
	}
}

// oneRoomHeld is a router with running windows, an objective of secs and
// a room wait of wait seconds, on one warm objectiveEngine with one room,
// held by a request (answered on first once openRelease is called).
func oneRoomHeld(t *testing.T, secs, wait float64) (h *harness, a *engine, openRelease func(), first <-chan answer) {
	t.Helper()
	clk := newFakeClock()
	h = newHarness(t, func(o *Options) {
		clk.opts(o)
		windowsOn(PolicyRoundRobin)(o)
		o.WorkerAdmissionWaitSecs = wait
		o.TTFTObjectiveSecs = secs
	})
	release := make(chan struct{})
	openRelease = gateOpen(t, release)
	a = objectiveEngine(t, "a", clk, new(atomic.Int64), release)
	warm(t, h, a.worker(rooms(1)))
	held := make(chan answer, 1)
	go func() { held <- h.send("/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":"hold"}`, testModel), "") }()
	waitUntil(t, func() bool { return h.inFlight("a") == 1 })
	return h, a, openRelease, held
}

// The configured --worker-admission-wait-secs bounds the objective's wait
// too: with 0 a request whose only worker that meets the objective is full
// is refused at once with the objective's answer (it never waits, so a room
// freeing within its objective does not admit it); with a wait shorter than
// the objective's bound it is refused at the end of that wait.
func TestObjectiveWaitIsBoundedByTheConfiguredWait(t *testing.T) {
	for _, tc := range []struct {
		name     string
		wait     float64
		min, max time.Duration // real time the refused request took
	}{
		{"wait 0 answers at once", 0, 0, time.Second},
		{"a shorter wait ends it", 0.15, 100 * time.Millisecond, 1500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// 0.1 s predicted: the objective alone would wait 2.9 s.
			h, _, openRelease, first := oneRoomHeld(t, 3, tc.wait)
			// A room frees as soon as the request waits: under the
			// objective's bound alone it would be admitted.
			second := make(chan answer, 1)
			began := time.Now()
			go func() { second <- h.send("/v1/completions", completion(1000, false), "") }()
			var got answer
			waitUntil(t, func() bool {
				if tc.wait == 0 && h.waiters() > 0 {
					openRelease()
				}
				select {
				case got = <-second:
					return true
				default:
					return false
				}
			})
			took := time.Since(began)
			openRelease()
			<-first
			if got.status != http.StatusServiceUnavailable || got.errorCode() != CodeTTFTObjective || got.header.Get("Retry-After") == "" {
				t.Fatalf("answer %d %v %s, want 503 %s with Retry-After", got.status, got.header, got.body, CodeTTFTObjective)
			}
			if took < tc.min || took > tc.max {
				t.Errorf("refused after %v, want within [%v, %v]", took, tc.min, tc.max)
			}
			if n := testutil.ToFloat64(h.r.om.refused[admission.Default]); n != 1 {
				t.Errorf("smg_ttft_objective_refused_total{class=default} = %v, want 1", n)
			}
		})
	}
}

// A waiting request is re-evaluated as the prediction moves: once the
// worker it waits for is reported with so much work ahead that it could no
// longer meet the objective, the request is refused at that report, not at
// the end of the wait the objective first allowed (2.9 s here).
func TestObjectiveWaiterIsRefusedOnceThePredictionSaysItCannotBeMet(t *testing.T) {
	h, a, openRelease, first := oneRoomHeld(t, 3, 30)
	second := make(chan answer, 1)
	began := time.Now()
	go func() { second <- h.send("/v1/completions", completion(1000, false), "") }()
	waitUntil(t, func() bool { return h.waiters() == 1 })
	h.apply(a.worker(rooms(1), withAhead(50000))) // 5 s ahead: past the objective
	got := <-second
	took := time.Since(began)
	openRelease()
	<-first
	if got.status != http.StatusServiceUnavailable || got.errorCode() != CodeTTFTObjective {
		t.Fatalf("answer %d %v %s, want 503 %s", got.status, got.header, got.body, CodeTTFTObjective)
	}
	if took > 1500*time.Millisecond {
		t.Errorf("refused after %v, want at the report (well before the 2.9 s wait)", took)
	}
}

// A request that would wait for a room is refused at once instead when, at
// the pace rooms went to waiters lately, its room is not expected before its
// objective could no longer be met: a refusal comes now, not at the end of
// a wait that would most likely fail.
func TestObjectiveRefusesAtOnceWhenNoRoomIsExpectedInTime(t *testing.T) {
	clk := newFakeClock()
	h := newHarness(t, func(o *Options) {
		clk.opts(o)
		windowsOn(PolicyRoundRobin)(o)
		o.TTFTObjectiveSecs = 0.4
	})
	var release atomic.Pointer[chan struct{}]
	ch := make(chan struct{})
	release.Store(&ch)
	a := newEngine(t, "a", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if strings.Contains(string(b), "hold") {
			<-*release.Load()
		}
		clk.advance(time.Duration(float64(len(b)) / 4 / 10000 * float64(time.Second)))
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ok":true}`)
	})
	warm(t, h, a.worker(rooms(1)))
	hold := fmt.Sprintf(`{"model":%q,"prompt":"hold"}`, testModel)
	waited := func() uint64 {
		m := &dto.Metric{}
		_ = h.r.wm.wait.(prometheus.Histogram).Write(m)
		return m.GetHistogram().GetSampleCount()
	}
	// Rooms go to waiters every 50 ms (the router's clock): a newcomer's
	// room is all but sure within 4.5 gaps (225 ms), inside what the
	// objective leaves to wait; each waiter waits and is admitted.
	for i := range 5 {
		first := make(chan answer, 1)
		go func() { first <- h.send("/v1/completions", hold, "") }()
		waitUntil(t, func() bool { return h.inFlight("a") == 1 })
		second := make(chan answer, 1)
		go func() { second <- h.send("/v1/completions", completion(100, false), "") }()
		waitUntil(t, func() bool { return h.waiters() == 1 })
		clk.advance(50 * time.Millisecond)
		close(*release.Load())
		if got := <-second; got.status != http.StatusOK {
			t.Fatalf("waiter %d: %d %s", i, got.status, got.body)
		}
		<-first
		ch := make(chan struct{})
		release.Store(&ch)
	}
	// Now no room has gone to a waiter for a second: the next is expected
	// no sooner, past what the objective leaves to wait (0.4 s less the
	// prediction). Refused at once: it never entered the wait.
	first := make(chan answer, 1)
	go func() { first <- h.send("/v1/completions", hold, "") }()
	waitUntil(t, func() bool { return h.inFlight("a") == 1 })
	clk.advance(time.Second)
	before := waited()
	got := h.send("/v1/completions", completion(100, false), "")
	close(*release.Load())
	<-first
	if got.status != http.StatusServiceUnavailable || got.errorCode() != CodeTTFTObjective || got.header.Get("Retry-After") == "" {
		t.Fatalf("answer %d %v %s, want 503 %s with Retry-After", got.status, got.header, got.body, CodeTTFTObjective)
	}
	if n := waited(); n != before {
		t.Errorf("the refused request waited for a room (%d waits recorded, want %d)", n, before)
	}
}

// A margin grown on late first tokens refuses every request, and a refused
// request measures nothing: the margin decays while none is measured, so
// the gate admits again once the lateness could have passed.
func TestObjectiveMarginDecaysSoTheGateAdmitsAgain(t *testing.T) {
	clk, h, ahead, _ := oneWarmEngine(t, 0.5)
	// Every third first token comes 1.5 s late (work the router never heard
	// of): the rate stays the median's, the margin grows to 1.5 s.
	for i := range 8 {
		ahead.Store(0)
		if i%3 == 0 {
			ahead.Store(15000)
		}
		if got := h.send("/v1/completions", completion(1000, false), ""); got.status != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, got.status, got.body)
		}
	}
	ahead.Store(0)
	refused := func() bool {
		got := h.send("/v1/completions", completion(1000, false), "")
		if got.status != http.StatusOK && got.errorCode() != CodeTTFTObjective {
			t.Fatalf("answer %d %s, want 200 or %s", got.status, got.body, CodeTTFTObjective)
		}
		return got.status != http.StatusOK
	}
	if !refused() {
		t.Fatal("admitted with a 1.5 s margin on a 0.5 s objective")
	}
	clk.advance(ttft.MarginGrace)
	if !refused() {
		t.Fatal("admitted within the margin's grace")
	}
	// Three half-lives later the margin is 1.5 s / 8: 0.1 s + 0.19 s meets 0.5 s.
	clk.advance(3 * ttft.MarginHalfLife)
	if refused() {
		t.Fatal("still refused after the margin decayed")
	}
}

// A worker with no first token measured yet meets an objective only with
// nothing ahead of the request there: the first request alone teaches the
// rate, the next is refused at once (Retry-After 1) instead of going in
// blind, and once the rate is known the prediction decides.
func TestObjectiveWorkerWithoutARateTakesOneRequestAtATime(t *testing.T) {
	clk := newFakeClock()
	h := newHarness(t, func(o *Options) { clk.opts(o); windowsOn(PolicyRoundRobin)(o); o.TTFTObjectiveSecs = 0.5 })
	var ahead atomic.Int64
	release := make(chan struct{})
	openRelease := gateOpen(t, release)
	a := objectiveEngine(t, "a", clk, &ahead, release)
	h.apply(a.worker(rooms(4)))
	first := make(chan answer, 1)
	go func() { first <- h.send("/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":"hold"}`, testModel), "") }()
	waitUntil(t, func() bool { return h.inFlight("a") == 1 })
	got := h.send("/v1/completions", completion(100, false), "")
	if got.status != http.StatusServiceUnavailable || got.errorCode() != CodeTTFTObjective || got.header.Get("Retry-After") != "1" {
		t.Fatalf("second request while the first teaches the rate: %d %v %s, want 503 %s, Retry-After 1",
			got.status, got.header, got.body, CodeTTFTObjective)
	}
	openRelease()
	if got := <-first; got.status != http.StatusOK {
		t.Fatalf("the first request: %d %s", got.status, got.body)
	}
	if got := h.send("/v1/completions", completion(100, false), ""); got.status != http.StatusOK {
		t.Fatalf("once the rate is known: %d %s", got.status, got.body)
	}
}

// A bad --ttft-objective-secs is an ERROR naming the problem and the
// fallback; the router starts and admits by the running window alone.
func TestObjectiveBadFlagIsLoggedAndOff(t *testing.T) {
	for _, v := range []float64{-1, 1e6, 0.0001} {
		var buf bytes.Buffer
		opts := DefaultOptions()
		opts.TTFTObjectiveSecs = v
		r, err := New(opts, slog.New(slog.NewTextHandler(&buf, nil)), prometheus.NewRegistry())
		if err != nil {
			t.Fatalf("--ttft-objective-secs %v failed the start: %v", v, err)
		}
		if log := buf.String(); !strings.Contains(log, "level=ERROR") || !strings.Contains(log, "--ttft-objective-secs must be") ||
			!strings.Contains(log, "fallback=") {
			t.Errorf("--ttft-objective-secs %v logged %q, want an ERROR naming the problem and the fallback", v, log)
		}
		if r.objectives != [admission.NumClasses]time.Duration{} {
			t.Errorf("--ttft-objective-secs %v left objectives %v, want none", v, r.objectives)
		}
	}
}

// Work ahead no engine could hold (a lying router or agent: more than
// ttft.MaxAhead of prefill at the measured rate) is not believed: the
// request fails open to the running window instead of being refused,
// counted as implausible, and teaches the rate nothing.
func TestObjectiveFailsOpenOnImplausibleWorkAhead(t *testing.T) {
	_, h, _, a := oneWarmEngine(t, 0.5)
	rate := loadsOf(t, h)["a"].PrefillTokensPerSec
	failed := testutil.ToFloat64(h.r.ttm.failOpen[ttft.Implausible])
	h.apply(a.worker(withAhead(1 << 40)))
	if got := h.send("/v1/completions", completion(1000, false), ""); got.status != http.StatusOK {
		t.Fatalf("with 2^40 tokens ahead: %d %s, want 200 (fail open)", got.status, got.body)
	}
	if n := testutil.ToFloat64(h.r.ttm.failOpen[ttft.Implausible]) - failed; n != 1 {
		t.Errorf("fail-open implausible count rose by %v, want 1", n)
	}
	if l := loadsOf(t, h)["a"]; l.TTFTPredictor != "implausible" || l.PrefillTokensPerSec != rate {
		t.Errorf("after it: predictor %s, rate %v; want implausible and the rate unchanged (%v)", l.TTFTPredictor, l.PrefillTokensPerSec, rate)
	}
	// The count drops back: predicted again.
	h.apply(a.worker(withAhead(1000)))
	if l := loadsOf(t, h)["a"]; l.TTFTPredictor != "ok" {
		t.Errorf("with 1000 tokens ahead: predictor %s, want ok", l.TTFTPredictor)
	}
}
