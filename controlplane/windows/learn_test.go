package windows

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// fakeEngine is an engine that reports no window: it runs what it is sent
// up to its cap on running requests and what its KV holds, and queues the
// rest, first come first served. lie is added to the running count it
// reports.
type fakeEngine struct {
	cap       int64   // running cap (vLLM --max-num-seqs)
	kv        float64 // KV capacity, tokens
	perReq    float64 // KV tokens one request holds
	lie       int64
	inFlight  int64 // requests the router holds on it
	flood     int64 // requests sent while it has no window
	completed int64 // requests that end per report at most (how fast a lower share drains)
	// transitEvery N > 0: in N-1 reports of N, one request of those the
	// engine could run shows waiting instead (a room refilled, on its way
	// in at a scheduler step: at 2x of capacity on a busy box most reports
	// catch one).
	transitEvery int
	reports      int
}

func (e *fakeEngine) running() int64 {
	return min(e.inFlight, e.cap, int64(e.kv/e.perReq))
}

// report is the engine's load report now.
func (e *fakeEngine) report() *smgv1.EngineLoad {
	r := e.running()
	shown := r
	if e.reports++; e.transitEvery > 0 && e.reports%e.transitEvery != 0 && r > 0 {
		shown--
	}
	return &smgv1.EngineLoad{Ranks: []*smgv1.RankLoad{{RunningRequests: int32(shown + e.lie), WaitingRequests: int32(e.inFlight - shown),
		TokenUsage: float64(r) * e.perReq / e.kv}}}
}

// follow moves the router's requests in flight toward its share: up at
// once (there is always demand: 2x of capacity), down as requests end.
func (e *fakeEngine) follow(share int64, windowed bool) {
	switch {
	case !windowed:
		e.inFlight = e.flood
	case share >= e.inFlight:
		e.inFlight = share
	default:
		e.inFlight = max(share, e.inFlight-e.completed)
	}
}

// learnRig runs the allocator's loop over one regular worker w1 without a
// window and one router r1 that always has more demand than room (it
// refuses the rest: nothing waits in it), driven by a fakeEngine reporting
// every 50 ms.
type learnRig struct {
	t   *testing.T
	a   *Allocator
	reg *registry.Registry
	e   *fakeEngine
	n   int
}

func newLearnRig(t *testing.T, e *fakeEngine) *learnRig {
	a, reg := newAdmissionAllocator(t, &smgv1.WorkerSpec{Url: "http://w1"}, 0)
	a.RouterDemand("r1", reg.Revision(), nil, time.Now())
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go a.Run(ctx)
	return &learnRig{t: t, a: a, reg: reg, e: e}
}

// window is w1's admission window now.
func (g *learnRig) window() (int64, *registry.Admission) {
	w := g.reg.Snapshot().Get("w1")
	if w.Admission == nil {
		return 0, nil
	}
	return w.Admission.Window, w.Admission
}

// tick is one 50 ms report; the router reports every fifth tick.
func (g *learnRig) tick() int64 {
	w := g.reg.Snapshot().Get("w1")
	window, _ := g.window()
	g.e.follow(w.WindowShare["r1"], window > 0)
	g.a.ObserveLoad("w1", g.e.report())
	if g.n%5 == 0 {
		g.a.RouterDemand("r1", g.reg.Revision(), []*smgv1.DecodeDemand{{WorkerId: "w1", InFlight: g.e.inFlight, Waiting: 4}}, time.Now())
	}
	g.n++
	time.Sleep(50 * time.Millisecond)
	synctest.Wait()
	window, _ = g.window()
	return window
}

// run ticks for d and returns the largest window seen.
func (g *learnRig) run(d time.Duration) (highest int64) {
	for end := time.Now().Add(d); time.Now().Before(end); {
		highest = max(highest, g.tick())
	}
	return highest
}

// learnUntil ticks until w1 has a window, at most d, and returns it.
func (g *learnRig) learnUntil(d time.Duration) int64 {
	g.t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); {
		if w := g.tick(); w > 0 {
			return w
		}
	}
	g.t.Fatalf("no window learned within %s", d)
	return 0
}

