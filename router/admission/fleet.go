package admission

import (
	"math"
	"sort"
	"time"
)

// FleetTenantsTTL is how long the other routers' tenants, as the control
// plane last relayed them, are used: past it (the control plane is silent)
// fair shares fall back to this router's own view.
const FleetTenantsTTL = 3 * time.Second

// maxReportedTenants bounds the tenants a report carries (the largest by
// demand), as the control plane bounds what it keeps.
const maxReportedTenants = 1024

// fleetTenants is what the control plane relayed of the other routers'
// tenants, and the fleet's capacity in the same slots. Guarded by the
// scheduler's lock.
type fleetTenants struct {
	others   map[string]TenantDemand
	at       time.Time // when others arrived
	capacity int64     // the fleet's windows (0: unknown)
}

// SetFleetCapacity installs the fleet's capacity: the sum of the whole
// windows of the workers this router's capacity is a share of.
func (s *Scheduler) SetFleetCapacity(n int64) {
	s.mu.Lock()
	s.fleet.capacity = n
	s.mu.Unlock()
}

// SetFleetTenants installs the other routers' tenants, summed per tenant.
func (s *Scheduler) SetFleetTenants(others []TenantDemand) {
	m := make(map[string]TenantDemand, len(others))
	for _, o := range others {
		if o.Tenant == "" || !validWeight(o.Weight) || o.InFlight < 0 || o.Waiting < 0 {
			continue
		}
		o.Demand = o.InFlight + o.Waiting
		m[o.Tenant] = o
	}
	s.mu.Lock()
	s.fleet.others, s.fleet.at = m, s.cfg.Now()
	s.mu.Unlock()
}

// Tenants lists this router's active tenants (fair shares on; nil
// otherwise): what it reports to the control plane.
func (s *Scheduler) Tenants() []TenantDemand {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fair == nil {
		return nil
	}
	out := make([]TenantDemand, 0, s.fair.active)
	for _, t := range s.fair.tenants {
		if t.busy() {
			out = append(out, TenantDemand{Tenant: t.name, Weight: t.weight, InFlight: t.inflight, Waiting: t.waiting,
				Demand: t.inflight + t.waiting})
		}
	}
	if len(out) > maxReportedTenants {
		sort.Slice(out, func(i, j int) bool { return out[i].Demand > out[j].Demand })
		out = out[:maxReportedTenants]
	}
	return out
}

// fleetLocked returns the other routers' tenants and the capacity to weigh
// shares against: the fleet's, while the control plane's relay is fresh;
// else none and this router's own capacity.
func (s *Scheduler) fleetLocked(now time.Time) (map[string]TenantDemand, int64) {
	f := &s.fleet
	if f.others == nil || f.capacity <= 0 || now.Sub(f.at) > FleetTenantsTTL {
		return nil, s.capacity
	}
	return f.others, f.capacity
}

// demandsLocked lists every active tenant's demand, this router's and the
// other routers' summed, with one more slot for ts (the newcomer), and
// whether another tenant is active and whether one waits.
func (s *Scheduler) demandsLocked(ts *tenantState, others map[string]TenantDemand) (ds []TenantDemand, mine int64, active, waiting bool) {
	ds = make([]TenantDemand, 0, s.fair.active+len(others)+1)
	for _, t := range s.fair.tenants {
		if !t.busy() && t != ts {
			continue
		}
		d := TenantDemand{Tenant: t.name, Weight: t.weight, InFlight: t.inflight, Waiting: t.waiting}
		if o, ok := others[t.name]; ok {
			d.InFlight += o.InFlight
			d.Waiting += o.Waiting
		}
		d.Demand = d.InFlight + d.Waiting
		if t == ts {
			mine = d.Demand
			d.Demand++
		} else if d.Demand > 0 {
			active, waiting = true, waiting || d.Waiting > 0
		}
		ds = append(ds, d)
	}
	for name, o := range others {
		if t := s.fair.tenants[name]; t != nil && (t.busy() || t == ts) {
			continue // counted above
		}
		if o.Demand > 0 {
			active, waiting = true, waiting || o.Waiting > 0
			ds = append(ds, o)
		}
	}
	return ds, mine, active, waiting
}

// overShareLocked reports whether ts, asking for one more slot, already
// holds or waits for its fair share of the capacity (fleet-wide when the
// control plane relays the other routers' tenants) while another tenant is
// active.
func (s *Scheduler) overShareLocked(ts *tenantState, tenant string, now time.Time) bool {
	others, capacity := s.fleetLocked(now)
	if capacity == Unlimited {
		return false
	}
	ds, mine, active, _ := s.demandsLocked(ts, others)
	if !active {
		return false // alone: what it misses is the fleet's capacity, not its share
	}
	// A share under one slot is a rounding artefact: every tenant may hold
	// or wait for one.
	share := math.Ceil(fairShare(float64(capacity), ds, tenant) - 1e-9)
	return mine >= max(1, int64(share))
}

// yieldLocked: a tenant over its fair share does not take a free slot while
// another tenant waits somewhere in the fleet (the slot, or the share it is
// part of, is theirs); it is refused instead. Only with the other routers'
// tenants relayed: in one router, a waiting tenant means no slot is free.
func (s *Scheduler) yieldLocked(ts *tenantState, tenant string, now time.Time) bool {
	if ts == nil || s.cfg.FairShareWait {
		return false
	}
	others, _ := s.fleetLocked(now)
	if others == nil {
		return false
	}
	if _, _, _, waiting := s.demandsLocked(ts, others); !waiting {
		return false
	}
	return s.overShareLocked(ts, tenant, now)
}
