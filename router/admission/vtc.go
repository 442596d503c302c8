package admission

import (
	"math"
	"sort"
)

// Token weights of the virtual token counter: an output token costs the
// engine about twice a prompt token (it is made one decode step at a time),
// the weights the VTC literature uses.
const (
	PromptTokenWeight = 1
	OutputTokenWeight = 2
)

// maxIdleTenants bounds the idle tenants whose counters are kept: past it,
// those whose counters a return would lift anyway are dropped.
const maxIdleTenants = 4096

// vtc is a virtual token counter per tenant (fair_share in the scheduler's
// YAML): each tenant's counter advances by the tokens served to it (prompt
// plus output, weighted) divided by its weight, and a freed slot goes to the
// waiting request of the tenant with the lowest counter. A tenant that
// returns from idle is lifted to the lowest counter of the active tenants
// (to the counter of the last tenant that went idle when none is active),
// so it cannot bank credit while it sends nothing. Guarded by the
// scheduler's lock.
type vtc struct {
	weight  func(tenant string) float64
	tenants map[string]*tenantState
	active  int     // tenants with a request waiting or holding a slot
	floor   float64 // the counter of the last tenant that went idle
}

// tenantState is one tenant's counter and its use of the scheduler.
type tenantState struct {
	name     string
	counter  float64
	weight   float64
	inflight int64 // slots held
	waiting  int64 // requests queued
	// use is the slots the tenant's arrivals keep busy (Little's law, as a
	// class's reserve_demand): a tenant between two requests is still
	// active, and its share keeps room for its next arrivals.
	use classDemand
}

func (t *tenantState) busy() bool { return t.inflight+t.waiting > 0 }

func newVTC(weight func(string) float64) *vtc {
	return &vtc{weight: weight, tenants: map[string]*tenantState{}}
}

// state returns the tenant's state, lifting its counter when it turns active
// (call before counting the new request in).
func (v *vtc) state(tenant string) *tenantState {
	t := v.tenants[tenant]
	if t == nil {
		t = &tenantState{name: tenant, weight: v.weight(tenant)}
		v.tenants[tenant] = t
	}
	if !t.busy() {
		t.counter = max(t.counter, v.liftLevel())
		v.active++
	}
	return t
}

// liftLevel is the counter a returning tenant is lifted to.
func (v *vtc) liftLevel() float64 {
	if v.active == 0 {
		return v.floor
	}
	low := math.Inf(1)
	for _, t := range v.tenants {
		if t.busy() {
			low = min(low, t.counter)
		}
	}
	return low
}

// settle notes that one of the tenant's requests stopped waiting or holding
// a slot (the caller decremented the count): a tenant left with nothing is idle.
func (v *vtc) settle(t *tenantState) {
	if t.busy() {
		return
	}
	v.active--
	v.floor = t.counter
	if len(v.tenants)-v.active > maxIdleTenants {
		v.prune()
	}
}

// prune drops idle tenants whose counters a return would lift anyway.
func (v *vtc) prune() {
	lift := v.liftLevel()
	for k, t := range v.tenants {
		if !t.busy() && t.counter <= lift {
			delete(v.tenants, k)
		}
	}
}

// charge advances the tenant's counter by tokens (already weighted by kind).
func (v *vtc) charge(t *tenantState, tokens float64) {
	if tokens > 0 && !math.IsInf(tokens, 0) {
		t.counter += tokens / t.weight
	}
}

// fairShare is the tenant's share of capacity slots: weighted max-min
// fairness over the busy tenants' demands (slots held plus queued, plus
// extra for the tenant asked about): a tenant that wants less than its
// weighted part keeps what it wants and the rest is split among the others
// by weight. Demands and capacity may be fleet-wide (see TenantDemand).
func fairShare(capacity float64, demands []TenantDemand, tenant string) float64 {
	level := waterLevel(capacity, demands)
	for _, x := range demands {
		if x.Tenant == tenant && x.Weight > 0 && x.Demand > 0 {
			return min(float64(x.Demand), level*x.Weight)
		}
	}
	return 0
}

// waterLevel is the level of weighted max-min fairness: every tenant's share
// is min(demand, level × weight). A tenant whose demand is under it keeps
// what it wants (under its share); the others split the rest by weight.
// +Inf when the capacity covers every demand.
func waterLevel(capacity float64, demands []TenantDemand) float64 {
	type d struct{ demand, weight float64 }
	ds := make([]d, 0, len(demands))
	var wsum float64
	for _, x := range demands {
		if x.Weight > 0 && x.Demand > 0 {
			ds = append(ds, d{float64(x.Demand), x.Weight})
			wsum += x.Weight
		}
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i].demand/ds[i].weight < ds[j].demand/ds[j].weight })
	left := capacity
	// Water-filling: tenants whose demand is under the level keep their
	// demand; the level rises with what they leave.
	for _, x := range ds {
		level := left / wsum
		if x.demand/x.weight > level {
			return level
		}
		left -= x.demand
		wsum -= x.weight
	}
	return math.Inf(1)
}

// TenantDemand is one tenant's use of admission slots: held plus queued, and
// its weight. Routers report it with their window demand so fair shares hold
// fleet-wide.
type TenantDemand struct {
	Tenant   string
	Weight   float64
	InFlight int64
	Waiting  int64
	Demand   int64   // InFlight + Waiting, plus a newcomer when asked
	Mean     float64 // the slots its arrivals keep busy on average, without what it holds now
}