// learnedRig runs a learnRig over e and checks the window first learned is
// want.
func learnedRig(t *testing.T, e *fakeEngine, want int64) *learnRig {
	t.Helper()
	g := newLearnRig(t, e)
	if w := g.learnUntil(time.Second); w != want {
		t.Fatalf("learned %d, want %d", w, want)
	}
	return g
}

// TestLearnedWindowFixedEngine: an engine capped at 8 running requests, with
// KV to spare, flooded before any window is known: its window is learned as
// exactly 8 from the first queue, within a few reports, and never goes above
// 8 afterwards (a queue with KV to spare is a cap: nothing to probe).
func TestLearnedWindowFixedEngine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newLearnRig(t, &fakeEngine{cap: 8, kv: 1e6, perReq: 100, flood: 20, completed: 1})
		start := time.Now()
		if w := g.learnUntil(time.Second); w != 8 {
			t.Fatalf("learned %d, want 8 (the running count at the first queue)", w)
		}
		if took := time.Since(start); took > 300*time.Millisecond {
			t.Fatalf("learned after %s, want within a few 50 ms reports", took)
		}
		if hi := g.run(30 * time.Second); hi != 8 {
			t.Fatalf("window reached %d after the first queue, want never above 8", hi)
		}
		_, adm := g.window()
		if adm.Source != "learned" || adm.LearnedBy != LearnedQueue || adm.Learned != 8 {
			t.Fatalf("admission %+v, want learned 8 by queue", adm)
		}
		if g.e.inFlight != 8 || g.e.running() != 8 {
			t.Fatalf("engine holds %d running %d, want exactly its 8", g.e.inFlight, g.e.running())
		}
	})
}

// TestLearnedWindowKVLimitedEngine: an engine whose KV holds 10 requests of
// the prompts it gets (cap 16) is learned at 10; when long prompts leave
// room for 4, the window follows within one report (KV full: no streak
// needed, the round runs at once); when they end it is probed back up to
// 10, never more than one room above what the engine holds.
func TestLearnedWindowKVLimitedEngine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := &fakeEngine{cap: 16, kv: 8000, perReq: 800, flood: 20, completed: 1}
		g := learnedRig(t, e, 10) // what KV holds
		if hi := g.run(10 * time.Second); hi > 11 {
			t.Fatalf("window reached %d, want at most one room above the engine's 10", hi)
		}
		e.perReq = 2000 // long prompts: KV holds 4
		w := g.tick()
		if w != 4 {
			t.Fatalf("window %d one report after KV shrank to 4 requests, want 4 at once", w)
		}
		if _, adm := g.window(); adm.LearnedBy != LearnedKV {
			t.Fatalf("admission %+v, want learned by kv", adm)
		}
		if hi := g.run(5 * time.Second); hi > 5 {
			t.Fatalf("window reached %d while KV holds 4 requests, want at most 5", hi)
		}
		e.perReq = 800 // short prompts again: room for 10
		var back time.Duration
		start := time.Now()
		for time.Since(start) < 30*time.Second {
			w := g.tick()
			if w > 11 {
				t.Fatalf("window %d growing back, want at most one room above 10", w)
			}
			if w >= 10 && back == 0 {
				back = time.Since(start)
			}
		}
		if back == 0 || back > 15*time.Second {
			t.Fatalf("window back to 10 after %s, want within 15 s of KV freeing", back)
		}
		if w, _ := g.window(); w < 10 || w > 11 {
			t.Fatalf("window %d at the end, want 10 (11 during a probe)", w)
		}
	})
}

// TestLearnedWindowRestartedEngine: an engine learned at its cap of 8 comes
// back from a failure spell with a cap of 16: its window is probed up one
// room a round (each probe the engine runs is the evidence for the next),
// found again within a few seconds, and the probe past 16 ends the search.
func TestLearnedWindowRestartedEngine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := &fakeEngine{cap: 8, kv: 1e6, perReq: 100, flood: 20, completed: 1}
		g := learnedRig(t, e, 8)
		g.run(3 * time.Second)
		e.cap = 16 // restarted with a larger window; its contact resumes
		g.contactAgain()
		found := g.findAgain(16, 30*time.Second)
		if found > 5*time.Second {
			t.Fatalf("16 found again after %s, want within 5 s (a room a round, and a second for the failed probe past it)", found)
		}
		if hi := g.run(20 * time.Second); hi != 16 {
			t.Fatalf("window reached %d once found, want no more probes past a cap", hi)
		}
	})
}

