package router

import (
	"io"
	"net/http"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// holdingEngine answers only when release is closed.
func holdingEngine(t *testing.T, name string, release <-chan struct{}) *engine {
	return newEngine(t, name, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		<-release
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ok":true}`)
	})
}

// gateOpen closes release once, also at cleanup (registered last, so it runs
// before the servers close): a failing test never hangs on a held answer.
func gateOpen(t *testing.T, release chan struct{}) func() {
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	t.Cleanup(open)
	return open
}

func rooms(n int64) func(*Worker) { return func(w *Worker) { w.AdmissionRooms = n } }

func windowsOn(policy string) func(*Options) {
	return func(o *Options) { o.Policy, o.WorkerAdmissionWindow = policy, true }
}

// inFlight is the rooms held on worker id.
func (h *harness) inFlight(id string) int64 {
	v := h.r.view.Load()
	return v.states[v.index(id)].gate.InFlight()
}

func (h *harness) waiters() int64 { return h.r.waitlistFor(waitlistKey{false, testModel}).Waiters() }

// TestWindowEveryPolicyChoosesAWorkerWithRoom: with one room per worker and
// the same prompt and key (so hash and affinity policies want the same
// worker twice), the second request goes to the worker that has room.
func TestWindowEveryPolicyChoosesAWorkerWithRoom(t *testing.T) {
	for _, policy := range Policies {
		t.Run(policy, func(t *testing.T) {
			release := make(chan struct{})
			a, b := holdingEngine(t, "a", release), holdingEngine(t, "b", release)
			h := newHarness(t, windowsOn(policy))
			openRelease := gateOpen(t, release)
			h.apply(a.worker(rooms(1)), b.worker(rooms(1)))
			done := make(chan answer, 2)
			go func() { done <- h.post(testModel, "k", "the same prompt") }()
			waitUntil(t, func() bool { return a.hits.Load()+b.hits.Load() == 1 })
			go func() { done <- h.post(testModel, "k", "the same prompt") }()
			waitUntil(t, func() bool { return a.hits.Load()+b.hits.Load() == 2 || h.waiters() > 0 })
			if a.hits.Load() != 1 || b.hits.Load() != 1 {
				t.Fatalf("hits a=%d b=%d, want one each: a full worker is skipped", a.hits.Load(), b.hits.Load())
			}
			openRelease()
			for range 2 {
				if got := <-done; got.status != http.StatusOK {
					t.Fatalf("answer %d %s", got.status, got.body)
				}
			}
			if h.inFlight("a")+h.inFlight("b") != 0 {
				t.Fatal("rooms not given back after the answers")
			}
		})
	}
}

// TestWindowFullWorkerIsNotVetoed: the only non-vetoed worker is full and the
// other is overloaded, with --worker-overload-shed: the request neither sheds
// nor steers to the overloaded worker; it waits and is dispatched the moment
// the room frees.
func TestWindowFullWorkerIsNotVetoed(t *testing.T) {
	release := make(chan struct{})
	a := holdingEngine(t, "a", release)
	b := newEngine(t, "b", nil)
	h := newHarness(t, func(o *Options) {
		windowsOn(PolicyRoundRobin)(o)
		o.WorkerOverloadShed = true
	})
	openRelease := gateOpen(t, release)
	h.apply(a.worker(rooms(1)), b.worker(rooms(1), vetoed(VetoOverload)))
	first := make(chan answer, 1)
	go func() { first <- h.post(testModel, "", "one") }()
	waitUntil(t, func() bool { return a.hits.Load() == 1 })
	second := make(chan answer, 1)
	go func() { second <- h.post(testModel, "", "two") }()
	waitUntil(t, func() bool { return h.waiters() == 1 })
	if b.hits.Load() != 0 || h.counter("smg_worker_overload_shed_total", StageSelection) != 0 {
		t.Fatal("a full worker counted as vetoed: the request was shed or steered")
	}
	openRelease()
	for _, c := range []chan answer{first, second} {
		if got := <-c; got.status != http.StatusOK || got.servedBy() != "a" {
			t.Fatalf("answer %d from %q, want 200 from a", got.status, got.servedBy())
		}
	}
	if got := testutil.ToFloat64(h.r.wm.waits); got != 1 {
		t.Errorf("smg_worker_admission_waits_total = %v, want 1", got)
	}
	// The worker's demand went into the report: 0 held, 0 waiting now.
	obs := h.r.Observations()
	if len(obs.Demand) != 2 || obs.Demand[0].InFlight != 0 {
		t.Errorf("demand %+v, want both windowed workers reported idle", obs.Demand)
	}
}

