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
		o.Demand = max(o.Demand, o.InFlight+o.Waiting)
		m[o.Tenant] = o
	}
	s.mu.Lock()
	s.fleet.others, s.fleet.at = m, s.cfg.Now()
	s.mu.Unlock()
}

// Tenants lists this router's active tenants (fair shares on; nil
// otherwise): what it reports to the control plane. Demand is the slots the
// tenant is expected to use (see expectedLocked).
func (s *Scheduler) Tenants() []TenantDemand {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fair == nil {
		return nil
	}
	now := s.cfg.Now()
	out := make([]TenantDemand, 0, s.fair.active)
	for _, t := range s.fair.tenants {
		if d := s.expectedLocked(t, now); d > 0 {
			out = append(out, TenantDemand{Tenant: t.name, Weight: t.weight, InFlight: t.inflight, Waiting: t.waiting, Demand: d})
		}
	}
	if len(out) > maxReportedTenants {
		sort.Slice(out, func(i, j int) bool { return out[i].Demand > out[j].Demand })
		out = out[:maxReportedTenants]
	}
	return out
}

// expectedLocked is the slots a tenant is expected to use: what it holds
// and waits for, or what its arrivals keep busy when that is more.
func (s *Scheduler) expectedLocked(t *tenantState, now time.Time) int64 {
	return max(t.inflight+t.waiting, t.use.slots(now, s.started))
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

// demandsLocked lists every active tenant's expected demand, this router's
// and the other routers' summed, with one more slot for ts (the newcomer);
// mine is the slots ts holds fleet-wide, active whether another tenant is
// active.
func (s *Scheduler) demandsLocked(ts *tenantState, others map[string]TenantDemand, now time.Time) (ds []TenantDemand, mine int64, active bool) {
	ds = make([]TenantDemand, 0, s.fair.active+len(others)+1)
	for _, t := range s.fair.tenants {
		d := TenantDemand{Tenant: t.name, Weight: t.weight, InFlight: t.inflight, Waiting: t.waiting, Demand: s.expectedLocked(t, now)}
		if o, ok := others[t.name]; ok {
			d.InFlight += o.InFlight
			d.Waiting += o.Waiting
			d.Demand += o.Demand
		}
		switch {
		case t == ts:
			mine = d.InFlight
			d.Demand = max(d.Demand, mine+1)
		case d.Demand <= 0:
			continue
		default:
			active = true
		}
		ds = append(ds, d)
	}
	for name, o := range others {
		if _, ok := s.fair.tenants[name]; ok {
			continue // counted above
		}
		if o.Demand > 0 {
			active = true
			ds = append(ds, o)
		}
	}
	return ds, mine, active
}

// overShareLocked reports whether ts, asking for one more slot, already
// holds its fair share of the capacity (fleet-wide when the
// control plane relays the other routers' tenants) while another tenant is
// active. It is asked at every arrival, a slot free or not: the capacity
// past a tenant's share is kept for the others' next arrivals.
func (s *Scheduler) overShareLocked(ts *tenantState, tenant string, now time.Time) bool {
	others, capacity := s.fleetLocked(now)
	if capacity == Unlimited {
		return false
	}
	ds, mine, active := s.demandsLocked(ts, others, now)
	if !active {
		return false // alone: what it misses is the fleet's capacity, not its share
	}
	// A share under one slot is a rounding artefact: every tenant may hold
	// one. What it waits for is not counted: a request waiting for a room
	// its router's share lacks is no more than its tenant's share.
	share := math.Ceil(fairShare(float64(capacity), ds, tenant) - 1e-9)
	return mine >= max(1, int64(share))
}
