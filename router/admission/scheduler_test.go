package admission

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// plainConfig has no reservations, no preemption and long thresholds, so a
// test turns on only the rule it checks.
func plainConfig() SchedulerConfig {
	c := DefaultSchedulerConfig()
	for _, cl := range Classes {
		c.Classes[cl] = ClassConfig{QueueSize: 10, QueueTimeout: time.Hour, StarvationThreshold: time.Hour}
	}
	return c
}

func newTest(t *testing.T, cfg SchedulerConfig, capacity int64) *Scheduler {
	t.Helper()
	m, err := NewSchedulerMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return NewScheduler(cfg, capacity, m)
}

func mustAdmit(t *testing.T, s *Scheduler, c Class) *Ticket {
	t.Helper()
	tk, r := s.Admit(context.Background(), c)
	if r != Admitted {
		t.Fatalf("%s: result %d, want admitted", c, r)
	}
	return tk
}

// queued starts an Admit in the background and waits until it is queued or done.
func queued(s *Scheduler, c Class, out chan<- *Ticket) {
	go func() {
		tk, _ := s.Admit(context.Background(), c)
		out <- tk
	}()
	synctest.Wait()
}

// Freed slots go to the highest class first, FIFO within a class.
func TestOrderingHighestClassFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTest(t, plainConfig(), 1)
		hold := mustAdmit(t, s, Default)
		got := make(chan *Ticket, 5)
		for _, c := range []Class{Bulk, Default, Interactive, Bulk, System} {
			queued(s, c, got)
		}
		var order []Class
		for range 5 {
			hold.Release()
			hold = <-got
			order = append(order, hold.Class())
		}
		want := []Class{System, Interactive, Default, Bulk, Bulk}
		for i := range want {
			if order[i] != want[i] {
				t.Fatalf("admission order %v, want %v", order, want)
			}
		}
	})
}

// A higher class's unused reservation is held back from lower classes; a
// class's own reservation never limits it.
func TestReservationsHoldBackFromLowerClasses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := plainConfig()
		cfg.Classes[Interactive].Reserved = 2
		s := newTest(t, cfg, 4)
		first := mustAdmit(t, s, Bulk)
		mustAdmit(t, s, Bulk)
		got := make(chan *Ticket, 1)
		queued(s, Bulk, got) // 2 free slots, both reserved for interactive
		if d := s.Demand(); d[Bulk].Waiting != 1 || d[Bulk].InFlight != 2 {
			t.Fatalf("bulk demand %+v, want 2 in flight and 1 waiting", d[Bulk])
		}
		mustAdmit(t, s, Interactive)
		last := mustAdmit(t, s, Interactive) // its own reservation: all of it usable
		last.Release()
		synctest.Wait()
		if d := s.Demand(); d[Bulk].Waiting != 1 {
			t.Fatal("bulk took a slot freed inside interactive's reservation")
		}
		first.Release()
		if tk := <-got; tk == nil || tk.Class() != Bulk {
			t.Fatal("bulk waiter not admitted into the unreserved slot freed")
		}
	})
}

// Reservations larger than the capacity scale down proportionally instead of
// locking lower classes out.
func TestReservationsScaleOnShrink(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTest(t, DefaultSchedulerConfig(), 16) // defaults reserve 32 + 128 = 160
		s.mu.Lock()
		sys, inter := s.reserved[System], s.reserved[Interactive]
		s.mu.Unlock()
		if sys != 3 || inter != 12 {
			t.Fatalf("scaled reservations system=%d interactive=%d, want 3 and 12", sys, inter)
		}
		mustAdmit(t, s, Default) // 16 - 15 held back: one slot for the lower classes
		got := make(chan *Ticket, 1)
		queued(s, Default, got)
		s.SetCapacity(Unlimited)
		if tk := <-got; tk == nil {
			t.Fatal("waiter not admitted when the capacity grew")
		}
	})
}

// A queue head older than its starvation threshold is admitted with no other
// event, into a reserved but unused slot, and is counted.
func TestStarvationPromotion(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := plainConfig()
		cfg.Classes[Interactive].Reserved = 1
		cfg.Classes[Bulk].StarvationThreshold = 120 * time.Second
		s := newTest(t, cfg, 2)
		mustAdmit(t, s, Bulk)
		start := time.Now()
		got := make(chan *Ticket, 1)
		queued(s, Bulk, got)
		if tk := <-got; tk == nil || time.Since(start) != 120*time.Second {
			t.Fatalf("starving head admitted after %v (ticket %v), want at 120s", time.Since(start), tk)
		}
		if v := testutil.ToFloat64(s.m.starvation.WithLabelValues("bulk")); v != 1 {
			t.Fatalf("starvation promotions %v, want 1", v)
		}
	})
}

