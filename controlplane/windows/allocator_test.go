package windows

import (
	"testing"
	"time"

	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func newTestAllocator(t *testing.T, window int32) (*Allocator, *registry.Registry, *fakeClock) {
	t.Helper()
	reg := registry.New("e", 0)
	if _, err := reg.Update(func(tx *registry.Txn) error {
		tx.Insert(&registry.Worker{Registered: registry.Registered{ID: "d1", Type: "decode", Spec: &smgv1.WorkerSpec{Url: "http://d1", MaxRunningRequests: &window}}})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	clk := &fakeClock{t: time.Unix(1000, 0)}
	a := New(reg, Options{StaleAfter: 15 * time.Second, Warmup: time.Second, Now: clk.now}, nil, nil)
	clk.t = clk.t.Add(2 * time.Second) // past the warmup
	return a, reg, clk
}

func demand(inFlight, waiting int64) []*smgv1.DecodeDemand {
	return []*smgv1.DecodeDemand{{WorkerId: "d1", InFlight: inFlight, Waiting: waiting}}
}

func shares(t *testing.T, a *Allocator, reg *registry.Registry) map[string]int64 {
	t.Helper()
	if err := a.Step(); err != nil {
		t.Fatal(err)
	}
	return reg.Snapshot().Get("d1").WindowShare
}

func total(m map[string]int64) (s int64) {
	for _, v := range m {
		s += v
	}
	return s
}

func TestAllocatorSharesNeverExceedTheWindow(t *testing.T) {
	a, reg, clk := newTestAllocator(t, 4)
	for _, r := range []string{"r1", "r2", "r3"} {
		a.RouterDemand(r, reg.Revision(), demand(0, 0), clk.t)
	}
	s := shares(t, a, reg)
	if len(s) != 3 || total(s) != 4 {
		t.Fatalf("idle shares %v: want all 4 rooms spread over 3 routers", s)
	}
	// r3 waits for 6 rooms; the others go idle.
	a.RouterDemand("r3", reg.Revision(), demand(0, 6), clk.t)
	s = shares(t, a, reg)
	if total(s) > 4 {
		t.Fatalf("shares %v exceed the window", s)
	}
	before := s["r3"]
	// r1 and r2 acknowledge the revision with their lower shares, then report.
	rev := reg.Revision()
	a.RouterDemand("r1", rev, demand(0, 0), clk.t)
	a.RouterDemand("r2", rev, demand(0, 0), clk.t)
	a.RouterDemand("r3", rev, demand(before, 6-before), clk.t)
	s = shares(t, a, reg)
	if s["r3"] != 4 || total(s) != 4 {
		t.Fatalf("after the others released: %v, want r3 to hold the whole window", s)
	}
}

func TestAllocatorWaitsForTheAckBeforeRegranting(t *testing.T) {
	a, reg, clk := newTestAllocator(t, 4)
	a.RouterDemand("r1", reg.Revision(), demand(4, 0), clk.t)
	s := shares(t, a, reg)
	if s["r1"] != 4 {
		t.Fatalf("lone router: %v, want 4", s)
	}
	// r2 arrives with waiting demand: r1 must shrink, but r2 gets nothing
	// until r1 has applied its lower share and reported what it holds.
	a.RouterDemand("r2", reg.Revision(), demand(0, 4), clk.t)
	old := reg.Revision()
	s = shares(t, a, reg)
	if s["r1"] >= 4 || s["r2"] != 0 {
		t.Fatalf("before r1's ack: %v, want r1 lowered and r2 still 0", s)
	}
	a.RouterDemand("r1", old, demand(4, 0), clk.t) // a report from before the decrease
	if s = shares(t, a, reg); s["r2"] != 0 {
		t.Fatalf("r1 has not applied the decrease yet, r2 got %d", s["r2"])
	}
	a.RouterDemand("r1", reg.Revision(), demand(4, 0), clk.t) // applied, still 4 in flight
	if s = shares(t, a, reg); s["r2"] != 0 {
		t.Fatalf("r1 still holds 4 rooms, r2 got %d", s["r2"])
	}
	a.RouterDemand("r1", reg.Revision(), demand(1, 0), clk.t) // drained to 1
	s = shares(t, a, reg)
	if s["r2"] == 0 || max(s["r1"], 1)+s["r2"] > 4 {
		t.Fatalf("after r1 drained: %v, want r2 granted within the window", s)
	}
}

func TestAllocatorRouterLeavingReturnsItsShareAfterTheStaleBound(t *testing.T) {
	a, reg, clk := newTestAllocator(t, 4)
	a.RouterDemand("r1", reg.Revision(), demand(2, 0), clk.t)
	a.RouterDemand("r2", reg.Revision(), demand(2, 5), clk.t)
	s := shares(t, a, reg)
	if s["r1"] == 0 {
		t.Fatalf("shares %v: r1 should hold rooms", s)
	}
	a.RouterDisconnected("r1", clk.t)
	clk.t = clk.t.Add(14 * time.Second)
	a.RouterDemand("r2", reg.Revision(), demand(s["r2"], 5), clk.t)
	if s2 := shares(t, a, reg); s2["r1"] != s["r1"] {
		t.Fatalf("within the stale bound r1's share moved: %v -> %v", s, s2)
	}
	clk.t = clk.t.Add(time.Second)
	s = shares(t, a, reg)
	if _, ok := s["r1"]; ok || s["r2"] != 4 {
		t.Fatalf("after the stale bound: %v, want r1 gone and r2 holding the window", s)
	}
}

func TestAllocatorDropsSharesWhenTheWindowGoes(t *testing.T) {
	a, reg, clk := newTestAllocator(t, 4)
	a.RouterDemand("r1", reg.Revision(), demand(0, 0), clk.t)
	if s := shares(t, a, reg); s["r1"] != 4 {
		t.Fatalf("shares %v", s)
	}
	if _, err := reg.Update(func(tx *registry.Txn) error {
		w := tx.Get("d1").Clone()
		w.Spec = &smgv1.WorkerSpec{Url: "http://d1"}
		tx.Insert(w)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if s := shares(t, a, reg); s != nil {
		t.Fatalf("no window: shares %v, want none", s)
	}
}
