package tenants

import (
	"fmt"
	"math"
	"testing"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

func u(tenant string, w float64, in, wait int64) *smgv1.TenantUsage {
	return &smgv1.TenantUsage{Tenant: tenant, Weight: w, InFlight: in, Waiting: wait}
}

func others(t *Table, id string) string {
	s := ""
	for _, o := range t.Others(id).GetOthers() {
		s += fmt.Sprintf("%s:%g:%d:%d ", o.Tenant, o.Weight, o.InFlight, o.Waiting)
	}
	return s
}

// Each router is told the other routers' tenants summed, never its own;
// a router that leaves or reports nothing takes its tenants with it.
func TestOthersSumOtherRouters(t *testing.T) {
	tb := New()
	tb.Report("r1", []*smgv1.TenantUsage{u("auth:a", 1, 4, 10), u("auth:b", 2, 3, 0)})
	tb.Report("r2", []*smgv1.TenantUsage{u("auth:a", 1, 5, 7)})
	tb.Report("r3", []*smgv1.TenantUsage{u("auth:a", 1, 6, 1)})
	if got, want := others(tb, "r1"), "auth:a:1:11:8 "; got != want {
		t.Fatalf("r1 told %q, want %q", got, want)
	}
	if got, want := others(tb, "r2"), "auth:a:1:10:11 auth:b:2:3:0 "; got != want {
		t.Fatalf("r2 told %q, want %q", got, want)
	}
	v := tb.Version()
	tb.Report("r3", []*smgv1.TenantUsage{u("auth:a", 1, 6, 1)})
	if tb.Version() != v {
		t.Fatal("the same report again changed the version")
	}
	tb.Gone("r2")
	tb.Report("r3", nil)
	if got, want := others(tb, "r1"), ""; got != want || tb.Version() == v {
		t.Fatalf("after r2 left and r3 went idle r1 told %q, want nothing", got)
	}
	if !tb.Active() {
		t.Fatal("r1 still reports tenants")
	}
	tb.Gone("r1")
	if tb.Active() {
		t.Fatal("no router reports a tenant")
	}
}

// A hostile report: bad weights become 1, negative counts 0, idle and
// nameless tenants are dropped, counts are bounded, at most MaxPerReport kept.
func TestReportSanitized(t *testing.T) {
	tb := New()
	var us []*smgv1.TenantUsage
	for i := range MaxPerReport + 10 {
		us = append(us, u(fmt.Sprintf("ip:%d", i), 1, int64(i+1), 0))
	}
	us = append(us, u("auth:nan", math.NaN(), 1, 0), u("auth:zero", 0, 1, 0), u("auth:neg", -3, -5, 2),
		u("", 1, 1, 1), u("auth:idle", 1, 0, 0), u("auth:huge", math.Inf(1), math.MaxInt64, math.MaxInt64), nil)
	tb.Report("evil", us)
	got := tb.Others("other").GetOthers()
	if len(got) != MaxPerReport {
		t.Fatalf("kept %d tenants, want %d", len(got), MaxPerReport)
	}
	seen := map[string]*smgv1.TenantUsage{}
	for _, o := range got {
		seen[o.Tenant] = o
		if !(o.Weight > 0 && o.Weight <= maxWeight) || o.InFlight < 0 || o.Waiting < 0 || o.InFlight > maxCount {
			t.Fatalf("kept a bad value: %v", o)
		}
	}
	if h := seen["auth:huge"]; h == nil || h.Weight != 1 || h.InFlight != maxCount {
		t.Fatalf("auth:huge kept as %v, want weight 1 and counts bounded", h)
	}
	if seen["auth:idle"] != nil || seen[""] != nil || seen["ip:0"] != nil {
		t.Fatal("kept an idle, nameless or smallest tenant")
	}
}

// A tenant's mean is summed over the other routers like its counts, to a
// tenth of a slot (a change under that is no change to relay); a mean that
// is negative or not a number is none.
func TestMeanSummedAndSanitized(t *testing.T) {
	tb := New()
	mean := func(tenant string, in int64, m float64) *smgv1.TenantUsage {
		return &smgv1.TenantUsage{Tenant: tenant, Weight: 1, InFlight: in, Mean: m}
	}
	tb.Report("r1", []*smgv1.TenantUsage{mean("auth:a", 1, 2.34)})
	tb.Report("r2", []*smgv1.TenantUsage{mean("auth:a", 1, 1.01), mean("auth:b", 1, math.NaN())})
	tb.Report("r3", []*smgv1.TenantUsage{mean("auth:b", 1, -4)})
	got := map[string]float64{}
	for _, o := range tb.Others("r3").GetOthers() {
		got[o.Tenant] = o.Mean
	}
	if math.Abs(got["auth:a"]-3.3) > 1e-9 || got["auth:b"] != 0 {
		t.Fatalf("r3 told means %v, want auth:a 3.3 (2.3 + 1.0), auth:b 0", got)
	}
	v := tb.Version()
	tb.Report("r1", []*smgv1.TenantUsage{mean("auth:a", 1, 2.31)})
	if tb.Version() != v {
		t.Fatal("a mean that moved by less than a tenth of a slot changed the version")
	}
	tb.Report("r1", []*smgv1.TenantUsage{mean("auth:a", 1, 2.5)})
	if tb.Version() == v {
		t.Fatal("a mean that moved by 0.2 slot did not change the version")
	}
}