// A starving lower-class head takes the next free slot ahead of a higher
// class that has not waited as long.
func TestStarvingHeadGoesFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := plainConfig()
		cfg.Classes[Bulk].StarvationThreshold = 10 * time.Second
		s := newTest(t, cfg, 1)
		hold := mustAdmit(t, s, Default)
		got := make(chan *Ticket, 2)
		queued(s, Bulk, got)
		time.Sleep(11 * time.Second)
		queued(s, Interactive, got)
		hold.Release()
		tk := <-got
		if tk.Class() != Bulk {
			t.Fatalf("slot went to %s, want the starving bulk head", tk.Class())
		}
		tk.Release()
		(<-got).Release()
	})
}

// A preempting class finding no slot cancels the most recently admitted
// request of the lowest class that has sent nothing yet.
func TestPreemptionPicksLowestClassMostRecent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := plainConfig()
		cfg.Classes[Interactive].CanPreempt = true
		s := newTest(t, cfg, 3)
		def := mustAdmit(t, s, Default)
		oldBulk := mustAdmit(t, s, Bulk)
		newBulk := mustAdmit(t, s, Bulk)
		cancelled := false
		newBulk.OnPreempt(func() { cancelled = true })
		tk := mustAdmit(t, s, Interactive)
		select {
		case <-newBulk.Preempted():
		default:
			t.Fatal("the most recent bulk request was not preempted")
		}
		if !cancelled || newBulk.Start() {
			t.Fatalf("victim: cancel hook ran=%v, Start after preemption must be false", cancelled)
		}
		if !oldBulk.Start() || !def.Start() {
			t.Fatal("others were preempted")
		}
		newBulk.Release() // no double release
		if d := s.Demand(); d[Bulk].InFlight != 1 || d[Interactive].InFlight != 1 {
			t.Fatalf("demand after preemption %+v", d)
		}
		if v := testutil.ToFloat64(s.m.preemption.WithLabelValues("bulk", "interactive")); v != 1 {
			t.Fatalf("preemptions counted %v, want 1", v)
		}
		tk.Release()
	})
}

// A request that has sent a byte is never preempted; the preemptor waits.
func TestStartedRequestIsNeverPreempted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := plainConfig()
		cfg.Classes[System].CanPreempt = true
		s := newTest(t, cfg, 1)
		b := mustAdmit(t, s, Bulk)
		if !b.Start() {
			t.Fatal("Start failed")
		}
		got := make(chan *Ticket, 1)
		queued(s, System, got)
		select {
		case <-b.Preempted():
			t.Fatal("a started request was preempted")
		default:
		}
		b.Release()
		if tk := <-got; tk == nil {
			t.Fatal("preemptor not admitted after the release")
		}
	})
}

// The race between a victim's first byte and its preemption: exactly one
// wins, every time (the preemptor that loses waits its queue timeout out on
// the bubble's clock).
func TestPreemptionRaceAgainstFirstByte(t *testing.T) {
	synctest.Test(t, testPreemptionRace)
}

func testPreemptionRace(t *testing.T) {
	cfg := plainConfig()
	cfg.Classes[Interactive].CanPreempt = true
	cfg.Classes[Interactive].QueueTimeout = time.Millisecond
	for range 500 {
		s := newTest(t, cfg, 1)
		b := mustAdmit(t, s, Bulk)
		var started bool
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); started = b.Start() }()
		tk, r := s.Admit(context.Background(), Interactive)
		wg.Wait()
		preempted := false
		select {
		case <-b.Preempted():
			preempted = true
		default:
		}
		if started == preempted {
			t.Fatalf("started=%v preempted=%v: exactly one must win", started, preempted)
		}
		if preempted != (r == Admitted) {
			t.Fatalf("preempted=%v but the preemptor's result was %d", preempted, r)
		}
		if tk != nil {
			tk.Release()
		}
		b.Release()
	}
}

// A full queue answers at once; a wait past the class's timeout ends at that
// timeout exactly; a client that leaves frees its place.
func TestQueueFullTimeoutAndCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := plainConfig()
		cfg.Classes[Default].QueueSize = 1
		cfg.Classes[Default].QueueTimeout = 60 * time.Second
		s := newTest(t, cfg, 1)
		mustAdmit(t, s, Default)
		start := time.Now()
		res := make(chan Result, 1)
		go func() { _, r := s.Admit(context.Background(), Default); res <- r }()
		synctest.Wait()
		if _, r := s.Admit(context.Background(), Default); r != QueueFull {
			t.Fatalf("second waiter: %d, want queue full", r)
		}
		if r := <-res; r != QueueTimeout || time.Since(start) != 60*time.Second {
			t.Fatalf("waiter: %d after %v, want timeout at 60s", r, time.Since(start))
		}
		ctx, cancel := context.WithCancel(context.Background())
		go func() { _, r := s.Admit(ctx, Default); res <- r }()
		synctest.Wait()
		cancel()
		if r := <-res; r != Cancelled {
			t.Fatalf("cancelled waiter: %d", r)
		}
		if d := s.Demand(); d[Default].Waiting != 0 {
			t.Fatalf("queue place not freed: %+v", d[Default])
		}
		for outcome, want := range map[string]float64{OutcomeQueueFull: 1, OutcomeQueueTimeout: 1, OutcomeClientCancelled: 1, OutcomeAdmitted: 1} {
			if v := testutil.ToFloat64(s.m.admit.WithLabelValues("default", outcome)); v != want {
				t.Errorf("admit_total{outcome=%s} = %v, want %v", outcome, v, want)
			}
		}
	})
}

