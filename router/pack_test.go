package router

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/smg-project/smg/router/admission"
)

const packYAML = `
classes:
  system: {reserved: 0}
  interactive: {reserved: 0}
  default: {queue_size: 16, queue_timeout_secs: 1}
fair_share: {enabled: true, pack_over_share: true}
api_keys:
  sk-flood: flood
  sk-steady: steady
`

// With fair_share.pack_over_share, the requests of a tenant that wants more
// than its weighted share beside another active tenant go to the eligible
// worker first in the fleet's fixed order (the rank hashed from worker IDs),
// however loaded; the other tenant's requests go by the policy. A worker
// out of routing passes the packed requests to the next in the order.
func TestPackedTenantFillsWorkersInFleetOrder(t *testing.T) {
	names := []string{"a", "b", "c", "d"}
	slices.SortFunc(names, func(x, y string) int { return int(int64(packRank(x)) - int64(packRank(y))) })
	first, second := names[0], names[1]
	for _, policy := range []string{PolicyLeastLoad, PolicyRoundRobin, PolicyPowerOfTwo} {
		h, _ := schedHarness(t, 8, packYAML, func(o *Options) { o.Policy = policy })
		engines := map[string]*engine{}
		for _, n := range names {
			engines[n] = newEngine(t, n, nil)
		}
		// The first in the order is the most loaded: no policy would pick it.
		workers := func(vetoFirst bool) []Worker {
			var ws []Worker
			for _, n := range names {
				w := engines[n].worker(running(1))
				if n == first {
					w.Running = 50
					if vetoFirst {
						w.Veto = VetoOverload
					}
				}
				ws = append(ws, w)
			}
			return ws
		}
		h.apply(workers(false)...)
		// The other routers relay a flood wanting 2,000 slots of a fleet of
		// 1,000, beside a steady tenant wanting 2: however slowly this
		// machine answers, the steady tenant's requests here (sent back to
		// back) never make it want its weighted 500.
		h.r.sched.SetFleetCapacity(1000)
		h.r.sched.SetFleetTenants([]admission.TenantDemand{
			{Tenant: "auth:flood", Weight: 1, InFlight: 3, Demand: 2000, Mean: 2000},
			{Tenant: "auth:steady", Weight: 1, InFlight: 1, Demand: 2, Mean: 2}})
		for i := range 6 {
			if a := h.sendAs("sk-flood", "", "x"); a.status != 200 || a.servedBy() != first {
				t.Fatalf("%s: flood request %d: status %d on %q, want 200 on %s (first in the fleet's order)", policy, i, a.status, a.servedBy(), first)
			}
		}
		steadyOn := map[string]int{}
		for range 6 {
			a := h.sendAs("sk-steady", "", "x")
			if a.status != 200 {
				t.Fatalf("%s: steady request: status %d", policy, a.status)
			}
			steadyOn[a.servedBy()]++
		}
		// The steady tenant, under its weighted share, goes by the policy:
		// round robin visits every worker, least load avoids first (power of
		// two may draw first twice: about once in a thousand requests).
		if policy == PolicyRoundRobin && len(steadyOn) != len(names) || policy == PolicyLeastLoad && steadyOn[first] > 0 {
			t.Fatalf("%s: the steady tenant went to %v: want the policy's choice (%s runs 50)", policy, steadyOn, first)
		}
		h.apply(workers(true)...)
		if a := h.sendAs("sk-flood", "", "x"); a.status != 200 || a.servedBy() != second {
			t.Fatalf("%s: flood request with %s vetoed: status %d on %q, want 200 on %s", policy, first, a.status, a.servedBy(), second)
		}
		if got := h.metricValue("smg_scheduler_fair_share_packed_total", map[string]string{"tenant": "auth:flood"}); got != 7 {
			t.Fatalf("%s: smg_scheduler_fair_share_packed_total{tenant=auth:flood} = %v, want 7", policy, got)
		}
	}
}

