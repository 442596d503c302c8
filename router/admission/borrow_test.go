package admission

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// A tenant under its weighted share that finds no free slot here asks a peer
// router for a room instead of waiting for a completion here: the borrowed
// ticket holds no slot here, and the tenant's counter is still charged here.
// When no peer lends, it waits as before and takes the next slot.
func TestUnderShareTenantBorrowsInsteadOfWaiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTest(t, refusedCfg(), 4)
		steady := admitN(t, s, "auth:steady", 1)
		flood := admitN(t, s, "auth:flood", 3) // the capacity is full
		asked := 0
		lend := func() bool { asked++; return true }
		tk, r := s.AdmitOrBorrow(context.Background(), Default, "auth:steady", "", lend)
		if r != Admitted || !tk.Borrowed() || asked != 1 {
			t.Fatalf("result %v, borrowed %v, asked %d: want a borrowed ticket after one ask", r, tk.Borrowed(), asked)
		}
		if s.total != 4 || s.fair.tenants["auth:steady"].inflight != 1 {
			t.Fatalf("slots held %d, steady's %d: a borrowed ticket holds none here", s.total, s.fair.tenants["auth:steady"].inflight)
		}
		before := s.fair.tenants["auth:steady"].counter
		tk.Charge(100, PromptTokenWeight)
		if got := s.fair.tenants["auth:steady"].counter; got != before+100 {
			t.Fatalf("steady's counter %v after 100 tokens from %v", got, before)
		}
		tk.Release()
		tk.Release()
		if s.total != 4 {
			t.Fatalf("slots held %d after a borrowed ticket ended", s.total)
		}

		// No peer lends: the request waits for the next completion here.
		got := make(chan *Ticket, 1)
		go func() {
			tk, _ := s.AdmitOrBorrow(context.Background(), Default, "auth:steady", "", func() bool { asked++; return false })
			got <- tk
		}()
		synctest.Wait()
		if asked != 2 || len(got) != 0 {
			t.Fatalf("asked %d times, admitted %d: want it asked once more and waiting", asked, len(got))
		}
		flood[0].Release()
		tk = <-got
		if tk.Borrowed() || tenantOf(tk) != "auth:steady" || s.total != 4 {
			t.Fatalf("the freed slot went to %s (borrowed %v), %d held", tenantOf(tk), tk.Borrowed(), s.total)
		}

		// A waiter asks again every BorrowEvery: a room that frees at a
		// peer serves it before one frees here.
		tk.Release()
		flood[0] = admitN(t, s, "auth:flood", 1)[0] // full again, steady under its share
		var peerFree atomic.Bool
		var asks atomic.Int32
		go func() {
			tk, _ := s.AdmitOrBorrow(context.Background(), Default, "auth:steady", "", func() bool { asks.Add(1); return peerFree.Load() })
			got <- tk
		}()
		time.Sleep(BorrowEvery / 2)
		synctest.Wait()
		if asks.Load() != 1 || len(got) != 0 {
			t.Fatalf("asked %d times, admitted %d: want one ask and a wait", asks.Load(), len(got))
		}
		peerFree.Store(true)
		time.Sleep(BorrowEvery)
		synctest.Wait()
		if len(got) != 1 || asks.Load() != 2 {
			t.Fatalf("asked %d times, admitted %d: want a loan on the next ask", asks.Load(), len(got))
		}
		lent := <-got
		if !lent.Borrowed() || s.total != 4 || s.queues[Default].Len() != 0 || s.fair.tenants["auth:steady"].waiting != 0 {
			t.Fatalf("borrowed %v, %d held, %d queued: want the waiter gone with a loan", lent.Borrowed(), s.total, s.queues[Default].Len())
		}
		for _, h := range append(append(steady, flood...), lent) {
			h.Release()
		}
	})
}

