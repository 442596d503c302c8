package admission

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestParseClass(t *testing.T) {
	for in, want := range map[string]Class{"system": System, " Interactive\t": Interactive, "DEFAULT": Default, "bulk": Bulk} {
		if c, ok := ParseClass(in); !ok || c != want {
			t.Errorf("ParseClass(%q) = %s, %v", in, c, ok)
		}
	}
	for _, in := range []string{"", "urgent", "0", "system2"} {
		if c, ok := ParseClass(in); ok || c != Default {
			t.Errorf("ParseClass(%q) = %s, %v; want default, false", in, c, ok)
		}
	}
	if Clamp(System, Default) != Default || Clamp(Bulk, Default) != Bulk {
		t.Error("Clamp must only lower a class")
	}
}

func TestParseConfig(t *testing.T) {
	c, err := ParseSchedulerConfig([]byte(`
classes:
  interactive:
    reserved: 4
    reserve_demand: true
    queue_timeout_secs: 2.5
  bulk:
    can_preempt: false
    queue_size: 8
tenant_policies:
  "auth:batch":
    max_class: bulk
api_keys:
  sk-batch: batch
`), DefaultSchedulerConfig())
	if err != nil {
		t.Fatal(err)
	}
	in := c.Classes[Interactive]
	if in.Reserved != 4 || !in.ReserveDemand || in.QueueTimeout != 2500*time.Millisecond || in.QueueSize != 256 || !in.CanPreempt {
		t.Fatalf("interactive %+v: set fields applied, others kept at their defaults", in)
	}
	if c.Classes[Bulk].QueueSize != 8 || c.Classes[Bulk].ReserveDemand || DefaultSchedulerConfig().Classes[Interactive].ReserveDemand || c.MaxClass("auth:batch") != Bulk || c.MaxClass("auth:x") != Default {
		t.Fatalf("bulk or tenant policy not applied: %+v", c)
	}
	h := http.Header{"Authorization": {"Bearer sk-batch"}, "X-Smg-Tenant-Id": {"vip"}}
	if got := c.Tenant(h, "10.0.0.1:5555"); got != "auth:batch" {
		t.Fatalf("tenant %q, want auth:batch", got)
	}
	delete(h, "Authorization")
	if got := c.Tenant(h, "10.0.0.1:5555"); got != "ip:10.0.0.1" {
		t.Fatalf("untrusted tenant header was used: %q", got)
	}
	c.TrustTenantHeader = true
	if got := c.Tenant(h, "10.0.0.1:5555"); got != "header:vip" {
		t.Fatalf("trusted tenant header: %q", got)
	}
	if got := c.Tenant(http.Header{}, ""); got != "anonymous" {
		t.Fatalf("no identity: %q", got)
	}
}

// Every bad document is an error that names the problem; the base comes back.
func TestParseConfigErrors(t *testing.T) {
	for doc, want := range map[string]string{
		"classes:\n  urgent:\n    reserved: 1\n":               "classes.urgent: unknown class",
		"classes:\n  Bulk:\n    reserved: 1\n":                 "classes.Bulk: unknown class",
		"classes:\n  bulk:\n    queue_timeout_secs: 0\n":       "queue_timeout_secs must be > 0",
		"classes:\n  bulk:\n    reserved: -1\n":                "reserved must be >= 0",
		"classes:\n  bulk:\n    starvation_threshold_secs: -2": "starvation_threshold_secs must be > 0",
		"tenant_policies:\n  a:\n    max_class: gold\n":        "unknown class \"gold\"",
		"classes: [1, 2":        "scheduler config",
		"clases:\n  bulk: {}\n": "field clases not found",
	} {
		_, err := ParseSchedulerConfig([]byte(doc), DefaultSchedulerConfig())
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want one naming %q", doc, err, want)
		}
	}
	if c, err := ParseSchedulerConfig(nil, DefaultSchedulerConfig()); err != nil || c.Classes[System].Reserved != 32 {
		t.Fatalf("empty document: %v", err)
	}
}

// The example in docs/ is a valid configuration.
func TestDocsExampleParses(t *testing.T) {
	c, err := LoadSchedulerConfig("../../docs/examples/priority-scheduler.yaml", DefaultSchedulerConfig())
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxClass("auth:batch") != Bulk || c.APIKeys["sk-chat-app-example"] != "chat-app" || c.Classes[Interactive].Reserved != 16 {
		t.Fatalf("example not applied: %+v", c)
	}
}

// fair_share and weights: a bad weight or an unknown tenant is a problem
// named with its fallback, never a failed config.
func TestParseFairShareConfig(t *testing.T) {
	c, err := ParseSchedulerConfig([]byte(`
fair_share:
  enabled: true
  default_weight: 2
tenant_policies:
  "auth:gold":
    weight: 4
  "auth:zero":
    weight: 0
  "auth:neg":
    weight: -1
  "gold":
    max_class: default
api_keys:
  sk-gold: gold
  sk-zero: zero
  sk-neg: neg
`), DefaultSchedulerConfig())
	if err != nil {
		t.Fatal(err)
	}
	if !c.FairShare || c.FairShareWait || c.NewcomerHeadroom || c.PackOverShare {
		t.Fatalf("fair_share.enabled: FairShare %v, wait %v, newcomer headroom %v, packing %v (off unless asked)", c.FairShare, c.FairShareWait, c.NewcomerHeadroom, c.PackOverShare)
	}
	packed, err := ParseSchedulerConfig([]byte("fair_share: {enabled: true, pack_over_share: true}\n"), DefaultSchedulerConfig())
	if err != nil || !packed.PackOverShare {
		t.Fatalf("fair_share.pack_over_share: true: PackOverShare %v, err %v", packed.PackOverShare, err)
	}
	for tenant, want := range map[string]float64{"auth:gold": 4, "auth:zero": 2, "auth:neg": 2, "ip:10.0.0.1": 2} {
		if w := c.Weight(tenant); w != want {
			t.Errorf("Weight(%s) = %v, want %v", tenant, w, want)
		}
	}
	all := strings.Join(c.Problems, "\n")
	for _, want := range []string{
		`tenant_policies."auth:zero".weight must be a number > 0`,
		`tenant_policies."auth:neg".weight must be a number > 0`,
		`tenant_policies."gold": not a tenant key`,
	} {
		if !strings.Contains(all, want) {
			t.Errorf("problems %q lack %q", all, want)
		}
	}
	if len(c.Problems) != 3 {
		t.Errorf("problems = %q, want 3", c.Problems)
	}

	c, err = ParseSchedulerConfig([]byte(`
fair_share: {enabled: true, default_weight: 0, refuse_over_share: false, newcomer_headroom: true}
tenant_policies:
  "auth:nobody": {weight: 1}
  "header:x": {weight: 1}
`), DefaultSchedulerConfig())
	if err != nil {
		t.Fatal(err)
	}
	if c.DefaultWeight != 1 || !c.FairShareWait || !c.NewcomerHeadroom {
		t.Fatalf("default weight %v (want the fallback 1), wait %v, newcomer headroom %v", c.DefaultWeight, c.FairShareWait, c.NewcomerHeadroom)
	}
	all = strings.Join(c.Problems, "\n")
	for _, want := range []string{"fair_share.default_weight must be", `no api_keys entry names tenant "nobody"`, "trust_tenant_header is off"} {
		if !strings.Contains(all, want) {
			t.Errorf("problems %q lack %q", all, want)
		}
	}
	if c, _ := ParseSchedulerConfig(nil, DefaultSchedulerConfig()); c.FairShare {
		t.Error("fair shares must be off by default")
	}
}
