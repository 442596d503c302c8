package admission

import (
	"testing"
	"testing/synctest"
	"time"
)

// newcomerCfg is refusedCfg with newcomer_headroom on.
func newcomerCfg() SchedulerConfig {
	c := refusedCfg()
	c.NewcomerHeadroom = true
	return c
}

// arriveEvery sends n requests of tenant, one every gap, and returns the
// tickets of those admitted and how many were refused over their share.
func arriveEvery(t *testing.T, s *Scheduler, tenant string, n int, gap time.Duration) (held []*Ticket, refused int) {
	t.Helper()
	for range n {
		switch tk, r := s.AdmitTenant(t.Context(), Default, tenant); r {
		case Admitted:
			held = append(held, tk)
		case OverFairShare:
			refused++
		default:
			t.Fatalf("%s: result %d, want admitted or over its fair share", tenant, r)
		}
		time.Sleep(gap)
	}
	return held, refused
}

func releaseAll(ts []*Ticket) {
	for _, tk := range ts {
		tk.Release()
	}
}

// With newcomer_headroom, a stream that floods from its first arrival holds
// at most half of 8 slots in its first holding time (the share it would have
// beside a tenant not seen yet), so that tenant's first request finds a free
// slot at once; once the holding time has passed, the stream alone takes
// every slot. Without the key the same flood takes all 8 at once.
func TestNewcomerHeadroomYoungStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTest(t, newcomerCfg(), 8)
		flood, refused := arriveEvery(t, s, "auth:flood", 12, 10*time.Millisecond)
		if len(flood) != 4 || refused != 8 {
			t.Fatalf("young flood: %d admitted, %d refused, want 4 and 8", len(flood), refused)
		}
		steady := admitN(t, s, "auth:steady", 1) // a newcomer: a free slot at once
		releaseAll(steady)
		time.Sleep(DefaultHoldPrior) // past the flood's first holding time
		more, refused := arriveEvery(t, s, "auth:flood", 4, 10*time.Millisecond)
		if len(more) != 4 || refused != 0 {
			t.Fatalf("flood past its first holding time, alone: %d more admitted, %d refused, want 4 (all 8) and none", len(more), refused)
		}
		releaseAll(append(flood, more...))
	})
	synctest.Test(t, func(t *testing.T) {
		s := newTest(t, refusedCfg(), 8)
		flood, refused := arriveEvery(t, s, "auth:flood", 8, 10*time.Millisecond)
		if len(flood) != 8 || refused != 0 {
			t.Fatalf("newcomer_headroom off: %d admitted, %d refused, want all 8", len(flood), refused)
		}
		releaseAll(flood)
	})
}

// The newcomer's share is weighted: a stream of weight 3 beside a newcomer
// of the default weight 1 holds 6 of 8; a young stream that wants less than
// its share (two requests at once) is never held back.
func TestNewcomerHeadroomWeighted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTest(t, newcomerCfg(), 8)
		s.cfg.TenantWeight["auth:gold"] = 3
		gold, refused := arriveEvery(t, s, "auth:gold", 10, 10*time.Millisecond)
		if len(gold) != 6 || refused != 4 {
			t.Fatalf("young flood of weight 3: %d admitted, %d refused, want 6 and 4", len(gold), refused)
		}
		small := admitN(t, s, "auth:small", 2)
		releaseAll(append(gold, small...))
	})
}

// Fleet-wide: once the relay carries the stream from the other routers, it
// is held to its share of the fleet's capacity there and here; before any
// relay, to its part of this router's capacity.
func TestNewcomerHeadroomFleetWide(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTest(t, newcomerCfg(), 8)
		s.SetFleetCapacity(16)
		s.SetFleetTenants(nil)
		// The other router holds 6 of the flood's requests: its share of 16
		// beside a newcomer is 8, so it gets 2 here.
		s.SetFleetTenants([]TenantDemand{{Tenant: "auth:flood", Weight: 1, InFlight: 6, Demand: 6, Mean: 20}})
		flood, refused := arriveEvery(t, s, "auth:flood", 6, 10*time.Millisecond)
		if len(flood) != 2 || refused != 4 {
			t.Fatalf("young flood relayed holding 6 of its 8 fleet-wide: %d admitted here, %d refused, want 2 and 4", len(flood), refused)
		}
		releaseAll(flood)
	})
	synctest.Test(t, func(t *testing.T) {
		s := newTest(t, newcomerCfg(), 8)
		s.SetFleetCapacity(16)
		s.SetFleetTenants(nil) // nothing relayed of it yet: half of this router's 8
		flood, refused := arriveEvery(t, s, "auth:flood", 8, 10*time.Millisecond)
		if len(flood) != 4 || refused != 4 {
			t.Fatalf("young flood not relayed yet: %d admitted here, %d refused, want 4 and 4", len(flood), refused)
		}
		releaseAll(flood)
	})
}

// A stream the other routers have relayed for a while, wanting about its
// newcomer share of the fleet (a third of 32 beside a flood and a tenant not
// seen yet), reaches this router late: its first holding time here has just
// begun, and its fleet-wide mean from a few arrivals (11.3 slots) is past
// that share by less than the noise of its count. It is never held back by
// the newcomer share: a burst of it takes what the flood leaves.
func TestNewcomerShareBeyondNoise(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTest(t, newcomerCfg(), 11)
		s.SetFleetCapacity(32)
		s.SetFleetTenants([]TenantDemand{
			{Tenant: "auth:flood", Weight: 1, InFlight: 18, Demand: 86, Mean: 84},
			{Tenant: "auth:steady", Weight: 1, InFlight: 10, Demand: 11, Mean: 10},
		})
		steady, refused := arriveEvery(t, s, "auth:steady", 4, 100*time.Millisecond)
		if len(steady) != 4 || refused != 0 {
			t.Fatalf("steady tenant near its newcomer share, young here: %d admitted, %d refused, want 4 and 0", len(steady), refused)
		}
		releaseAll(steady)
	})
}

// The relay lags a flood's onset: one taken at its first arrivals on the
// other routers carries a mean of nothing or next to nothing. Here the
// flood is still held to its part of this router's capacity (half of 12)
// once its arrivals here show its rate, instead of taking every slot until
// the next relay says so fleet-wide.
func TestNewcomerHeadroomRelayLagsOnset(t *testing.T) {
	for _, mean := range []float64{0, 2.5} {
		synctest.Test(t, func(t *testing.T) {
			s := newTest(t, newcomerCfg(), 12)
			s.SetFleetCapacity(32)
			s.SetFleetTenants([]TenantDemand{{Tenant: "auth:flood", Weight: 1, InFlight: 2, Demand: 2, Mean: mean}})
			flood, refused := arriveEvery(t, s, "auth:flood", 12, 25*time.Millisecond)
			if len(flood) != 6 || refused != 6 {
				t.Fatalf("young flood relayed with a mean of %.1f: %d admitted here, %d refused, want 6 (half of 12) and 6", mean, len(flood), refused)
			}
			releaseAll(flood)
		})
	}
}