// TestWindowNoRoomShedsWithTheSpecsAnswer: with a zero wait, a request that
// finds every window full gets the spec's shed answer at once, whatever
// --worker-overload-shed says.
func TestWindowNoRoomShedsWithTheSpecsAnswer(t *testing.T) {
	release := make(chan struct{})
	a := holdingEngine(t, "a", release)
	h := newHarness(t, func(o *Options) {
		windowsOn(PolicyCacheAware)(o)
		o.WorkerAdmissionWaitSecs = 0
	})
	openRelease := gateOpen(t, release)
	h.apply(a.worker(rooms(1)))
	first := make(chan answer, 1)
	go func() { first <- h.post(testModel, "", "one") }()
	waitUntil(t, func() bool { return a.hits.Load() == 1 })
	got := h.post(testModel, "", "two")
	openRelease()
	<-first
	want := `{"error":{"type":"server_error","code":"worker_overload_protection_shed","message":"All workers for model '` +
		testModel + `' are overloaded","param":null}}`
	if got.status != http.StatusServiceUnavailable || got.body != want || got.header.Get("Retry-After") != "10" ||
		got.header.Get(ErrorCodeHeader) != CodeShed || got.header.Get("Content-Type") != "application/json" {
		t.Fatalf("answer %d %v %s, want the spec's shed answer", got.status, got.header, got.body)
	}
	if n := h.counter("smg_worker_overload_shed_total", StageAdmissionWindow); n != 1 {
		t.Errorf("shed{stage=admission_window} = %v, want 1", n)
	}
}

// TestWindowOffIsTheSpec: without --worker-admission-window the rooms the
// control plane sends are ignored.
func TestWindowOffIsTheSpec(t *testing.T) {
	release := make(chan struct{})
	a := holdingEngine(t, "a", release)
	h := newHarness(t, nil)
	openRelease := gateOpen(t, release)
	h.apply(a.worker(rooms(1)))
	done := make(chan answer, 3)
	for range 3 {
		go func() { done <- h.post(testModel, "", "x") }()
	}
	waitUntil(t, func() bool { return a.hits.Load() == 3 })
	openRelease()
	for range 3 {
		<-done
	}
}

// TestWindowShareSurvivesLosingTheControlPlane: a router that loses the
// control plane keeps its last share (FailOpen drops vetoes only), never more.
func TestWindowShareSurvivesLosingTheControlPlane(t *testing.T) {
	a := newEngine(t, "a", nil)
	h := newHarness(t, windowsOn(PolicyRoundRobin))
	h.apply(a.worker(rooms(8), func(w *Worker) { w.WindowShare = 3 }, vetoed(VetoOverload)))
	h.r.FailOpen()
	v := h.r.view.Load()
	if got := v.states[0].gate.Limit(); got != 3 {
		t.Fatalf("limit after losing the control plane = %d, want the last share 3", got)
	}
	if v.worker(0).Veto != VetoNone {
		t.Fatal("FailOpen kept the veto")
	}
}

// TestWindowWaiterGetsAnAnswerWhenTheRouterStops: a request waiting for a
// room when the router stops ends with router_shutting_down, never silence.
func TestWindowWaiterGetsAnAnswerWhenTheRouterStops(t *testing.T) {
	release := make(chan struct{})
	a := holdingEngine(t, "a", release)
	h := newHarness(t, windowsOn(PolicyRoundRobin))
	openRelease := gateOpen(t, release)
	h.apply(a.worker(rooms(1)))
	first := make(chan answer, 1)
	go func() { first <- h.post(testModel, "", "one") }()
	waitUntil(t, func() bool { return a.hits.Load() == 1 })
	second := make(chan answer, 1)
	go func() { second <- h.post(testModel, "", "two") }()
	waitUntil(t, func() bool { return h.waiters() == 1 })
	h.r.Stop()
	got := <-second
	openRelease()
	<-first
	if got.status != http.StatusServiceUnavailable || got.errorCode() != CodeShuttingDown {
		t.Fatalf("waiter at stop: %d %s, want 503 %s", got.status, got.body, CodeShuttingDown)
	}
}
