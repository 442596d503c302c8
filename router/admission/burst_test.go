package admission

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// A tenant under its weighted share on average bursts past it: its burst
// takes what the over-share tenant leaves instead of being refused at its
// weighted share (work-conserving fairness), and the over-share tenant,
// while the burst lasts, is held to what the burst leaves; on average it
// keeps about its weighted share.
func TestUnderShareBurstPastWeightedShare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTest(t, refusedCfg(), 8)
		ctx, stop := context.WithCancel(context.Background())
		var mu sync.Mutex
		var floodHeld, samples, floodSum int
		go func() { // the flood: a request every 5 ms, each holding its slot 300 ms
			for ctx.Err() == nil {
				if tk, r := s.AdmitTenant(ctx, Default, "auth:flood"); r == Admitted {
					mu.Lock()
					floodHeld++
					mu.Unlock()
					go func() {
						time.Sleep(300 * time.Millisecond)
						mu.Lock()
						floodHeld--
						mu.Unlock()
						tk.Release()
					}()
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
		var wg sync.WaitGroup
		var refused, waited, burstHeld, steadyHeld int
		send := func(measure bool) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				began := time.Now()
				tk, r := s.AdmitTenant(context.Background(), Default, "auth:steady")
				if r != Admitted {
					mu.Lock()
					refused++
					mu.Unlock()
					return
				}
				mu.Lock()
				steadyHeld++
				if measure {
					burstHeld = max(burstHeld, steadyHeld)
					if time.Since(began) > 0 {
						waited++
					}
				}
				mu.Unlock()
				time.Sleep(500 * time.Millisecond)
				mu.Lock()
				steadyHeld--
				mu.Unlock()
				tk.Release()
			}()
		}
		// steady: a request every 250 ms held 500 ms (2 slots on average),
		// and from the 4th second a burst of 4 more at once every 2 s.
		for i := range 40 {
			send(false)
			if i >= 16 && i%8 == 0 {
				for range 4 {
					send(true)
				}
			}
			for range 25 {
				time.Sleep(10 * time.Millisecond)
				if i >= 16 {
					mu.Lock()
					floodSum += floodHeld
					samples++
					mu.Unlock()
				}
			}
		}
		wg.Wait()
		stop()
		time.Sleep(time.Second)
		if refused > 0 || burstHeld <= 4 {
			t.Fatalf("steady refused %d times, held up to %d in its bursts: want every burst admitted past its weighted share of 4", refused, burstHeld)
		}
		if avg := float64(floodSum) / float64(samples); avg < 3 {
			t.Fatalf("the flood held %.2f slots on average: want about its weighted share (4) less the bursts' excess", avg)
		}
		t.Logf("steady waited %d of 12 burst requests; flood held %.2f on average", waited, float64(floodSum)/float64(samples))
	})
}

// Fleet-wide, the other routers' relayed mean decides whether a tenant is
// under its weighted share on average, not what it holds there now: with a
// mean of 2 elsewhere a burst to 6 of its weighted 6 goes on past it; with
// a mean of 5 elsewhere it is refused at its share.
func TestRelayedMeanDecidesBursts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, c := range []struct {
			mean float64
			want Result
		}{{2, Admitted}, {5, OverFairShare}} {
			s := newTest(t, refusedCfg(), 4)
			s.SetFleetCapacity(12)
			s.SetFleetTenants([]TenantDemand{
				{Tenant: "auth:flood", Weight: 1, InFlight: 5, Demand: 50, Mean: 50},
				{Tenant: "auth:steady", Weight: 1, InFlight: 5, Demand: 5, Mean: c.mean},
			})
			held := admitN(t, s, "auth:steady", 1) // 6 of its weighted 6 fleet-wide
			tk, r := s.AdmitTenant(t.Context(), Default, "auth:steady")
			if r != c.want {
				t.Fatalf("relayed mean %v: %v, want %v", c.mean, r, c.want)
			}
			if tk != nil {
				held = append(held, tk)
			}
			for _, h := range held {
				h.Release()
			}
		}
	})
}
