package windows

import (
	"context"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

func TestPlanServesHigherClassesFirstAcrossRouters(t *testing.T) {
	// a waits with bulk, b with interactive: b's class is met first
	// whatever the order or the amount a waits for.
	in := []RouterInput{
		{ID: "a", Demand: 6, Waiting: 6, WaitingByClass: []int64{0, 0, 0, 6}},
		{ID: "b", Demand: 3, Waiting: 3, WaitingByClass: []int64{0, 3, 0, 0}},
	}
	if got := Plan(4, in); !slices.Equal(got, []int64{1, 3}) {
		t.Fatalf("Plan = %v, want b's 3 interactive rooms met first, a the rest", got)
	}
	// In flight on a is met with the default class: b's interactive
	// waiting still comes first, but nothing a holds is taken back.
	in[0] = RouterInput{ID: "a", Demand: 4, Waiting: 0, Share: 4, Held: 4}
	got := Plan(4, in)
	if got[0] != 1 || got[1] != 0 {
		t.Fatalf("Plan = %v, want a shrunk to 1 and b waiting for a's acknowledgement", got)
	}
	in[0].Share, in[0].Held = got[0], 1 // a applied the decrease, 1 still in flight
	if got = Plan(4, in); got[1] != 3 || got[0]+got[1] > 4 {
		t.Fatalf("Plan = %v, want b granted 3 after a's acknowledgement", got)
	}
	// No class vector: the old single-class split.
	flat := []RouterInput{{ID: "a", Demand: 4, Waiting: 4}, {ID: "b", Demand: 4, Waiting: 4}}
	if got := Plan(4, flat); !slices.Equal(got, []int64{2, 2}) {
		t.Fatalf("Plan = %v, want an even split", got)
	}
}

// newAdmissionAllocator returns an allocator with Admission on over one
// regular worker w1 whose spec is spec.
func newAdmissionAllocator(t *testing.T, spec *smgv1.WorkerSpec, queue int64) (*Allocator, *registry.Registry) {
	t.Helper()
	reg := registry.New("e", 0)
	if _, err := reg.Update(func(tx *registry.Txn) error {
		tx.Insert(&registry.Worker{Registered: registry.Registered{ID: "w1", Type: "regular", Spec: spec}})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	a := New(reg, Options{StaleAfter: 15 * time.Second, Warmup: 0, Admission: true, Queue: queue}, nil, nil)
	return a, reg
}

// report stores an engine report for w1 (a new load revision).
func report(t *testing.T, reg *registry.Registry, running, waiting, window int32) {
	t.Helper()
	if _, err := reg.Update(func(tx *registry.Txn) error {
		w := tx.Get("w1").Clone()
		w.Load = &smgv1.EngineLoad{RunningRequests: running, WaitingRequests: waiting, MaxRunningRequests: window}
		w.LoadRevision++
		tx.Insert(w)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func TestAdmissionWindowOrderSpecEngineLearned(t *testing.T) {
	spec := int32(4)
	a, reg := newAdmissionAllocator(t, &smgv1.WorkerSpec{Url: "http://w1", MaxRunningRequests: &spec}, 2)
	a.RouterDemand("r1", reg.Revision(), nil, time.Time{})
	report(t, reg, 3, 0, 16)
	if err := a.Step(); err != nil {
		t.Fatal(err)
	}
	w := reg.Snapshot().Get("w1")
	if got := *w.Admission; got.Window != 4 || got.Source != "spec" || got.Queue != 2 {
		t.Fatalf("admission %+v, want the spec's window 4 (queue 2)", got)
	}
	if w.WindowShare["r1"] != 6 {
		t.Fatalf("share %v, want window+queue = 6 for the lone router", w.WindowShare)
	}

	a, reg = newAdmissionAllocator(t, &smgv1.WorkerSpec{Url: "http://w1"}, 0)
	report(t, reg, 3, 0, 16)
	_ = a.Step()
	if got := *reg.Snapshot().Get("w1").Admission; got.Window != 16 || got.Source != "engine" {
		t.Fatalf("admission %+v, want the engine's reported window 16", got)
	}

	synctest.Test(t, func(t *testing.T) {
		a, reg := newAdmissionAllocator(t, &smgv1.WorkerSpec{Url: "http://w1"}, 0)
		report(t, reg, 7, 0, 0)
		_ = a.Step()
		if got := *reg.Snapshot().Get("w1").Admission; got.Window != 0 || got.Source != "" {
			t.Fatalf("admission %+v, want no window before the engine ever saturates", got)
		}
		if reg.Snapshot().Get("w1").WindowShare != nil {
			t.Fatal("shares allocated for a worker without a window")
		}
		for range queueStreak { // a queue with KV to spare counts once it lasts
			report(t, reg, 7, 3, 0)
			_ = a.Step()
			time.Sleep(queueSpan / 2)
		}
		if got := *reg.Snapshot().Get("w1").Admission; got.Window != 7 || got.Source != "learned" || got.LearnedBy != LearnedQueue {
			t.Fatalf("admission %+v, want the learned window 7 (running while waiting)", got)
		}
	})
}

func TestAdmissionOffLeavesRegularWorkersAlone(t *testing.T) {
	spec := int32(4)
	reg := registry.New("e", 0)
	_, _ = reg.Update(func(tx *registry.Txn) error {
		tx.Insert(&registry.Worker{Registered: registry.Registered{ID: "w1", Type: "regular", Spec: &smgv1.WorkerSpec{Url: "http://w1", MaxRunningRequests: &spec}}})
		return nil
	})
	a := New(reg, Options{}, nil, nil)
	a.RouterDemand("r1", reg.Revision(), nil, time.Time{})
	rev := reg.Revision()
	if err := a.Step(); err != nil {
		t.Fatal(err)
	}
	if w := reg.Snapshot().Get("w1"); w.Admission != nil || w.WindowShare != nil || reg.Revision() != rev {
		t.Fatalf("windows off wrote %+v %v", w.Admission, w.WindowShare)
	}
}

// TestLearnedWindowTracksAKVLimitedEngine runs the allocator's loop on fake
// time: an engine saturated at 12 running, then limited by long prompts to
// 4, is followed down, and shares follow the learned window.
func TestLearnedWindowTracksAKVLimitedEngine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, reg := newAdmissionAllocator(t, &smgv1.WorkerSpec{Url: "http://w1"}, 0)
		a.RouterDemand("r1", reg.Revision(), nil, time.Now())
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go a.Run(ctx)
		tick := func(running, waiting int32) {
			report(t, reg, running, waiting, 0)
			time.Sleep(DefaultInterval)
			synctest.Wait()
		}
		for range queueStreak {
			tick(12, 5)
		}
		if w := reg.Snapshot().Get("w1"); w.Admission.Window != 12 || w.WindowShare["r1"] != 12 {
			t.Fatalf("after a saturated report: %+v shares %v, want 12", w.Admission, w.WindowShare)
		}
		for range queueStreak {
			tick(4, 3) // long prompts: KV holds only 4
		}
		for range 20 {
			tick(4, 0) // gated at 4: the queue is gone
		}
		w := reg.Snapshot().Get("w1")
		if w.Admission.Window != 4 || w.Admission.Source != "learned" {
			t.Fatalf("after the engine's window shrank: %+v, want the learned window 4", w.Admission)
		}
		if w.WindowShare["r1"] != 4 {
			t.Fatalf("share %v, want it to follow the learned window", w.WindowShare)
		}
	})
}

// TestAllocatorShrinkBeforeGrowByClass runs the allocator's loop on fake
// time over one regular worker with a window of 4: r1 holds all 4 rooms with
// default-class work; r2 then waits with interactive requests. r1's share
// shrinks at once, but r2 is granted nothing until r1 has acknowledged the
// lower share and reported what it still holds; then r2 gets the room r1
// gave back, ahead of r1's own waiting bulk.
func TestAllocatorShrinkBeforeGrowByClass(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		spec := int32(4)
		a, reg := newAdmissionAllocator(t, &smgv1.WorkerSpec{Url: "http://w1", MaxRunningRequests: &spec}, 0)
		d := func(inFlight int64, byClass ...int64) []*smgv1.DecodeDemand {
			var w int64
			for _, n := range byClass {
				w += n
			}
			return []*smgv1.DecodeDemand{{WorkerId: "w1", InFlight: inFlight, Waiting: w, WaitingByClass: byClass}}
		}
		round := runRounds(t, a, reg)
		a.RouterDemand("r1", reg.Revision(), d(4), time.Now())
		if s := round(); s["r1"] != 4 {
			t.Fatalf("lone router: %v, want the whole window", s)
		}
		a.RouterDemand("r2", reg.Revision(), d(0, 0, 2, 0, 0), time.Now())
		a.RouterDemand("r1", reg.Revision(), d(4, 0, 0, 0, 6), time.Now())
		s := round()
		if s["r1"] >= 4 || s["r2"] != 0 {
			t.Fatalf("before r1's ack: %v, want r1 shrunk and r2 still without a room", s)
		}
		for range 4 { // r1 has not acknowledged: nothing is re-granted
			if s = round(); s["r2"] != 0 {
				t.Fatalf("r2 granted %d before r1 acknowledged its lower share", s["r2"])
			}
		}
		// r1 applies the lower share; two of its requests finish meanwhile.
		a.RouterDemand("r1", reg.Revision(), d(2, 0, 0, 0, 6), time.Now())
		s = round()
		if s["r2"] != 2 || s["r1"]+s["r2"] > 4 {
			t.Fatalf("after r1's ack: %v, want r2's 2 interactive rooms granted first, within the window", s)
		}
	})
}

// TestPlanKeepsTheOddRoomWhereItIs: three routers all asking for more than a
// window of 8 can share: the two rooms that do not split evenly stay with
// the routers that hold them, whoever waits most this round (a moved room
// idles for an acknowledgement's round trip).
func TestPlanKeepsTheOddRoomWhereItIs(t *testing.T) {
	in := []RouterInput{
		{ID: "a", Demand: 8, Waiting: 5, Share: 3, Held: 3},
		{ID: "b", Demand: 9, Waiting: 6, Share: 3, Held: 3},
		{ID: "c", Demand: 20, Waiting: 18, Share: 2, Held: 2},
	}
	if got := Plan(8, in); !slices.Equal(got, []int64{3, 3, 2}) {
		t.Fatalf("Plan = %v, want the shares kept at 3 3 2", got)
	}
	// A higher class still takes the odd rooms (once a and b acknowledge
	// their lower shares).
	in[2].WaitingByClass = []int64{0, 1, 17, 0}
	if got := fairTargets(8, in); !slices.Equal(got, []int64{2, 2, 4}) {
		t.Fatalf("targets = %v, want c (interactive waiting) to get both odd rooms", got)
	}
	if got := Plan(8, in); !slices.Equal(got, []int64{2, 2, 2}) {
		t.Fatalf("Plan = %v, want a and b shrunk, c waiting for their acknowledgement", got)
	}
}
