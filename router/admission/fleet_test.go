package admission

import (
	"context"
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
// hold or wait for its fleet-wide share and no more. Once the relay is
// older than FleetTenantsTTL, the router's own view applies again.
func TestFleetWideFairShare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTest(t, refusedCfg(), 4)
		held := admitN(t, s, "auth:a", 4)
		s.SetFleetCapacity(12)
		// Another router serves b 8 slots and holds 2 of its requests waiting.
		s.SetFleetTenants([]TenantDemand{{Tenant: "auth:b", Weight: 1, InFlight: 8, Waiting: 2}})
		got := make(chan *Ticket, 3)
		// a's fleet-wide share of 12 against b's 10: 6 slots, held or waiting.
		queuedFor(s, Default, "auth:a", got)
		queuedFor(s, Default, "auth:a", got)
		if w := s.fair.tenants["auth:a"].waiting; w != 2 {
			t.Fatalf("a waits for %d, want 2 (within its fleet-wide share of 6)", w)
		}
		if _, r := s.AdmitTenant(context.Background(), Default, "auth:a"); r != OverFairShare {
			t.Fatalf("a past its fleet-wide share: result %d, want OverFairShare", r)
		}
		time.Sleep(FleetTenantsTTL + time.Second) // the control plane went silent
		queuedFor(s, Default, "auth:a", got)
		if w := s.fair.tenants["auth:a"].waiting; w != 3 {
			t.Fatalf("relay stale: a alone in this router waits (%d waiting, want 3)", w)
		}
		for _, h := range held {
			h.Release()
		}
		for range 3 {
			(<-got).Release()
		}
	})
}

// A tenant over its fleet-wide share does not take a free slot of this
// router while another tenant waits elsewhere in the fleet; with nobody
// waiting it does (the slot would go unused).
func TestFleetWideYieldsToWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTest(t, refusedCfg(), 10)
		held := admitN(t, s, "auth:a", 6)
		s.SetFleetCapacity(12)
		s.SetFleetTenants([]TenantDemand{{Tenant: "auth:b", Weight: 1, InFlight: 5, Waiting: 1}})
		if _, r := s.AdmitTenant(context.Background(), Default, "auth:a"); r != OverFairShare {
			t.Fatalf("a at its share of 6 while b waits: result %d, want OverFairShare", r)
		}
		s.SetFleetTenants([]TenantDemand{{Tenant: "auth:b", Weight: 1, InFlight: 5}})
		held = append(held, admitN(t, s, "auth:a", 1)...)
		for _, h := range held {
			h.Release()
		}
		if got := s.Tenants(); len(got) != 0 {
			t.Fatalf("tenants reported after every request ended: %v", got)
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