// A keyed policy keeps each key on its worker: a packed tenant's request
// with a routing key goes where the key sends any other tenant's.
func TestPackedKeepsKeyedPlacement(t *testing.T) {
	h, _ := schedHarness(t, 8, packYAML, func(o *Options) { o.Policy = PolicyConsistentHashing })
	var ws []Worker
	for _, n := range []string{"a", "b", "c", "d"} {
		ws = append(ws, newEngine(t, n, nil).worker())
	}
	h.apply(ws...)
	h.r.sched.SetFleetCapacity(1000)
	h.r.sched.SetFleetTenants([]admission.TenantDemand{
		{Tenant: "auth:flood", Weight: 1, InFlight: 3, Demand: 2000, Mean: 2000},
		{Tenant: "auth:steady", Weight: 1, InFlight: 1, Demand: 2, Mean: 2}})
	send := func(apiKey, routingKey string) string {
		req, err := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/chat/completions",
			strings.NewReader(`{"model":"`+testModel+`","messages":[{"role":"user","content":"x"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+apiKey)
		req.Header.Set("x-smg-routing-key", routingKey)
		a := do(t, req)
		if a.status != 200 {
			t.Fatalf("status %d", a.status)
		}
		return a.servedBy()
	}
	spread := map[string]bool{}
	for i := range 16 {
		key := fmt.Sprintf("session-%d", i)
		want := send("sk-steady", key)
		spread[want] = true
		if got := send("sk-flood", key); got != want {
			t.Fatalf("key %s: the packed tenant went to %s, the key's worker is %s", key, got, want)
		}
	}
	if len(spread) < 2 {
		t.Fatalf("16 keys all on %v: the ring does not spread them, the test proves nothing", spread)
	}
	if got := h.metricValue("smg_scheduler_fair_share_packed_total", map[string]string{"tenant": "auth:flood"}); got != 16 {
		t.Fatalf("smg_scheduler_fair_share_packed_total{tenant=auth:flood} = %v, want 16 (packed, placed by the key)", got)
	}
}

// A packed request that borrows a peer's room asks the lender to place it
// packed too (pack=1): the lender lends a room on the worker first in the
// fleet's order that has one, not the one its policy would pick; without
// the parameter its policy (round robin) decides. Any other value is 400.
func TestPackedLoanPlacedInFleetOrder(t *testing.T) {
	names := []string{"a", "b", "c", "d"}
	slices.SortFunc(names, func(x, y string) int { return int(int64(packRank(x)) - int64(packRank(y))) })
	lender := newHarness(t, func(o *Options) {
		windowsOn(PolicyRoundRobin)(o)
		o.WorkerAdmissionWaitSecs = 0
		o.PeerRouters = "http://127.0.0.1:1" // the test asks from loopback: a peer's address
	})
	var ws []Worker
	for _, n := range names {
		ws = append(ws, newEngine(t, n, nil).worker(rooms(4), func(w *Worker) { w.WindowShare = 2 }))
	}
	lender.apply(ws...)
	lend := func(query string) (int, string, func()) {
		req, err := http.NewRequest(http.MethodPost, lender.srv.URL+LendPath+"?model="+testModel+"&need=1"+query, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, resp.Header.Get(LentWorkerHeader), func() { _ = resp.Body.Close() }
	}
	var held []func()
	defer func() {
		for _, f := range held {
			f()
		}
	}()
	// Held loans: the first in the order has a share of 2, then the second.
	for i, want := range []string{names[0], names[0], names[1]} {
		status, got, done := lend("&pack=1")
		held = append(held, done)
		if status != http.StatusOK || got != want {
			t.Fatalf("packed loan %d: %d on %q, want 200 on %s", i, status, got, want)
		}
	}
	lentOn := map[string]bool{}
	for range 4 {
		status, got, done := lend("")
		done()
		if status != http.StatusOK {
			t.Fatalf("a loan without pack: %d", status)
		}
		lentOn[got] = true
	}
	if len(lentOn) < 2 {
		t.Fatalf("loans without pack all on %v: round robin should spread them", lentOn)
	}
	if status, got, done := lend("&pack=yes"); status != http.StatusBadRequest || got != "" {
		done()
		t.Fatalf("pack=yes: %d on %q, want 400 and no worker", status, got)
	} else {
		done()
	}
}
