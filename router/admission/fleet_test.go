package admission

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

func refusedCfg() SchedulerConfig {
	c := fairConfig(nil)
	c.FairShareWait = false
	return c
}

func admitN(t *testing.T, s *Scheduler, tenant string, n int) []*Ticket {
	t.Helper()
	var out []*Ticket
	for range n {
		tk, r := s.AdmitTenant(context.Background(), Default, tenant)
		if r != Admitted {
			t.Fatalf("%s: result %d, want admitted", tenant, r)
		}
		out = append(out, tk)
	}
	return out
}

// With the other routers' tenants relayed, a tenant alone in this router is
// weighed against its fleet-wide demand and the fleet's capacity: it may
// hold its fleet-wide share and no more. Once the relay is older than
// FleetTenantsTTL, the router's own view applies again.
func TestFleetWideFairShare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTest(t, refusedCfg(), 4)
		held := admitN(t, s, "auth:a", 4)
		s.SetFleetCapacity(8)
		// Another router serves b 4 slots and holds 4 of its requests waiting.
		s.SetFleetTenants([]TenantDemand{{Tenant: "auth:b", Weight: 1, InFlight: 4, Waiting: 4}})
		if _, r := s.AdmitTenant(context.Background(), Default, "auth:a"); r != OverFairShare {
			t.Fatalf("a holding its fleet-wide share of 4 of 8: result %d, want OverFairShare", r)
		}
		got := make(chan *Ticket, 2)
		// b wants one slot: a's share is 7, it waits for this router's capacity.
		s.SetFleetTenants([]TenantDemand{{Tenant: "auth:b", Weight: 1, InFlight: 1}})
		queuedFor(s, Default, "auth:a", got)
		if w := s.fair.tenants["auth:a"].waiting; w != 1 {
			t.Fatalf("a under its fleet-wide share: %d waiting, want 1", w)
		}
		s.SetFleetTenants([]TenantDemand{{Tenant: "auth:b", Weight: 1, InFlight: 4, Waiting: 4}})
		time.Sleep(FleetTenantsTTL + time.Second) // the control plane went silent
		queuedFor(s, Default, "auth:a", got)
		if w := s.fair.tenants["auth:a"].waiting; w != 2 {
			t.Fatalf("relay stale: a alone in this router waits (%d waiting, want 2)", w)
		}
		for _, h := range held {
			h.Release()
		}
		for range 2 {
			(<-got).Release()
		}
	})
}

// A tenant at its fleet-wide share is refused even while this router has
// free slots: they are kept for the other tenant's next arrivals. When the
// other's demand falls, the share grows and it is admitted.
func TestFleetWideShareHoldsWithFreeSlots(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTest(t, refusedCfg(), 10)
		held := admitN(t, s, "auth:a", 6)
		s.SetFleetCapacity(12)
		s.SetFleetTenants([]TenantDemand{{Tenant: "auth:b", Weight: 1, InFlight: 5, Waiting: 1}})
		if _, r := s.AdmitTenant(context.Background(), Default, "auth:a"); r != OverFairShare {
			t.Fatalf("a at its share of 6 (b wants 6 of 12): result %d, want OverFairShare", r)
		}
		s.SetFleetTenants([]TenantDemand{{Tenant: "auth:b", Weight: 1, InFlight: 5}})
		held = append(held, admitN(t, s, "auth:a", 1)...)
		for _, h := range held {
			h.Release()
		}
	})
}

// A tenant with a steady stream keeps room for its next arrivals while
// another floods: its demand is what its arrivals keep busy (Little's law),
// not only what it holds at the instant, so the flood is held under the
// capacity minus that and, once its rate is known, the stream's requests
// never wait.
func TestSteadyTenantKeepsHeadroom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTest(t, refusedCfg(), 8)
		start := time.Now()
		ctx, stop := context.WithCancel(context.Background())
		var mu sync.Mutex
		var aHeld, aMax, refused int
		hold := func(tk *Ticket, a bool) {
			time.Sleep(300 * time.Millisecond)
			if a {
				mu.Lock()
				aHeld--
				mu.Unlock()
			}
			tk.Release()
		}
		go func() { // a floods: a request every 5 ms, each holding its slot 300 ms
			for ctx.Err() == nil {
				switch tk, r := s.AdmitTenant(ctx, Default, "auth:a"); r {
				case Admitted:
					mu.Lock()
					aHeld++
					if time.Since(start) > 2*time.Second {
						aMax = max(aMax, aHeld)
					}
					mu.Unlock()
					go hold(tk, true)
				case OverFairShare:
					mu.Lock()
					refused++
					mu.Unlock()
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
		waited := 0
		for i := range 50 { // b: a request every 100 ms, each holding its slot 300 ms
			began := time.Now()
			tk, r := s.AdmitTenant(context.Background(), Default, "auth:b")
			if r != Admitted {
				t.Fatalf("b refused (%d)", r)
			}
			if time.Since(began) > 0 && i >= 10 {
				waited++
			}
			go hold(tk, false)
			time.Sleep(100 * time.Millisecond)
		}
		stop()
		time.Sleep(time.Second)
		mu.Lock()
		defer mu.Unlock()
		// b keeps 3 slots busy on average; its demand is that plus a margin.
		if refused == 0 || aMax > 8-3 {
			t.Fatalf("a held up to %d slots, refused %d times: want it held to 8 minus b's steady 3 or more", aMax, refused)
		}
		if waited > 0 {
			t.Fatalf("b waited for a slot %d times of its last 40 requests", waited)
		}
	})
}

// The report lists the active tenants with their weights and counts.
func TestTenantsReported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTest(t, fairConfig(map[string]float64{"auth:a": 3}), 1)
		hold := admitN(t, s, "auth:a", 1)[0]
		got := make(chan *Ticket, 1)
		queuedFor(s, Default, "auth:b", got)
		ts := map[string]TenantDemand{}
		for _, d := range s.Tenants() {
			ts[d.Tenant] = d
		}
		if a, b := ts["auth:a"], ts["auth:b"]; len(ts) != 2 || a.Weight != 3 || a.InFlight != 1 || b.Waiting != 1 || b.Weight != 1 {
			t.Fatalf("reported %v", ts)
		}
		hold.Release()
		(<-got).Release()
	})
}
