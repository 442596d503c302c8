package admission

import (
	"context"
	"reflect"
	"strings"
	"testing"
)

// The scheduler's YAML is an operator's file, but a hostile or mistaken one
// must not take the router down: every document either fails with a
// "scheduler config:" error and gives base back untouched, or yields a
// config that validates and a scheduler that keeps its capacity whatever
// the classes' figures.
func FuzzParseSchedulerConfig(f *testing.F) {
	for _, s := range []string{
		"",
		"classes:\n  interactive:\n    reserved: 4\n    reserve_demand: true\n    queue_timeout_secs: 2.5\n  bulk:\n    can_preempt: false\n    queue_size: 8\n",
		"tenant_policies:\n  \"auth:batch\":\n    max_class: bulk\n    weight: 3\napi_keys:\n  sk-batch: batch\nfair_share:\n  enabled: true\n  default_weight: 0.5\n  refuse_over_share: false\n  newcomer_headroom: true\n  pack_over_share: true\n",
		"trust_tenant_header: true\ntenant_header_name: x-t\n",
		"classes:\n  system:\n    reserved: 9223372036854775807\n  interactive:\n    reserved: 9223372036854775807\n",
		"classes:\n  default:\n    queue_timeout_secs: .nan\n    starvation_threshold_secs: 1e308\n    ttft_objective_secs: -1\n",
		"a: &a [1, 2]\nb: [*a, *a]\n",
		"classes: {urgent: {}}\n",
		"fair_share: {enabled: true, default_weight: 1e300}\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		base := DefaultSchedulerConfig()
		c, err := ParseSchedulerConfig(data, base)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "scheduler config: ") {
				t.Fatalf("error %q does not say it is the scheduler config's", err)
			}
			if !reflect.DeepEqual(c, DefaultSchedulerConfig()) {
				t.Fatalf("an error gave back %+v, want base untouched", c)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("a config that parsed does not validate: %v", err)
		}
		const capacity = 2
		s := NewScheduler(c, capacity, nil)
		cancelled, cancel := context.WithCancel(context.Background())
		cancel() // a request that finds no slot gives up at once
		var held []*Ticket
		for _, cl := range Classes {
			for _, tenant := range []string{"auth:batch", "ip:10.0.0.1"} {
				tk, r := s.AdmitTenant(cancelled, cl, tenant)
				if r == Admitted {
					held = append(held, tk)
				}
				if s.total > capacity || s.total < 0 {
					t.Fatalf("%d slots held of %d after a %s admission", s.total, capacity, cl)
				}
			}
		}
		for _, tk := range held {
			tk.Release()
		}
		if s.total != 0 {
			t.Fatalf("%d slots held after every ticket was released", s.total)
		}
	})
}
