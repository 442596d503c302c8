package windows

import (
	"math"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// newBudgetAllocator returns an allocator with token budgets on (windows
// off) over one regular worker w1 reporting a KV capacity of capacity.
func newBudgetAllocator(t *testing.T, capacity int64) (*Allocator, *registry.Registry) {
	t.Helper()
	reg := registry.New("e", 0)
	if _, err := reg.Update(func(tx *registry.Txn) error {
		tx.Insert(&registry.Worker{Registered: registry.Registered{ID: "w1", Type: "regular", Spec: &smgv1.WorkerSpec{Url: "http://w1"}},
			State: registry.State{Load: &smgv1.EngineLoad{KvCapacityTokens: capacity}, LoadRevision: 1}})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return New(reg, Options{StaleAfter: 15 * time.Second, TokenBudget: true}, nil, nil), reg
}

// tokens is a router's token demand on w1.
func tokens(inFlight int64, byClass ...int64) []*smgv1.DecodeDemand {
	var w int64
	for _, n := range byClass {
		w += n
	}
	return []*smgv1.DecodeDemand{{WorkerId: "w1", TokensInFlight: inFlight, TokensWaiting: w, TokensWaitingByClass: byClass}}
}

// TestTokenBudgetSharesFollowDemandShrinkBeforeGrow: a worker's reported KV
// capacity is its budget, split over the routers like a running window: a
// lone router gets it whole; a second router that waits for tokens gets
// them only once the first has acknowledged its lower share and reported
// what it still holds, and never is more granted than the budget; room
// shares are left alone (windows are off).
func TestTokenBudgetSharesFollowDemandShrinkBeforeGrow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, reg := newBudgetAllocator(t, 20000)
		round := runRounds(t, a, reg)
		shares := func() map[string]int64 {
			round()
			return reg.Snapshot().Get("w1").TokenShare
		}
		a.RouterDemand("r1", reg.Revision(), tokens(18000), time.Now())
		if s := shares(); s["r1"] != 20000 {
			t.Fatalf("lone router: %v, want the whole budget", s)
		}
		w := reg.Snapshot().Get("w1")
		if *w.Budget != (registry.Budget{Tokens: 20000, Source: BudgetEngine}) || w.WindowShare != nil || w.Admission != nil {
			t.Fatalf("budget %+v, window %v %+v: want the engine's 20000 tokens and no window", w.Budget, w.WindowShare, w.Admission)
		}
		a.RouterDemand("r2", reg.Revision(), tokens(0, 0, 0, 6000, 0), time.Now())
		a.RouterDemand("r1", reg.Revision(), tokens(18000), time.Now())
		s := shares()
		if s["r1"] >= 20000 || s["r2"] != 0 {
			t.Fatalf("before r1's ack: %v, want r1 shrunk and r2 granted nothing yet", s)
		}
		for range 3 {
			if s = shares(); s["r2"] != 0 {
				t.Fatalf("r2 granted %d tokens before r1 acknowledged", s["r2"])
			}
		}
		// r1 applies its lower share; a long request ends meanwhile.
		a.RouterDemand("r1", reg.Revision(), tokens(12000), time.Now())
		s = shares()
		if s["r2"] < 6000 || s["r1"]+s["r2"] > 20000 {
			t.Fatalf("after r1's ack: %v, want r2's 6000 waiting tokens granted within the budget", s)
		}
	})
}

// TestTokenBudgetOffAndUnknown: without the option no budget is written;
// with it, an engine that reports no capacity gets a record without tokens
// (never gated) and no shares; PD workers get none.
func TestTokenBudgetOffAndUnknown(t *testing.T) {
	a, reg := newBudgetAllocator(t, 0)
	a.RouterDemand("r1", reg.Revision(), nil, time.Time{})
	if err := a.Step(); err != nil {
		t.Fatal(err)
	}
	if w := reg.Snapshot().Get("w1"); w.Budget == nil || w.Budget.Tokens != 0 || w.TokenShare != nil {
		t.Fatalf("unknown capacity: budget %+v shares %v, want an empty record and no shares", w.Budget, w.TokenShare)
	}

	reg = registry.New("e", 0)
	_, _ = reg.Update(func(tx *registry.Txn) error {
		tx.Insert(&registry.Worker{Registered: registry.Registered{ID: "w1", Type: "regular", Spec: &smgv1.WorkerSpec{Url: "http://w1"}},
			State: registry.State{Load: &smgv1.EngineLoad{KvCapacityTokens: 1000}}})
		tx.Insert(&registry.Worker{Registered: registry.Registered{ID: "d1", Type: "decode", Spec: &smgv1.WorkerSpec{Url: "http://d1"}},
			State: registry.State{Load: &smgv1.EngineLoad{KvCapacityTokens: 1000}}})
		return nil
	})
	off := New(reg, Options{}, nil, nil)
	off.RouterDemand("r1", reg.Revision(), nil, time.Time{})
	rev := reg.Revision()
	if err := off.Step(); err != nil {
		t.Fatal(err)
	}
	if w := reg.Snapshot().Get("w1"); w.Budget != nil || w.TokenShare != nil || reg.Revision() != rev {
		t.Fatalf("budgets off wrote %+v %v", w.Budget, w.TokenShare)
	}
	on := New(reg, Options{TokenBudget: true}, nil, nil)
	on.RouterDemand("r1", reg.Revision(), nil, time.Time{})
	if err := on.Step(); err != nil {
		t.Fatal(err)
	}
	if d := reg.Snapshot().Get("d1"); d.Budget != nil || d.TokenShare != nil {
		t.Fatalf("a decode worker got a token budget %+v %v", d.Budget, d.TokenShare)
	}
	if w := reg.Snapshot().Get("w1"); w.Budget.TokenBudget() != 1000 || w.TokenShare["r1"] != 1000 {
		t.Fatalf("budget %+v shares %v, want 1000 tokens, all to r1", w.Budget, w.TokenShare)
	}
}