// Capacity 0 (no share granted yet) queues everyone; a grant admits them.
func TestCapacityGrantAdmitsWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTest(t, plainConfig(), 0)
		got := make(chan *Ticket, 2)
		queued(s, Default, got)
		queued(s, Bulk, got)
		s.SetCapacity(2)
		if a, b := <-got, <-got; a == nil || b == nil {
			t.Fatal("waiters not admitted after the grant")
		}
		if v := testutil.ToFloat64(s.m.utilization); v != 1 {
			t.Fatalf("utilization %v, want 1", v)
		}
	})
}

// reserveDemandRun offers interactive arrivals at rate per second for 5 s
// (each holding its slot for hold), then counts the bulk requests admitted
// at once (bulk never queues) and returns them with interactive's
// reservation then in force.
func reserveDemandRun(t *testing.T, cfg SchedulerConfig, capacity int64, rate int, hold time.Duration) (bulk int, reserved int64) {
	s := newTest(t, cfg, capacity)
	var wg sync.WaitGroup
	for range 5 * rate {
		tk := mustAdmit(t, s, Interactive)
		wg.Add(1)
		go func() { defer wg.Done(); time.Sleep(hold); tk.Release() }()
		time.Sleep(time.Second / time.Duration(rate))
	}
	time.Sleep(50 * time.Millisecond)
	synctest.Wait()
	for {
		if _, r := s.Admit(context.Background(), Bulk); r != Admitted {
			break
		}
		bulk++
	}
	s.mu.Lock()
	reserved = s.reserved[Interactive]
	s.mu.Unlock()
	wg.Wait()
	return bulk, reserved
}

// With reserve_demand, interactive's reservation follows its arrivals
// (rate × holding time plus a margin): under a heavy interactive stream bulk
// gets only what that leaves; under a light one, nearly everything; with the
// key off, SMG's static reservation alone applies.
func TestReserveDemandFollowsArrivals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := plainConfig()
		cfg.Classes[Bulk].QueueSize = 0
		static, _ := reserveDemandRun(t, cfg, 20, 10, time.Second)
		if static != 11 { // 9 interactive in flight, nothing reserved
			t.Fatalf("without reserve_demand bulk got %d slots, want the 11 free", static)
		}
		cfg.Classes[Interactive].ReserveDemand = true
		heavy, r := reserveDemandRun(t, cfg, 20, 10, time.Second)
		if r < 12 || r > 14 { // 10 slots of demand plus about sqrt(10)
			t.Fatalf("interactive reservation %d under 10 req/s of 1 s each, want 12-14", r)
		}
		if want := 20 - int(r); heavy != want {
			t.Fatalf("bulk got %d slots under heavy interactive demand, want %d (capacity - reservation)", heavy, want)
		}
		light, r := reserveDemandRun(t, cfg, 20, 2, time.Second)
		if r > 4 || light != 20-int(r) {
			t.Fatalf("light demand: reservation %d, bulk %d; want <= 4 and the rest", r, light)
		}
	})
}

// A demand reservation never exceeds the capacity, keeps the configured
// floor, and falls back to it once the class's arrivals stop.
func TestReserveDemandBoundsAndDecay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := plainConfig()
		cfg.Classes[Interactive].ReserveDemand = true
		cfg.Classes[Interactive].Reserved = 3
		cfg.Classes[Bulk].QueueSize = 0
		s := newTest(t, cfg, 8)
		for range 40 { // 20/s of 1 s each: 20 slots of demand on 8
			tk := mustAdmit(t, s, Interactive)
			go func() { time.Sleep(time.Second); tk.Release() }()
			time.Sleep(50 * time.Millisecond)
		}
		s.mu.Lock()
		if r := s.reserved[Interactive]; r != 8 {
			t.Errorf("reservation %d under demand far over capacity 8, want 8", r)
		}
		s.mu.Unlock()
		time.Sleep(30 * time.Second) // the stream stopped; every slot freed, no event since
		// The reservation decayed to the configured 3 without an interactive arrival.
		for range 5 {
			mustAdmit(t, s, Bulk)
		}
		s.mu.Lock()
		r := s.reserved[Interactive]
		s.mu.Unlock()
		if r != 3 {
			t.Fatalf("reservation %d after the arrivals stopped, want the configured 3", r)
		}
		if _, res := s.Admit(context.Background(), Bulk); res != QueueFull {
			t.Fatalf("bulk past capacity - reservation: %d, want refused", res)
		}
	})
}
