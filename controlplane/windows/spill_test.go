package windows

import (
	"testing"
	"time"

	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// An external worker's spill-over budget is split evenly among the routers
// known, in millionths: never more than the whole; a router that joins
// takes its part from the others; one gone past the stale bound gives its
// part back. During the warm-up no part grows. A provider without a
// budget, or an engine, gets no such parts.
func TestSpillBudgetSplitEvenlyAmongRouters(t *testing.T) {
	reg := registry.New("e", 0)
	if _, err := reg.Update(func(tx *registry.Txn) error {
		tx.Insert(&registry.Worker{Registered: registry.Registered{ID: "p1", Type: "regular",
			Spec: &smgv1.WorkerSpec{Url: "https://api.example.com/v1#m", Provider: &smgv1.ProviderSpec{SpillRequestsPerSec: 10}}}})
		tx.Insert(&registry.Worker{Registered: registry.Registered{ID: "p2", Type: "regular",
			Spec: &smgv1.WorkerSpec{Url: "https://api.example.com/v1#n", Provider: &smgv1.ProviderSpec{}}}})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	clk := &fakeClock{t: time.Unix(1000, 0)}
	a := New(reg, Options{StaleAfter: 15 * time.Second, Warmup: time.Second, Now: clk.now, Admission: true}, nil, nil)
	step := func() map[string]int64 {
		t.Helper()
		if err := a.Step(); err != nil {
			t.Fatal(err)
		}
		if s := reg.Get("p2").WindowShare; s != nil {
			t.Fatalf("a provider without a budget got parts %v", s)
		}
		if adm := reg.Get("p1").Admission; adm != nil {
			t.Fatalf("a provider got a running window %+v", adm)
		}
		return reg.Get("p1").WindowShare
	}
	a.RouterDemand("r1", reg.Revision(), nil, clk.t)
	a.RouterDemand("r2", reg.Revision(), nil, clk.t)
	if s := step(); s["r1"] != 0 || s["r2"] != 0 {
		t.Fatalf("warming up: parts %v, want none granted", s)
	}
	clk.t = clk.t.Add(2 * time.Second)
	if s := step(); s["r1"] != SpillParts/2 || s["r2"] != SpillParts/2 {
		t.Fatalf("two routers: %v, want half each", s)
	}
	a.RouterDemand("r3", reg.Revision(), nil, clk.t)
	if s := step(); s["r1"] != SpillParts/3 || s["r3"] != SpillParts/3 || s["r1"]+s["r2"]+s["r3"] > SpillParts {
		t.Fatalf("three routers: %v", s)
	}
	a.RouterDisconnected("r3", clk.t)
	if s := step(); s["r3"] != SpillParts/3 {
		t.Fatalf("a router just gone keeps its part until the stale bound: %v", s)
	}
	clk.t = clk.t.Add(16 * time.Second)
	if s := step(); len(s) != 2 || s["r1"] != SpillParts/2 {
		t.Fatalf("past the stale bound: %v, want halves again", s)
	}
}