// reportUsage stores a load report of w1 with KV usage u (a new revision).
func reportUsage(t *testing.T, reg *registry.Registry, u float64) {
	t.Helper()
	if _, err := reg.Update(func(tx *registry.Txn) error {
		w := tx.Get("w1").Clone()
		w.Load, w.LoadRevision = &smgv1.EngineLoad{TokenUsage: u}, w.LoadRevision+1
		tx.Insert(w)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// An engine that reports no KV capacity has one learned: the tokens the
// routers hold there over its KV usage, the median of the latest five
// samples, shown as the budget with source "learned"; reports below 20%
// usage, or with no tokens held, give no sample.
func TestTokenBudgetLearnedFromUsage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, reg := newBudgetAllocator(t, 0)
		round := runRounds(t, a, reg)
		step := func(held1, held2 int64, u float64) *registry.Budget {
			a.RouterDemand("r1", reg.Revision(), tokens(held1), time.Now())
			a.RouterDemand("r2", reg.Revision(), tokens(held2), time.Now())
			reportUsage(t, reg, u)
			round()
			return reg.Snapshot().Get("w1").Budget
		}
		if b := step(4000, 0, 0.1); b.Tokens != 0 || b.Learned != 0 {
			t.Fatalf("usage 10%%: %+v, want nothing learned", b)
		}
		for i, u := range []float64{0.5, 0.4, 0.5, 0.8} { // samples 12000, 15000, 12000, 7500
			if b := step(4000, 2000, u); b.Tokens != 0 {
				t.Fatalf("sample %d: %+v, want nothing learned before five samples", i+1, b)
			}
		}
		if b := step(0, 0, 0.6); b.Tokens != 0 {
			t.Fatalf("no tokens held: %+v, want no sample", b)
		}
		b := step(6000, 0, 0.5) // 12000: median of 12000 15000 12000 7500 12000
		if *b != (registry.Budget{Tokens: 12000, Source: BudgetLearned, Learned: 12000}) {
			t.Fatalf("budget %+v, want 12000 learned", b)
		}
		if s := reg.Snapshot().Get("w1").TokenShare; s["r1"]+s["r2"] > 12000 || s["r1"] == 0 {
			t.Fatalf("shares %v, want the learned budget split", s)
		}
	})
}

// An engine that lies about its KV usage (20% whatever the tokens held)
// grows its learned capacity at most twofold a sample and never past
// MaxLearnedKV; the capped samples are counted. One that says nothing
// believable (NaN) gives no sample.
func TestTokenBudgetLearnedIsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, reg := newBudgetAllocator(t, 0)
		round := runRounds(t, a, reg)
		held := int64(1000)
		var last int64
		for i := range 60 {
			a.RouterDemand("r1", reg.Revision(), tokens(held), time.Now())
			reportUsage(t, reg, 0.2)
			round()
			b := reg.Snapshot().Get("w1").Budget
			if last > 0 && b.Tokens > 2*last {
				t.Fatalf("report %d: %d tokens after %d: grew more than twofold", i, b.Tokens, last)
			}
			if b.Tokens > MaxLearnedKV {
				t.Fatalf("report %d: %d tokens, past the bound", i, b.Tokens)
			}
			last = b.Tokens
			held = max(held, b.Tokens) // the routers fill what they are granted
		}
		if last != MaxLearnedKV {
			t.Fatalf("learned %d, want it held at the bound %d", last, MaxLearnedKV)
		}
		if n := testutil.ToFloat64(a.kvCapped); n == 0 {
			t.Fatal("no capped sample counted")
		}
		reportUsage(t, reg, math.NaN())
		round()
		if b := reg.Snapshot().Get("w1").Budget; b.Tokens != MaxLearnedKV {
			t.Fatalf("NaN usage moved the budget: %+v", b)
		}
	})
}
