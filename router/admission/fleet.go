package admission

import (
	"math"
	"slices"
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
		if !(o.Mean >= 0 && o.Mean <= float64(math.MaxInt32)) { // NaN too
			o.Mean = 0
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
			out = append(out, TenantDemand{Tenant: t.name, Weight: t.weight, InFlight: t.inflight, Waiting: t.waiting, Demand: d,
				Mean: t.use.streamMean(now, s.holdPriorLocked(now))})
		}
	}
	if len(out) > maxReportedTenants {
		sort.Slice(out, func(i, j int) bool { return out[i].Demand > out[j].Demand })
		out = out[:maxReportedTenants]
	}
	return out
}

// expectedLocked is the slots a tenant is expected to use: what it holds
// and waits for, or what its arrivals keep busy on average when that is
// more. No burst margin: summed over routers, each router's margin would
// count a tenant spread over three routers as wanting far more than it
// does; the margin is its headroom on each router (headroomLocked).
func (s *Scheduler) expectedLocked(t *tenantState, now time.Time) int64 {
	return max(t.inflight+t.waiting, t.use.streamSlots(now, 0, s.holdPriorLocked(now)))
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
	prior := s.holdPriorLocked(now)
	for _, t := range s.fair.tenants {
		d := TenantDemand{Tenant: t.name, Weight: t.weight, InFlight: t.inflight, Waiting: t.waiting, Demand: s.expectedLocked(t, now),
			Mean: t.use.streamMean(now, prior)}
		if o, ok := others[t.name]; ok {
			d.InFlight += o.InFlight
			d.Waiting += o.Waiting
			d.Demand += o.Demand
			d.Mean += o.Mean
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

// headroomSD is the burst margin of an under-share tenant's headroom on a
// router: its mean demand there plus two standard deviations of a Poisson
// arrival count (a steady stream exceeds it about once in forty arrivals).
const headroomSD = 2

// overShareLocked reports whether ts, asking for one more slot, is over its
// fair share while another tenant is active. Two rules:
//
//   - it already holds its fair share of the capacity (fleet-wide when the
//     control plane relays the other routers' tenants), a slot free or not:
//     the capacity past its share is kept for the others' next arrivals;
//   - it holds its weighted share (capacity × its weight / the active
//     tenants' weights) or more, or wants more than it on average, and one
//     more slot here would eat the headroom of a tenant under its weighted
//     share on average active on this router (see headroomLocked).
//
// A tenant under its weighted share on average may hold up to its burst
// fleet-wide past its fair share: its bursts take what the others leave.
// With newcomer_headroom, a stream in its first holding time is also held to
// the share it would have beside a tenant not seen yet (youngOverLocked).
func (s *Scheduler) overShareLocked(ts *tenantState, now time.Time) bool {
	others, capacity := s.fleetLocked(now)
	if capacity == Unlimited {
		return false
	}
	ds, mine, active := s.demandsLocked(ts, others, now)
	if s.cfg.NewcomerHeadroom && s.youngOverLocked(ts, ds, others, capacity, mine, now) {
		return true // a tenant not seen yet keeps its share (alone or not)
	}
	if !active {
		return false // alone: what it misses is the fleet's capacity, not its share
	}
	level := waterLevel(float64(capacity), ds)
	var me TenantDemand
	for _, d := range ds {
		if d.Tenant == ts.name {
			me = d
			break
		}
	}
	// A share under one slot is a rounding artefact: every tenant may hold
	// one. What it waits for is not counted: a request waiting for a room
	// its router's share lacks is no more than its tenant's share.
	share := math.Ceil(min(float64(me.Demand), level*me.Weight) - 1e-9)
	wsum := weightSum(ds)
	weighted := float64(capacity) * me.Weight / wsum
	mean := me.Mean
	if mean < weighted {
		// Under its weighted share on average: a burst past its share
		// takes what the others leave, up to its burst fleet-wide.
		share = max(share, math.Ceil(mean+headroomSD*math.Sqrt(mean)))
	}
	if mine >= max(1, int64(share)) {
		return true
	}
	if float64(mine) < weighted && mean < weighted {
		return false // within its weighted share, now and on average: it borrows nothing
	}
	claims := s.headroomLocked(ts, ds, capacity, wsum, now)
	return claims > 0 && s.total+1+claims > s.capacity
}

// packedLocked reports whether ts, taking a slot now, is placed in the
// fleet's fixed order (pack_over_share): it wants more than its weighted
// share on average (fleet-wide with the relay) while another tenant is
// active. A tenant under its weighted share on average is never packed, even
// while a burst takes it past that share: its requests keep the policy's
// choice. Packing the tenants that want more than their share on as few
// engines as they fill leaves the engines with the others' headroom lightly
// loaded, with none of the heavy tenants' prefills.
func (s *Scheduler) packedLocked(ts *tenantState, now time.Time) bool {
	if !s.cfg.PackOverShare || ts == nil {
		return false
	}
	d, _, weighted, ok := s.besideOthersLocked(ts, now)
	return ok && d.Mean >= weighted
}

// besideOthersLocked returns ts's demand (fleet-wide with the relay), the
// slots it holds fleet-wide and its weighted share of the capacity, with
// ok only while another tenant is active and a capacity is known.
func (s *Scheduler) besideOthersLocked(ts *tenantState, now time.Time) (me TenantDemand, mine int64, weighted float64, ok bool) {
	others, capacity := s.fleetLocked(now)
	if capacity == Unlimited || capacity <= 0 {
		return me, 0, 0, false
	}
	ds, mine, active := s.demandsLocked(ts, others, now)
	if !active {
		return me, 0, 0, false
	}
	for _, d := range ds {
		if d.Tenant == ts.name {
			return d, mine, float64(capacity) * d.Weight / weightSum(ds), true
		}
	}
	return me, 0, 0, false
}

// headroomLocked is the free slots this router keeps for the tenants
// active on it, other than ts, under their weighted share on average
// (fleet-wide with the relay): each may burst at once. What it leaves unused
// of its weighted share, now or on average (whichever is more), is split over
// the routers it sends through in proportion to its demand on each, and each
// router keeps its part free (never more than the tenant's burst there: its
// mean demand plus headroomSD standard deviations, less what it holds). A
// tenant past its weighted share, or over it on average, takes a slot only
// past them, so a burst of the others finds a free slot on every router at
// once instead of waiting there for that tenant's next completion; the parts
// sum to no more than the others' weighted shares less their mean use, so
// the tenant keeps its own on average.
func (s *Scheduler) headroomLocked(ts *tenantState, ds []TenantDemand, capacity int64, wsum float64, now time.Time) int64 {
	if s.capacity == Unlimited || s.capacity <= 0 || capacity <= 0 || wsum <= 0 {
		return 0
	}
	var claims int64
	prior := s.holdPriorLocked(now)
	for _, d := range ds {
		u := s.fair.tenants[d.Tenant]
		if u == nil || u == ts || d.Weight <= 0 || d.Demand <= 0 {
			continue // not active here, or the asker
		}
		here := u.use.streamMean(now, prior)
		// What it leaves unused of its weighted share now, or on average
		// when more: a burst past what it holds on average keeps its
		// headroom (the others keep their weighted share on average).
		mean := d.Mean // fleet-wide
		weighted := float64(capacity) * d.Weight / wsum
		unused := weighted - min(float64(d.InFlight), mean)
		burst := u.use.streamSlots(now, headroomSD, prior) - u.inflight
		if mean >= weighted || unused <= 0 || here < idleDemand || burst <= 0 {
			continue
		}
		part := int64(math.Round(unused * min(1, here/float64(d.Demand))))
		claims += max(0, min(part, burst))
	}
	return claims
}

// youngOverLocked reports whether ts, in its stream's first holding time
// (since its first arrival after a silence), holds the share it would have
// beside one more tenant of the default weight that wants the whole
// capacity (a tenant not seen yet), while it wants more than that share on
// average. A stream's first arrivals would otherwise take every free slot
// before another tenant's second arrival makes that one's demand known, and
// keep them until their answers end. Fleet-wide once the control plane
// relays the tenant from another router; before that, this router's part.
func (s *Scheduler) youngOverLocked(ts *tenantState, ds []TenantDemand, others map[string]TenantDemand, capacity, mine int64, now time.Time) bool {
	prior := s.holdPriorLocked(now)
	if now.Sub(ts.use.first).Seconds() >= prior || capacity <= 0 || s.capacity <= 0 {
		return false
	}
	// Its share if it wanted the whole capacity, beside a newcomer that does.
	all := append(slices.Clone(ds), TenantDemand{Weight: s.cfg.DefaultWeight, Demand: capacity})
	for i := range all {
		if all[i].Tenant == ts.name {
			all[i].Demand = capacity
		}
	}
	part := waterLevel(float64(capacity), all) * ts.weight / float64(capacity)
	// Whether it wants more than that on average: fleet-wide once relayed,
	// by more than the noise of its count (headroomSD standard deviations
	// of a Poisson count). A mean from a stream's first second is that
	// noisy, and each router counts the first holding time from the
	// stream's first arrival there: a steady tenant near its share would be
	// held to it on a router it reached late, in bursts its mean does not
	// show. A flood's mean is past its share by many times the margin.
	wants := ts.use.streamMean(now, prior) > part*float64(s.capacity)
	if _, ok := others[ts.name]; ok {
		for _, d := range ds {
			if d.Tenant == ts.name {
				wants = d.Mean-headroomSD*math.Sqrt(d.Mean) > part*float64(capacity)
			}
		}
	}
	// Or its arrivals here came faster than its part of this router keeps
	// busy, beyond the noise of their count: the relay lags a flood's
	// onset (one taken at its first arrival on the other routers counts it
	// as wanting nothing there), and until the next one the flood would
	// take every slot here.
	wants = wants || ts.use.onsetMean(now, prior) > part*float64(s.capacity)
	// Held to it fleet-wide and, as the relay lags, on this router.
	return wants && (float64(mine) >= max(1, math.Ceil(part*float64(capacity)-1e-9)) ||
		float64(ts.inflight) >= max(1, math.Ceil(part*float64(s.capacity)-1e-9)))
}

// weightSum is the weights of the active tenants.
func weightSum(ds []TenantDemand) float64 {
	var w float64
	for _, d := range ds {
		if d.Weight > 0 && d.Demand > 0 {
			w += d.Weight
		}
	}
	return w
}

// Headroom is the free slots this router keeps for its under-share
// tenants' next arrivals while a tenant over its share is active (fair
// shares on; 0 otherwise). The router reports them to the control plane as
// rooms waiting, so its shares of the windows keep room for those tenants
// here: otherwise they follow the over-share tenant's queues, which the
// headroom keeps short on exactly the routers those tenants send through.
func (s *Scheduler) Headroom() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fair == nil {
		return 0
	}
	now := s.cfg.Now()
	others, capacity := s.fleetLocked(now)
	if capacity == Unlimited {
		return 0
	}
	ds, _, _ := s.demandsLocked(nil, others, now)
	if math.IsInf(waterLevel(float64(capacity), ds), 1) {
		return 0 // every demand fits: nobody is held back for them
	}
	return s.headroomLocked(nil, ds, capacity, weightSum(ds), now)
}
