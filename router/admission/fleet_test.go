package admission

import (
	"context"
	"fmt"
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

// floodBeside runs, on s, a flooding tenant (a request every 5 ms, each
// holding its slot 300 ms) beside steady (a request every 100 ms, each
// holding 300 ms: 3 slots busy) for n steady requests, refreshing the
// relayed other routers' tenants every 250 ms as the control plane would.
// It returns the most slots the flood held here once the stream's rate is
// known, the flood's refusals, and how many of the stream's requests after
// the first 10 waited for a slot. The stream is never refused.
func floodBeside(t *testing.T, s *Scheduler, steady string, n int, relay []TenantDemand) (floodMax, refused, waited int) {
	t.Helper()
	start := time.Now()
	ctx, stop := context.WithCancel(context.Background())
	var mu sync.Mutex
	held := 0
	go func() {
		for ctx.Err() == nil {
			if relay != nil {
				s.SetFleetTenants(relay)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}()
	go func() {
		for ctx.Err() == nil {
			switch tk, r := s.AdmitTenant(ctx, Default, "auth:flood"); r {
			case Admitted:
				mu.Lock()
				held++
				if time.Since(start) > time.Second {
					floodMax = max(floodMax, held)
				}
				mu.Unlock()
				go func() {
					time.Sleep(300 * time.Millisecond)
					mu.Lock()
					held--
					mu.Unlock()
					tk.Release()
				}()
			case OverFairShare:
				mu.Lock()
				refused++
				mu.Unlock()
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	for i := range n {
		began := time.Now()
		tk, r := s.AdmitTenant(context.Background(), Default, steady)
		if r != Admitted {
			t.Fatalf("the steady tenant was refused (%d)", r)
		}
		if time.Since(began) > 0 && i >= 10 {
			waited++
		}
		go func() {
			time.Sleep(300 * time.Millisecond)
			tk.Release()
		}()
		time.Sleep(100 * time.Millisecond)
	}
	stop()
	time.Sleep(time.Second)
	mu.Lock()
	defer mu.Unlock()
	return floodMax, refused, waited
}

// Fleet-wide, a flooding tenant under its fleet-wide share (it holds 8
// elsewhere of the 16 the fleet's 24 leave it) would fill this router's 8
// slots; an under-share tenant streaming 3 slots' worth through it keeps
// headroom here: the part of its weighted share it does not hold fleet-wide,
// in proportion to its demand here (3 of 8), up to its burst here (7 less
// the 3 it holds). The flood is held to the rest and refused past it, and
// the stream never waits. The headroom follows the weights (one more slot
// for the flood between the end of a stream's request and the next arrival):
//   - weight 1: (12 - 6) × 3/8 = 2.25, 2 slots kept: the flood holds at most 8-3-2 = 3;
//   - weight 3: (18 - 6) × 3/8 = 4.5, capped at the burst 4: the flood holds at most 1.
func TestUnderShareTenantKeepsHeadroomOnEveryRouter(t *testing.T) {
	for _, tc := range []struct {
		weight   float64
		floodMax int
	}{{1, 3}, {3, 1}} {
		t.Run(fmt.Sprintf("weight %v", tc.weight), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := refusedCfg()
				cfg.TenantWeight["auth:steady"] = tc.weight
				s := newTest(t, cfg, 8)
				s.SetFleetCapacity(24)
				relay := []TenantDemand{
					{Tenant: "auth:flood", Weight: 1, InFlight: 8, Demand: 100},
					{Tenant: "auth:steady", Weight: tc.weight, InFlight: 3, Demand: 5},
				}
				floodMax, refused, waited := floodBeside(t, s, "auth:steady", 50, relay)
				if floodMax < tc.floodMax || floodMax > tc.floodMax+1 || refused == 0 {
					t.Fatalf("the flood held up to %d slots here, refused %d times: want it held to %d", floodMax, refused, tc.floodMax)
				}
				if waited > 0 {
					t.Fatalf("the steady tenant waited for a slot %d times of its last 40 requests", waited)
				}
			})
		})
	}
}

// A tenant's headroom is what its arrivals keep busy: it cannot bank it
// while it sends nothing. Once the stream stops, its claim decays with its
// rate and the flood may take the router's every slot (its fleet-wide share
// allows it: the stream's tenant is still active elsewhere).
func TestHeadroomLapsesWhileIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTest(t, refusedCfg(), 8)
		s.SetFleetCapacity(24)
		relay := []TenantDemand{{Tenant: "auth:flood", Weight: 1, InFlight: 8, Demand: 100}, {Tenant: "auth:steady", Weight: 1, InFlight: 3, Demand: 5}}
		if floodMax, _, _ := floodBeside(t, s, "auth:steady", 30, relay); floodMax > 4 {
			t.Fatalf("the flood held %d slots beside the stream, want at most 4", floodMax)
		}
		time.Sleep(15 * time.Second) // the stream sends nothing here
		s.SetFleetTenants(relay)
		held := admitN(t, s, "auth:flood", 8)
		if _, r := s.AdmitTenant(context.Background(), Default, "auth:flood"); r == Admitted {
			t.Fatal("admitted past the router's capacity")
		}
		for _, h := range held {
			h.Release()
		}
	})
}

// The headroom binds only a tenant past its weighted share: a tenant within
// it takes every free slot, even those another tenant's headroom would keep
// (it borrows nothing; at most it waits for capacity).
func TestWithinWeightedShareNeverHeldBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTest(t, refusedCfg(), 8)
		s.SetFleetCapacity(24)
		s.SetFleetTenants([]TenantDemand{{Tenant: "auth:a", Weight: 1, InFlight: 2, Demand: 4}})
		for range 4 { // a sends here too, under its weighted share of 12: it has headroom here
			tk := admitN(t, s, "auth:a", 1)[0]
			time.Sleep(100 * time.Millisecond)
			tk.Release()
		}
		held := admitN(t, s, "auth:b", 1)
		s.mu.Lock()
		b := s.fair.tenants["auth:b"]
		ds, _, _ := s.demandsLocked(b, s.fleet.others, time.Now())
		claims := s.headroomLocked(b, ds, 24, weightSum(ds), time.Now())
		s.mu.Unlock()
		if claims == 0 {
			t.Fatal("a keeps no headroom here")
		}
		held = append(held, admitN(t, s, "auth:b", 7)...) // b within its weighted share: every slot
		got := make(chan *Ticket, 1)
		queuedFor(s, Default, "auth:b", got) // the router is full: b waits for capacity
		if w := s.fair.tenants["auth:b"].waiting; w != 1 {
			t.Fatalf("b within its weighted share past the capacity: %d waiting, want 1", w)
		}
		for _, h := range held {
			h.Release()
		}
		if tk := <-got; tk == nil {
			t.Fatal("b's waiter was refused")
		} else {
			tk.Release()
		}
	})
}
