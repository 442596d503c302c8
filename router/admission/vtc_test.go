package admission

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// fairConfig turns fair shares on; a tenant over its share waits (the
// ordering tests fill the queues), except in TestOverFairShareRefused.
func fairConfig(weights map[string]float64) SchedulerConfig {
	c := plainConfig()
	c.FairShare, c.FairShareWait = true, true
	for k, w := range weights {
		c.TenantWeight[k] = w
	}
	return c
}

// queuedFor starts an AdmitTenant in the background and waits until it is
// queued or done.
func queuedFor(s *Scheduler, c Class, tenant string, out chan<- *Ticket) {
	go func() {
		tk, _ := s.AdmitTenant(context.Background(), c, tenant)
		out <- tk
	}()
	synctest.Wait()
}

func tenantOf(tk *Ticket) string { return tk.tenant.name }

// serve releases hold and each ticket that follows, charging each n tokens,
// and returns the tenants in the order the freed slot went to them.
func serve(hold *Ticket, got <-chan *Ticket, count int, n int64) string {
	var order []string
	for range count {
		hold.Release()
		hold = <-got
		hold.Charge(n, PromptTokenWeight)
		order = append(order, tenantOf(hold))
	}
	hold.Release()
	return strings.Join(order, ",")
}

// A tenant returning from idle is lifted to the lowest counter of the active
// tenants: it cannot spend, in a burst, the credit it did not use while the
// other was served.
func TestVTCNoBankingWhileIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTest(t, fairConfig(nil), 1)
		hold, r := s.AdmitTenant(context.Background(), Default, "auth:a")
		if r != Admitted {
			t.Fatal(r)
		}
		hold.Charge(1000, PromptTokenWeight) // a was served while b sent nothing
		got := make(chan *Ticket, 6)
		for range 3 {
			queuedFor(s, Default, "auth:a", got)
		}
		for range 3 {
			queuedFor(s, Default, "auth:b", got)
		}
		if c := s.fair.tenants["auth:b"].counter; c != 1000 {
			t.Fatalf("b's counter on return = %v, want lifted to a's 1000", c)
		}
		// Equal counters: the older waiter first, then by counter.
		if got, want := serve(hold, got, 6, 100), "auth:a,auth:b,auth:a,auth:b,auth:a,auth:b"; got != want {
			t.Fatalf("order %s, want %s (b must not spend a's 1000 tokens of service as credit)", got, want)
		}
	})
}

// With nobody active, a returning tenant is lifted to the counter of the
// last tenant that went idle.
func TestVTCLiftWhenNobodyActive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTest(t, fairConfig(nil), 1)
		a, _ := s.AdmitTenant(context.Background(), Default, "auth:a")
		a.Charge(500, OutputTokenWeight)
		a.Release()
		b, _ := s.AdmitTenant(context.Background(), Default, "auth:b")
		if c := s.fair.tenants["auth:b"].counter; c != 1000 {
			t.Fatalf("b's counter = %v, want the idle floor 1000", c)
		}
		b.Release()
		if s.fair.active != 0 {
			t.Fatalf("active tenants = %d after every request ended", s.fair.active)
		}
	})
}

// Weights: a tenant of weight 3 gets three times the service of a tenant of
// weight 1 when both keep the queue full.
func TestVTCWeightsRespected(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := fairConfig(map[string]float64{"auth:big": 3})
		cfg.Classes[Default].QueueSize = 100
		s := newTest(t, cfg, 1)
		hold, _ := s.AdmitTenant(context.Background(), Default, "auth:small")
		got := make(chan *Ticket, 100)
		for range 40 {
			queuedFor(s, Default, "auth:big", got)
			queuedFor(s, Default, "auth:small", got)
		}
		order := strings.Split(serve(hold, got, 80, 90), ",")
		big := 0
		for _, tn := range order[:40] {
			if tn == "auth:big" {
				big++
			}
		}
		if big < 29 || big > 31 {
			t.Fatalf("weight 3 tenant got %d of 40 slots, want 30 (order %v)", big, order)
		}
	})
}