// TestLearnedWindowFastRestart: an engine learned at its cap of 8 restarts
// with a cap of 16 within one report, never seen unreachable: the new
// process start time its load carries is the contact that ends the spell,
// and the window is probed and found again.
func TestLearnedWindowFastRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := &fakeEngine{cap: 8, kv: 1e6, perReq: 100, flood: 20, completed: 1}
		g := learnedRig(t, e, 8)
		start := time.Now().Add(-time.Hour)
		g.startedAt(start)
		g.run(3 * time.Second)
		e.cap = 16
		g.startedAt(start.Add(time.Hour))
		found := g.findAgain(16, 30*time.Second)
		if found > 5*time.Second {
			t.Fatalf("16 found again after %s, want within 5 s", found)
		}
	})
}

// startedAt stores a load of w1 from an engine process started at start,
// as the control plane's evidence does with every report.
func (g *learnRig) startedAt(start time.Time) {
	g.t.Helper()
	l := g.e.report()
	l.ProcessStartTimeSeconds, l.ReportedAt = float64(start.UnixNano())/1e9, timestamppb.Now()
	if _, err := g.reg.Update(func(tx *registry.Txn) error {
		w := tx.Get("w1").Clone()
		w.Load = l
		tx.Insert(w)
		return nil
	}); err != nil {
		g.t.Fatal(err)
	}
}

// TestLearnedWindowProbeThroughStepBoundaries: an engine restarted with a
// cap of 8 whose reports mostly catch one request on its way in (running
// one below what it holds, one waiting) is still found at 8: a probe fails
// only once the engine has not run its room for probeSpan, so a run of
// reports that each catch a refilled room does not cap it below 8.
func TestLearnedWindowProbeThroughStepBoundaries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := &fakeEngine{cap: 4, kv: 1e6, perReq: 100, flood: 20, completed: 1}
		g := learnedRig(t, e, 4)
		e.cap, e.transitEvery = 8, 4
		g.contactAgain()
		found := g.findAgain(8, 30*time.Second)
		t.Logf("8 found again after %s", found)
	})
}

// contactAgain marks w1 back from a failure spell (its contact sequence
// moves, as when an unreachable worker answers again).
func (g *learnRig) contactAgain() {
	g.t.Helper()
	if _, err := g.reg.Update(func(tx *registry.Txn) error {
		w := tx.Get("w1").Clone()
		w.ContactSeq++
		tx.Insert(w)
		return nil
	}); err != nil {
		g.t.Fatal(err)
	}
}

// findAgain ticks until w1's window is want with the search ended (a failed
// probe past it: learned by queue), never more than one room above want,
// and returns how long that took.
func (g *learnRig) findAgain(want int64, within time.Duration) time.Duration {
	g.t.Helper()
	start := time.Now()
	for time.Since(start) < within {
		w := g.tick()
		if w > want+1 {
			g.t.Fatalf("window %d while finding %d, want at most one room above it", w, want)
		}
		if _, adm := g.window(); w == want && adm.LearnedBy == LearnedQueue {
			return time.Since(start)
		}
	}
	w, adm := g.window()
	g.t.Fatalf("window %d (%+v) %s after the restart, want %d found again and capped by the failed probe past it", w, adm, within, want)
	return 0
}

// TestLearnedWindowLyingEngine: an engine capped at 8 that reports 3 more
// running requests than it runs. The first queue is read at its word (11),
// but a queue that persists while the routers hold the whole window brings
// the window down to what the engine takes without queueing (8), and the
// window stays there: a running count above the window raises nothing.
func TestLearnedWindowLyingEngine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := &fakeEngine{cap: 8, kv: 1e6, perReq: 100, lie: 3, flood: 20, completed: 1}
		g := newLearnRig(t, e)
		g.learnUntil(time.Second)
		g.run(5 * time.Second)
		if w, _ := g.window(); w != 8 {
			t.Fatalf("window %d, want the 8 the engine runs without a queue", w)
		}
		if hi := g.run(30 * time.Second); hi != 8 {
			t.Fatalf("window reached %d, want it held at 8", hi)
		}
		if e.inFlight-e.running() != 0 {
			t.Fatalf("engine queues %d, want none", e.inFlight-e.running())
		}
	})
}