// Only a tenant under its weighted share beside another active tenant
// borrows: a tenant alone waits for this router's capacity (what it misses
// is capacity, not headroom kept elsewhere for it), and so does a tenant
// past its weighted share.
func TestBorrowOnlyUnderWeightedShare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		never := func() bool { t.Error("borrow asked"); return true }
		s := newTest(t, refusedCfg(), 2)
		held := admitN(t, s, "auth:a", 2)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan Result, 1)
		go func() { _, r := s.AdmitOrBorrow(ctx, Default, "auth:a", "", never); done <- r }()
		synctest.Wait()
		cancel()
		if r := <-done; r != Cancelled {
			t.Fatalf("a tenant alone: %v, want it waiting until cancelled", r)
		}
		for _, h := range held {
			h.Release()
		}

		// Fleet-wide, b holds more than its weighted share (7 against 6 of
		// 12) on other routers, under its fair share (12 less c's 3): what
		// more it takes is others' headroom, not its own.
		s = newTest(t, refusedCfg(), 2)
		s.SetFleetCapacity(12)
		s.SetFleetTenants([]TenantDemand{{Tenant: "auth:b", Weight: 1, InFlight: 7, Demand: 20}, {Tenant: "auth:c", Weight: 1, InFlight: 1, Demand: 2}})
		held = admitN(t, s, "auth:c", 1)
		ctx, cancel = context.WithCancel(context.Background())
		tk, r := s.AdmitOrBorrow(ctx, Default, "auth:b", "", never)
		if r != Admitted || tk.Borrowed() {
			t.Fatalf("b: %v, want it admitted to the free slot here", r)
		}
		held = append(held, tk)
		go func() { _, r := s.AdmitOrBorrow(ctx, Default, "auth:b", "", never); done <- r }()
		synctest.Wait()
		cancel()
		if r := <-done; r != Cancelled {
			t.Fatalf("b past its weighted share: %v, want it waiting until cancelled", r)
		}
		for _, h := range held {
			h.Release()
		}
	})
}

// A lender admits a peer's request by its own fair-share rules, at once or
// not at all: a tenant over its fleet-wide share is refused, one under it
// takes a free slot here (counted here, never preempted), and with no slot
// free nothing is lent.
func TestLendByFairShareRules(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTest(t, refusedCfg(), 4)
		s.SetFleetCapacity(12)
		s.SetFleetTenants([]TenantDemand{{Tenant: "auth:flood", Weight: 1, InFlight: 9, Demand: 100}, {Tenant: "auth:steady", Weight: 1, InFlight: 0, Demand: 3}})
		if _, r := s.Lend(Default, "auth:flood", ""); r != OverFairShare {
			t.Fatalf("the flood at its fleet-wide share (9 of 12 beside a demand of 3): %v, want refused", r)
		}
		var lent []*Ticket
		for range 4 {
			tk, r := s.Lend(Default, "auth:steady", "")
			if r != Admitted || !tk.Start() {
				t.Fatalf("steady under its share: %v", r)
			}
			lent = append(lent, tk)
		}
		if s.total != 4 {
			t.Fatalf("%d slots held after 4 loans", s.total)
		}
		if _, r := s.Lend(Default, "auth:steady", ""); r != QueueFull {
			t.Fatalf("no slot free: %v, want nothing lent", r)
		}
		if s.preemptForLocked(System, &s.anyPool) {
			t.Fatal("a lent room was preempted")
		}
		for _, tk := range lent {
			tk.Release()
		}
		if s.total != 0 || s.fair.active != 0 {
			t.Fatalf("%d slots held, %d tenants active after the loans ended", s.total, s.fair.active)
		}
	})
}

// Waiters ask the peers again one at a time: a queue of under-share
// requests makes one ask in flight per router, not one per waiter.
func TestWaitersAskOneAtATime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTest(t, refusedCfg(), 4)
		held := admitN(t, s, "auth:flood", 4)
		var asking, most atomic.Int32
		answer := make(chan bool)
		ask := func() bool {
			n := asking.Add(1)
			most.Store(max(most.Load(), n))
			ok := <-answer
			asking.Add(-1)
			return ok
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan Result, 3)
		for _, tenant := range []string{"auth:a", "auth:b", "auth:c"} {
			go func() { _, r := s.AdmitOrBorrow(ctx, Default, tenant, "", ask); done <- r }()
		}
		synctest.Wait() // each asks once on arrival
		for range 3 {
			answer <- false
		}
		synctest.Wait()
		most.Store(0)
		for range 5 {
			time.Sleep(BorrowEvery)
			synctest.Wait()
			if asking.Load() != 1 {
				t.Fatalf("%d waiters asking after %v, want one", asking.Load(), BorrowEvery)
			}
			answer <- false
		}
		if most.Load() != 1 {
			t.Fatalf("up to %d asks at once", most.Load())
		}
		cancel()
		time.Sleep(BorrowEvery)
		synctest.Wait()
		for len(done) < 3 {
			answer <- false
			synctest.Wait()
		}
		for _, h := range held {
			h.Release()
		}
	})
}

