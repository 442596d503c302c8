package admission

import (
	"context"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// A model of the benchmark's tenant scenario, admission alone (no engines,
// no HTTP): a capacity of 32 slots, a steady tenant at 7.5 requests/s and a
// flooding one at 125/s (0.3x and 5x of a capacity of 25/s), each answer
// holding its slot 1-1.5 s, a queue timeout of 100 ms, 20 s of Poisson
// arrivals. With three routers the slots are split 11/11/10, a request goes
// to a router at random, the routers relay their tenants to each other every
// 250 ms (the control plane's relay) and lend rooms (Lend) to a waiter's
// borrow; the load starts at a relay, or 20 ms before one (the relay's
// phase is anyone's in a real fleet: one taken at the flood's first
// arrivals counts it as wanting nothing until the next). Deterministic
// under synctest, where the benchmark on a loaded machine is not:
// go test -run TestTenantScenarioModel -v ./router/admission.

// tenantStats is the steady tenant's outcome over a model's runs.
type tenantStats struct {
	requests, refused, overShare, early, waited int
	waits                                       []float64 // seconds, of the admitted
}

func (st *tenantStats) log(t *testing.T) {
	sort.Float64s(st.waits)
	n := len(st.waits)
	t.Logf("steady tenant: %d requests, refused %d (%d over its fair share, %d in a run's first 2 s), %d answers waited (p99 %.0f ms, max %.0f ms)",
		st.requests, st.refused, st.overShare, st.early, st.waited, st.waits[n*99/100]*1000, st.waits[n-1]*1000)
}

// tenantScenario runs the model once, a router per share of the slots, the
// load starting lead after the routers (and their first relay), and adds
// the steady tenant's outcome to st.
func tenantScenario(t *testing.T, shares []int64, lead time.Duration, seed uint64, st *tenantStats) {
	cfg := refusedCfg()
	cfg.NewcomerHeadroom = true // the benchmark's YAML
	cfg.Classes[Default].QueueTimeout = 100 * time.Millisecond
	cfg.Classes[Default].QueueSize = 256
	var rs []*Scheduler
	for _, c := range shares {
		s := newTest(t, cfg, c)
		if len(shares) > 1 {
			s.SetFleetCapacity(32)
		}
		rs = append(rs, s)
	}
	ctx, stop := context.WithCancel(context.Background())
	relayed := make(chan struct{})
	go func() { // the control plane's relay: each router gets the others' tenants
		defer close(relayed)
		for len(rs) > 1 && ctx.Err() == nil {
			for i, s := range rs {
				sum := map[string]TenantDemand{}
				for j, o := range rs {
					for _, d := range o.Tenants() {
						if j == i {
							continue
						}
						x := sum[d.Tenant]
						x.Tenant, x.Weight = d.Tenant, d.Weight
						x.InFlight, x.Waiting, x.Demand, x.Mean = x.InFlight+d.InFlight, x.Waiting+d.Waiting, x.Demand+d.Demand, x.Mean+d.Mean
						sum[d.Tenant] = x
					}
				}
				others := make([]TenantDemand, 0, len(sum))
				for _, d := range sum {
					others = append(others, d)
				}
				s.SetFleetTenants(others)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}()
	time.Sleep(lead) // the routers are up before the load
	start := time.Now()
	var mu sync.Mutex
	var wg sync.WaitGroup
	send := func(tenant string, rate float64, seed uint64) {
		r := rand.New(rand.NewPCG(seed, 7))
		for time.Since(start) < 20*time.Second {
			time.Sleep(time.Duration(r.ExpFloat64() / rate * float64(time.Second)))
			hold := time.Duration((1 + 0.5*r.Float64()) * float64(time.Second))
			i := r.IntN(len(rs))
			wg.Add(1)
			go func() {
				defer wg.Done()
				began := time.Now()
				var lent *Ticket
				borrow := func() bool {
					for j, o := range rs {
						if j != i {
							if tk, res := o.Lend(Default, tenant, ""); res == Admitted {
								lent = tk
								return true
							}
						}
					}
					return false
				}
				tk, res := rs[i].AdmitOrBorrow(context.Background(), Default, tenant, "", borrow)
				if tenant == "auth:steady" {
					mu.Lock()
					st.requests++
					switch {
					case res == Admitted:
						w := time.Since(began)
						st.waits = append(st.waits, w.Seconds())
						if w > 0 {
							st.waited++
						}
					case res == OverFairShare:
						st.overShare++
						fallthrough
					default:
						st.refused++
						if began.Sub(start) < 2*time.Second {
							st.early++
						}
					}
					mu.Unlock()
				}
				if res == Admitted {
					time.Sleep(hold)
					tk.Release()
					if lent != nil {
						lent.Release()
					}
				}
			}()
		}
	}
	var g sync.WaitGroup
	g.Add(2)
	go func() { defer g.Done(); send("auth:flood", 125, seed*10) }()
	go func() { defer g.Done(); send("auth:steady", 7.5, seed*10+1) }()
	g.Wait()
	wg.Wait()
	stop()
	<-relayed
}

// The steady tenant is refused at most 2% of its requests, a run's first
// 2 s included: the flood held to half the slots in its first holding time
// (newcomer_headroom) instead of taking every slot before the steady
// tenant's second arrival, its headroom kept from that arrival, its bursts
// taking what the flood leaves, and with three routers its headroom pooled.
func TestTenantScenarioModel(t *testing.T) {
	for _, m := range []struct {
		name   string
		shares []int64
		lead   time.Duration // a relay every 250 ms from 0
		seeds  uint64
	}{
		{"one router", []int64{32}, 2 * time.Second, 5},
		{"three routers", []int64{11, 11, 10}, 2 * time.Second, 8},
		{"three routers, a relay 20 ms into the load", []int64{11, 11, 10}, 1980 * time.Millisecond, 8},
	} {
		var st tenantStats
		for seed := uint64(1); seed <= m.seeds; seed++ {
			synctest.Test(t, func(t *testing.T) { tenantScenario(t, m.shares, m.lead, seed, &st) })
		}
		t.Log(m.name)
		st.log(t)
		if st.refused*50 > st.requests {
			t.Errorf("%s: the steady tenant refused %d times in %d requests (%d in a run's first 2 s): want at most 2%%", m.name, st.refused, st.requests, st.early)
		}
	}
}
