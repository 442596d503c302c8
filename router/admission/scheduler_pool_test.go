package admission

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

func admitIn(t *testing.T, s *Scheduler, c Class, pool string) *Ticket {
	t.Helper()
	tk, r := s.AdmitFor(context.Background(), c, "anonymous", pool)
	if r != Admitted {
		t.Fatalf("%s of %q: result %d, want admitted", c, pool, r)
	}
	return tk
}

// queuedIn starts an AdmitFor in the background and waits until it is
// queued or done.
func queuedIn(s *Scheduler, c Class, pool string, out chan<- *Ticket) {
	go func() {
		tk, _ := s.AdmitFor(context.Background(), c, "anonymous", pool)
		out <- tk
	}()
	synctest.Wait()
}

func none(t *testing.T, ch <-chan *Ticket, what string) {
	t.Helper()
	select {
	case <-ch:
		t.Fatalf("%s admitted", what)
	default:
	}
}

// One model's idle slots never admit another model's requests: with two
// pools of 2 slots in a capacity of 4, a third request of model a waits
// (whole capacity has room), a request of model b passes it at once, and a
// slot a frees goes to a's waiter. A request naming no pool counts against
// the whole capacity only.
func TestPoolsKeepTheirOwnSlots(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTest(t, plainConfig(), 4)
		s.SetPoolCapacities(map[string]int64{"a": 2, "b": 2})
		a1, _ := admitIn(t, s, Default, "a"), admitIn(t, s, Default, "a")
		got := make(chan *Ticket, 4)
		queuedIn(s, Default, "a", got)
		none(t, got, "a third request of a, a's slots full")
		b1 := admitIn(t, s, Default, "b") // behind a's waiter in the class's queue: passes it
		a1.Release()
		synctest.Wait()
		a3 := <-got
		if a3 == nil {
			t.Fatal("a's waiter not admitted when a's slot freed")
		}
		any := admitIn(t, s, Default, "") // 4th slot of the whole capacity
		queuedIn(s, Default, "b", got)
		none(t, got, "b over the whole capacity")
		b1.Release()
		synctest.Wait()
		if <-got == nil {
			t.Fatal("b's waiter not admitted")
		}
		any.Release()
		a3.Release()
	})
}

// A capacity change admits a pool's waiters; a pool dropped from the
// capacities has no limit of its own any more.
func TestPoolCapacityChanges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTest(t, plainConfig(), 10)
		s.SetPoolCapacities(map[string]int64{"a": 1})
		admitIn(t, s, Default, "a")
		got := make(chan *Ticket, 2)
		queuedIn(s, Default, "a", got)
		none(t, got, "a over its 1 slot")
		s.SetPoolCapacities(map[string]int64{"a": 2})
		if <-got == nil {
			t.Fatal("a's waiter not admitted when a's capacity grew")
		}
		queuedIn(s, Default, "a", got)
		none(t, got, "a over its 2 slots")
		s.SetPoolCapacities(map[string]int64{"a": -7}) // absurd: none
		none(t, got, "a with no slot")
		s.SetPoolCapacities(nil)
		if <-got == nil {
			t.Fatal("a's waiter not admitted when a lost its own capacity")
		}
		if caps := s.PoolCapacities(); len(caps) != 0 {
			t.Fatalf("pools %v, want none", caps)
		}
	})
}

// A starving head of a full pool does not take a slot; a preempting
// request of a full pool preempts only its own pool's requests.
func TestPoolsStarvationAndPreemption(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := plainConfig()
		cfg.Classes[Bulk] = ClassConfig{QueueSize: 10, QueueTimeout: time.Hour, StarvationThreshold: time.Second}
		cfg.Classes[Interactive].CanPreempt = true
		s := newTest(t, cfg, 3)
		s.SetPoolCapacities(map[string]int64{"a": 1, "b": 2})
		a := admitIn(t, s, Bulk, "a")
		got := make(chan *Ticket, 2)
		queuedIn(s, Bulk, "a", got)
		time.Sleep(2 * time.Second)
		s.SetPoolCapacities(map[string]int64{"a": 1, "b": 2, "c": 5}) // a dispatch pass
		none(t, got, "a starving waiter of a full pool")
		b := admitIn(t, s, Bulk, "b")
		admitIn(t, s, Default, "") // the whole capacity is full now
		// An interactive request of b (b has a slot, the capacity none)
		// preempts the latest bulk request: b's.
		bi := admitIn(t, s, Interactive, "b")
		select {
		case <-b.Preempted():
		default:
			t.Fatal("b's bulk request not preempted for b's interactive one")
		}
		bi.Release()
		synctest.Wait()
		none(t, got, "a's waiter while a's slot is held")
		c := admitIn(t, s, Bulk, "c") // the latest bulk request, of another pool
		// An interactive request of a (a full) may preempt only a's.
		ai := admitIn(t, s, Interactive, "a")
		select {
		case <-a.Preempted():
		default:
			t.Fatal("a's bulk request not preempted for a's interactive one")
		}
		select {
		case <-c.Preempted():
			t.Fatal("c's request preempted for a's: it frees none of a's slots")
		default:
		}
		ai.Release()
		synctest.Wait()
		if <-got == nil {
			t.Fatal("a's waiter not admitted")
		}
	})
}