// A peer ask that panics (a bug, or a peer's answer that trips one) leaves
// the scheduler whole, on arrival and when a waiter asks again: the panic
// reaches the caller with no lock held, the tenant is counted out, the
// waiter is off its queue, and the next requests are admitted as before.
func TestBorrowPanicLeavesSchedulerWhole(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTest(t, refusedCfg(), 4)
		steady := admitN(t, s, "auth:steady", 1)
		flood := admitN(t, s, "auth:flood", 3) // the capacity is full
		admit := func(ask func() bool) (v any) {
			defer func() { v = recover() }()
			s.AdmitOrBorrow(context.Background(), Default, "auth:steady", "", ask)
			return nil
		}
		whole := func(when string) {
			t.Helper()
			if !s.mu.TryLock() {
				t.Fatalf("%s: the scheduler's lock is still held", when)
			}
			defer s.mu.Unlock()
			if ts := s.fair.tenants["auth:steady"]; ts.waiting != 0 || s.queues[Default].Len() != 0 || s.reasking {
				t.Fatalf("%s: steady waiting %d, %d queued, reasking %v: want nothing left of the request", when, ts.waiting, s.queues[Default].Len(), s.reasking)
			}
		}
		if v := admit(func() bool { panic("bad answer") }); v != "bad answer" {
			t.Fatalf("an ask on arrival that panics: recovered %v, want the panic", v)
		}
		whole("the ask on arrival panicked")

		asks := 0
		done := make(chan any, 1)
		go func() {
			done <- admit(func() bool {
				if asks++; asks > 1 {
					panic("bad answer")
				}
				return false
			})
		}()
		time.Sleep(BorrowEvery)
		synctest.Wait()
		if v := <-done; v != "bad answer" || asks != 2 {
			t.Fatalf("a waiter's second ask panics: recovered %v after %d asks, want the panic on the second", v, asks)
		}
		whole("the waiter's ask panicked")

		// The next completion's slot goes to the next request, not to the
		// abandoned waiter.
		flood[0].Release()
		tk, r := s.AdmitOrBorrow(context.Background(), Default, "auth:steady", "", func() bool { return false })
		if r != Admitted || tk.Borrowed() {
			t.Fatalf("after the panics: %v (borrowed %v), want the freed slot", r, tk.Borrowed())
		}
		for _, h := range append(append(steady, flood[1:]...), tk) {
			h.Release()
		}
		if s.total != 0 || s.fair.active != 0 {
			t.Fatalf("%d slots held, %d tenants active after every request ended", s.total, s.fair.active)
		}
	})
}

// A lent room's holding time is the borrower's to count: a loan the
// borrower closes at once (it took another peer's first) is no answer
// here. Otherwise that instant would be this router's mean holding time,
// and a flood's first holding time (its newcomer headroom) would end after
// it: here the flood stays held to half of 8 for its first second.
func TestSpareLoanIsNoHoldingTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTest(t, newcomerCfg(), 8)
		lent, r := s.Lend(Default, "auth:steady", "")
		if r != Admitted {
			t.Fatalf("lend: result %d, want admitted", r)
		}
		time.Sleep(5 * time.Millisecond)
		lent.Release() // the borrower took another peer's room
		time.Sleep(time.Second)
		flood, refused := arriveEvery(t, s, "auth:flood", 20, 10*time.Millisecond)
		if len(flood) != 4 || refused != 16 {
			t.Fatalf("young flood after a spare loan: %d admitted, %d refused, want 4 and 16", len(flood), refused)
		}
		releaseAll(flood)
	})
}
