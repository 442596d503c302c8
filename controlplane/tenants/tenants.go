// Package tenants keeps what each router last reported of its tenants' use
// of admission slots and tells every router what the others reported, summed
// per tenant, so that a tenant's fair share holds fleet-wide: a tenant that
// floods through three routers is weighed against its fleet-wide demand,
// not three times its share.
//
// It owns the routers' tenant reports and their sums; it reads no registry
// and never touches workers, windows or verdicts.
package tenants

import (
	"cmp"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// MaxPerReport bounds the tenants taken from one report (the largest by
// demand): a router cannot grow the control plane's memory without bound.
const MaxPerReport = 1024

// maxWeight is the largest weight a router may report (the scheduler's bound).
const maxWeight = 1e6

// maxCount bounds a reported count, so sums over routers cannot overflow.
const maxCount = 1 << 32

// Table is every router's latest tenant report. Safe for concurrent use.
type Table struct {
	mu      sync.Mutex
	routers map[string][]*smgv1.TenantUsage
	// Read without the lock by every watch stream's pass.
	version atomic.Uint64 // changes whenever a report changes what some router would be told
	active  atomic.Bool   // some router reported a tenant
}

// New returns an empty table.
func New() *Table { return &Table{routers: map[string][]*smgv1.TenantUsage{}} }

// Report replaces routerID's tenants with those of its latest report.
func (t *Table) Report(routerID string, us []*smgv1.TenantUsage) {
	clean := sanitize(us)
	t.mu.Lock()
	defer t.mu.Unlock()
	old, had := t.routers[routerID]
	switch {
	case len(clean) == 0 && had:
		delete(t.routers, routerID)
		t.version.Add(1)
	case len(clean) > 0 && !same(old, clean):
		t.routers[routerID] = clean
		t.version.Add(1)
	}
	t.active.Store(len(t.routers) > 0)
}

// Gone drops routerID's tenants: its stream ended.
func (t *Table) Gone(routerID string) { t.Report(routerID, nil) }

// Version changes with every change of the table.
func (t *Table) Version() uint64 { return t.version.Load() }

// Active reports whether any router reported a tenant.
func (t *Table) Active() bool { return t.active.Load() }

// Others is what every router but routerID reported, summed per tenant
// (sorted by tenant; a tenant's weight is the largest reported).
func (t *Table) Others(routerID string) *smgv1.TenantShares {
	t.mu.Lock()
	sum := map[string]*smgv1.TenantUsage{}
	for id, us := range t.routers {
		if id == routerID {
			continue
		}
		for _, u := range us {
			s := sum[u.Tenant]
			if s == nil {
				s = &smgv1.TenantUsage{Tenant: u.Tenant}
				sum[u.Tenant] = s
			}
			s.Weight = max(s.Weight, u.Weight)
			s.InFlight += u.InFlight
			s.Waiting += u.Waiting
			s.Demand += u.Demand
			s.Mean += u.Mean
		}
	}
	t.mu.Unlock()
	return &smgv1.TenantShares{Others: slices.SortedFunc(maps.Values(sum), byTenant)}
}

func byTenant(a, b *smgv1.TenantUsage) int { return strings.Compare(a.Tenant, b.Tenant) }

// sanitize drops idle tenants and bad values (a weight outside (0, 1e6]
// becomes 1, negative counts 0), keeps the MaxPerReport largest, and
// copies: the report's messages are not kept.
func sanitize(us []*smgv1.TenantUsage) []*smgv1.TenantUsage {
	out := make([]*smgv1.TenantUsage, 0, min(len(us), MaxPerReport))
	for _, u := range us {
		if u == nil || u.Tenant == "" {
			continue
		}
		c := &smgv1.TenantUsage{Tenant: u.Tenant, Weight: u.Weight,
			InFlight: min(max(0, u.InFlight), maxCount), Waiting: min(max(0, u.Waiting), maxCount)}
		c.Demand = min(max(u.Demand, c.InFlight+c.Waiting), maxCount)
		// A tenant's mean, to a tenth of a slot: finer changes are noise the
		// relay would carry to every router.
		if u.Mean > 0 { // NaN not
			c.Mean = math.Round(min(u.Mean, float64(maxCount))*10) / 10
		}
		if !(c.Weight > 0 && c.Weight <= maxWeight) { // NaN too
			c.Weight = 1
		}
		if c.Demand > 0 {
			out = append(out, c)
		}
	}
	if len(out) > MaxPerReport {
		slices.SortFunc(out, func(a, b *smgv1.TenantUsage) int { return cmp.Compare(b.Demand, a.Demand) })
		out = out[:MaxPerReport]
	}
	slices.SortFunc(out, byTenant)
	return out
}

func same(a, b []*smgv1.TenantUsage) bool {
	return slices.EqualFunc(a, b, func(x, y *smgv1.TenantUsage) bool {
		return x.Tenant == y.Tenant && x.Weight == y.Weight && x.InFlight == y.InFlight && x.Waiting == y.Waiting && x.Demand == y.Demand && x.Mean == y.Mean
	})
}