// TestLearnedWindowNoProbeWhileRoutersWait: a KV-limited engine with room
// again is not probed while a router holds a request waiting for a room.
func TestLearnedWindowNoProbeWhileRoutersWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := &fakeEngine{cap: 16, kv: 8000, perReq: 2000, flood: 20, completed: 1}
		g := learnedRig(t, e, 4)
		e.perReq = 800
		for range 200 { // 10 s
			w, _ := g.window()
			e.follow(g.reg.Snapshot().Get("w1").WindowShare["r1"], w > 0)
			g.a.RouterDemand("r1", g.reg.Revision(), []*smgv1.DecodeDemand{{WorkerId: "w1", InFlight: e.inFlight, Waiting: 4, Queued: 2}}, time.Now())
			g.a.ObserveLoad("w1", e.report())
			time.Sleep(50 * time.Millisecond)
			synctest.Wait()
			if w, _ := g.window(); w != 4 {
				t.Fatalf("window %d while the router has requests waiting, want no probe (4)", w)
			}
		}
	})
}

// TestLearnerTransientQueue: a queue of one below the limit with KV to
// spare (a request caught between two scheduler steps) moves nothing
// unless it lasts queueStreak reports.
func TestLearnerTransientQueue(t *testing.T) {
	now := time.Unix(0, 0)
	l := &learner{}
	for i := range queueStreak {
		lowered := l.observe(Observation{Running: 8, Waiting: 3, Usage: 0.1}, now)
		if lowered != (i == queueStreak-1) {
			t.Fatalf("report %d: lowered %v", i, lowered)
		}
		now = now.Add(queueSpan / 2)
	}
	if l.limit != 8 || !l.capped {
		t.Fatalf("limit %d capped %v, want 8 capped", l.limit, l.capped)
	}
	for range 5 {
		l.observe(Observation{Running: 7, Waiting: 1, Usage: 0.1}, now)
		l.observe(Observation{Running: 8, Waiting: 0, Usage: 0.1}, now)
	}
	if l.limit != 8 {
		t.Fatalf("limit %d after transient queues, want 8", l.limit)
	}
	if l.observe(Observation{Running: 0, Waiting: 5}, now) || l.limit != 8 {
		t.Fatalf("a queue with nothing running moved the limit to %d", l.limit)
	}
}

// TestLearnerStepBoundaryQueue: once an engine has run its whole limit with
// nothing waiting, queues below the limit with KV to spare (requests caught
// between two scheduler steps, however many reports in a row catch one, as
// at light load) never lower it; before it has, a queue that lasts does.
func TestLearnerStepBoundaryQueue(t *testing.T) {
	now := time.Unix(0, 0)
	learned := func() *learner {
		l := &learner{}
		for range queueStreak {
			l.observe(Observation{Running: 8, Waiting: 2, Usage: 0.1}, now)
			now = now.Add(queueSpan / 2)
		}
		if l.limit != 8 {
			t.Fatalf("limit %d, want 8 from the first queue", l.limit)
		}
		return l
	}
	l := learned()
	l.observe(Observation{Running: 8, Usage: 0.1}, now)
	for i := range 40 {
		if l.observe(Observation{Running: int64(3 + i%5), Waiting: 1, Usage: 0.05}, now) || l.limit != 8 {
			t.Fatalf("report %d: limit %d after step-boundary queues below a limit the engine ran, want 8", i, l.limit)
		}
	}
	l = learned() // never ran 8 without a queue: a lasting queue at 6 is a lower cap
	for range queueStreak {
		l.observe(Observation{Running: 6, Waiting: 2, Usage: 0.1}, now)
		now = now.Add(queueSpan / 2)
	}
	if l.limit != 6 {
		t.Fatalf("limit %d after a lasting queue at 6, want 6", l.limit)
	}
}