// The lowest counter goes first within a class; a higher class still goes
// before any counter.
func TestVTCOrderWithinClass(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTest(t, fairConfig(nil), 1)
		hold, _ := s.AdmitTenant(context.Background(), Default, "auth:heavy")
		got := make(chan *Ticket, 3)
		queuedFor(s, Default, "auth:heavy", got) // oldest, but heavy's counter will be highest
		queuedFor(s, Default, "auth:light", got)
		queuedFor(s, Bulk, "auth:light", got)
		hold.Charge(50, PromptTokenWeight)
		var order []string
		for range 3 {
			hold.Release()
			hold = <-got
			order = append(order, hold.Class().String()+"/"+tenantOf(hold))
		}
		hold.Release()
		want := "default/auth:light,default/auth:heavy,bulk/auth:light"
		if got := strings.Join(order, ","); got != want {
			t.Fatalf("order %s, want %s", got, want)
		}
	})
}

// A tenant that would wait while it holds its fair share and another tenant
// is active is refused at once; alone, or under its share, it waits.
func TestOverFairShareRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := fairConfig(nil)
		cfg.FairShareWait = false
		s := newTest(t, cfg, 4)
		var held []*Ticket
		for range 4 {
			tk, r := s.AdmitTenant(context.Background(), Default, "auth:a")
			if r != Admitted {
				t.Fatal(r)
			}
			held = append(held, tk)
		}
		got := make(chan *Ticket, 4)
		queuedFor(s, Default, "auth:a", got) // alone: the fleet is full, a waits
		if s.fair.tenants["auth:a"].waiting != 1 {
			t.Fatal("a alone over capacity must wait, not be refused")
		}
		queuedFor(s, Default, "auth:b", got) // b holds nothing: under its share, waits
		if s.fair.tenants["auth:b"].waiting != 1 {
			t.Fatal("b under its share must wait")
		}
		// a now holds 4 and waits for 1 while b wants 1: a's share is 3.
		if _, r := s.AdmitTenant(context.Background(), Default, "auth:a"); r != OverFairShare {
			t.Fatalf("a over its share: result %d, want OverFairShare", r)
		}
		if v := testutil.ToFloat64(s.m.overShare.WithLabelValues("auth:a")); v != 1 {
			t.Fatalf("smg_scheduler_fair_share_refused_total{tenant=auth:a} = %v", v)
		}
		// b asking for a second slot is still within its share of 2.
		queuedFor(s, Default, "auth:b", got)
		if s.fair.tenants["auth:b"].waiting != 2 {
			t.Fatal("b within its share must wait")
		}
		// A slot frees while a holds 3 of 4 and b wants 2: a's share is 2.
		// a's waiter, queued while a was alone, is refused now (its share is
		// checked again when a slot could go to it), and b's takes the slot.
		held[0].Release()
		var admitted []*Ticket
		for range 2 {
			if tk := <-got; tk != nil {
				admitted = append(admitted, tk)
			}
		}
		if len(admitted) != 1 || tenantOf(admitted[0]) != "auth:b" {
			t.Fatalf("admitted from the queue %d tickets, want only b's waiter (a holds its share)", len(admitted))
		}
		if v := testutil.ToFloat64(s.m.overShare.WithLabelValues("auth:a")); v != 2 {
			t.Fatalf("smg_scheduler_fair_share_refused_total{tenant=auth:a} = %v, want 2", v)
		}
		held[1].Release() // b's second waiter takes it
		tk := <-got
		if tk == nil || tenantOf(tk) != "auth:b" {
			t.Fatal("b's second waiter did not get the freed slot")
		}
		for _, h := range append(held[2:], admitted[0], tk) {
			h.Release()
		}
	})
}

func TestFairShareWaterFilling(t *testing.T) {
	d := func(name string, w float64, n int64) TenantDemand {
		return TenantDemand{Tenant: name, Weight: w, Demand: n}
	}
	for _, tc := range []struct {
		cap     float64
		demands []TenantDemand
		tenant  string
		want    float64
	}{
		{10, []TenantDemand{d("a", 1, 100), d("b", 1, 3)}, "a", 7},
		{10, []TenantDemand{d("a", 1, 100), d("b", 1, 3)}, "b", 3},
		{10, []TenantDemand{d("a", 1, 100), d("b", 1, 100)}, "a", 5},
		{12, []TenantDemand{d("a", 3, 100), d("b", 1, 100)}, "a", 9},
		{12, []TenantDemand{d("a", 1, 100), d("b", 1, 100), d("c", 2, 1)}, "b", 5.5},
		{12, []TenantDemand{d("a", 1, 100)}, "x", 0},
	} {
		if got := fairShare(tc.cap, tc.demands, tc.tenant); got != tc.want {
			t.Errorf("fairShare(%v, %v, %s) = %v, want %v", tc.cap, tc.demands, tc.tenant, got, tc.want)
		}
	}
}
