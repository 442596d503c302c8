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

// A model of the benchmark's tenant scenario on one scheduler, admission
// alone (no engines, no routers): capacity 32, a steady tenant at 7.5
// requests/s and a flooding one at 125/s (0.3x and 5x of a capacity of 25/s),
// each answer holding its slot 1-1.5 s, a queue timeout of 100 ms, five
// seeds. The steady tenant, under its weighted share on average, is never
// refused over its fair share; its refusals (408, a run's first second while
// the flood holds what it took before the steady tenant showed) and waits
// are logged: go test -run TestTenantScenarioModel -v ./router/admission.
func TestTenantScenarioModel(t *testing.T) {
	for seed := uint64(1); seed <= 5; seed++ {
		synctest.Test(t, func(t *testing.T) {
			cfg := refusedCfg()
			cfg.Classes[Default].QueueTimeout = 100 * time.Millisecond
			cfg.Classes[Default].QueueSize = 256
			s := newTest(t, cfg, 32)
			time.Sleep(2 * time.Second) // the router is up before the load
			var mu sync.Mutex
			var waits []float64
			refused := map[Result]int{}
			var early int
			var wg sync.WaitGroup
			start := time.Now()
			hold := func(r *rand.Rand) time.Duration {
				return time.Duration((1.0 + 0.5*r.Float64()) * float64(time.Second))
			}
			run := func(tenant string, rate float64, seed uint64, record bool) {
				r := rand.New(rand.NewPCG(seed, 7))
				for time.Since(start) < 20*time.Second {
					time.Sleep(time.Duration(r.ExpFloat64() / rate * float64(time.Second)))
					h := hold(r)
					wg.Add(1)
					go func() {
						defer wg.Done()
						began := time.Now()
						tk, res := s.AdmitTenant(context.Background(), Default, tenant)
						if record {
							mu.Lock()
							if res != Admitted {
								refused[res]++
								if began.Sub(start) < 2*time.Second {
									early++
								}
							} else {
								waits = append(waits, time.Since(began).Seconds())
							}
							mu.Unlock()
						}
						if res == Admitted {
							time.Sleep(h)
							tk.Release()
						}
					}()
				}
			}
			var g sync.WaitGroup
			g.Add(2)
			go func() { defer g.Done(); run("auth:flood", 125, seed*10, false) }()
			go func() { defer g.Done(); run("auth:steady", 7.5, seed*10+1, true) }()
			g.Wait()
			wg.Wait()
			sort.Float64s(waits)
			n := len(waits)
			waited := 0
			for _, w := range waits {
				if w > 0 {
					waited++
				}
			}
			tot := n
			for _, v := range refused {
				tot += v
			}
			if refused[OverFairShare] > 0 {
				t.Errorf("seed %d: the steady tenant refused over its fair share %d times", seed, refused[OverFairShare])
			}
			t.Logf("seed %d: steady %d requests, refused %d (%d timed out; %d in the first 2 s), %d answers waited (p99 %.0f ms, max %.0f ms)",
				seed, tot, tot-n, refused[QueueTimeout], early, waited, waits[n*99/100]*1000, waits[n-1]*1000)
		})
	}
}