// TestLearnerQueueMustLast: reports of a queue that come back to back (an
// agent catching up after the box stalled), or whose running count is still
// rising (a burst coming in), learn nothing; the same queue lasting
// queueSpan at one running count does.
func TestLearnerQueueMustLast(t *testing.T) {
	now := time.Unix(0, 0)
	l := &learner{}
	for i := range 10 {
		l.observe(Observation{Running: 4, Waiting: 5, Usage: 0.01}, now.Add(time.Duration(i)*time.Millisecond))
	}
	if l.limit != 0 {
		t.Fatalf("limit %d from 10 reports within 10 ms, want none", l.limit)
	}
	for i := range 6 { // 2, 3, ... 7 running: the engine still admits
		now = now.Add(queueSpan / 2)
		l.observe(Observation{Running: int64(2 + i), Waiting: 3, Usage: 0.01}, now)
	}
	if l.limit != 0 {
		t.Fatalf("limit %d while the running count rose, want none", l.limit)
	}
	for range queueStreak {
		now = now.Add(queueSpan / 2)
		l.observe(Observation{Running: 8, Waiting: 3, Usage: 0.01}, now)
	}
	if l.limit != 8 || !l.capped {
		t.Fatalf("limit %d capped %v after a queue at 8 lasting %s, want 8 capped", l.limit, l.capped, queueSpan)
	}
}

// cappedAt4 is a learner that learned a cap of 4 from a lasting queue, its
// worker at contact sequence 1.
func cappedAt4(t *testing.T) (*learner, time.Time) {
	t.Helper()
	now := time.Unix(0, 0)
	l := &learner{}
	l.contactAgain(1, now)
	for range queueStreak {
		l.observe(Observation{Running: 4, Waiting: 2, Usage: 0.1}, now)
		now = now.Add(queueSpan / 2)
	}
	if l.limit != 4 || !l.capped {
		t.Fatalf("limit %d capped %v, want 4 capped", l.limit, l.capped)
	}
	return l, now
}

// TestLearnerProbesAfterContactOnFreshEvidence: an engine back from a
// failure spell is probed only on a report it made since: the last one
// before the spell (the whole window running) says nothing of the engine
// that answers now, idle or restarted.
func TestLearnerProbesAfterContactOnFreshEvidence(t *testing.T) {
	l, now := cappedAt4(t)
	l.observe(Observation{Running: 4, Usage: 0.1}, now)
	l.contactAgain(2, now)
	if l.probe(now, false) {
		t.Fatalf("probed to %d on the report from before the spell", l.limit)
	}
	l.observe(Observation{Running: 4, Usage: 0.1}, now)
	if !l.probe(now, false) || l.limit != 5 {
		t.Fatalf("limit %d after a fresh report of the whole window running, want a probe to 5", l.limit)
	}
}

// TestLearnerProbeFailsOnlyWhenItsRoomIsUsed: a probe whose room the
// routers have not filled yet (the engine holds less than the probed
// window) is neither confirmed nor failed by queues at step boundaries;
// once the engine holds the probed window and queues for probeSpan without
// running it, the probe fails and the limit is a cap.
func TestLearnerProbeFailsOnlyWhenItsRoomIsUsed(t *testing.T) {
	l, now := cappedAt4(t)
	l.contactAgain(2, now)
	l.observe(Observation{Running: 4, Usage: 0.1}, now)
	if !l.probe(now, false) || l.limit != 5 {
		t.Fatalf("limit %d, want a probe to 5", l.limit)
	}
	for range 60 { // 3 s holding 4 of the 5 rooms
		now = now.Add(50 * time.Millisecond)
		if l.observe(Observation{Running: 3, Waiting: 1, Usage: 0.1}, now) || l.limit != 5 || l.probeOf != 4 {
			t.Fatalf("limit %d probe of %d while the probe's room is unused, want the probe to 5 pending", l.limit, l.probeOf)
		}
	}
	lowered := false
	for range 21 { // 1 s holding all 5, running 4
		now = now.Add(50 * time.Millisecond)
		lowered = l.observe(Observation{Running: 4, Waiting: 1, Usage: 0.1}, now) || lowered
	}
	if !lowered || l.limit != 4 || !l.capped || l.basis != LearnedQueue {
		t.Fatalf("limit %d capped %v by %s after 1 s holding 5 and running 4, want 4 capped by queue", l.limit, l.capped, l.basis)
	}
}
