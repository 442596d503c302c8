package admission

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// packRun floods with tenant a (a request every 5 ms, each holding its slot
// 300 ms: 60 slots wanted on average against a weighted share of 4 of 8)
// alone for a second, then beside tenant b's stream (a request every 100 ms
// holding 300 ms: 3 slots on average, under its weighted 4). It returns how
// many of a's tickets were packed alone and beside b (after b's first
// second), and how many of b's were.
func packRun(t *testing.T, s *Scheduler) (aloneA, besideA, admittedBesideA, packedB int) {
	start := time.Now()
	ctx, stop := context.WithCancel(context.Background())
	var mu sync.Mutex
	bFrom := start.Add(time.Second)
	go func() {
		for ctx.Err() == nil {
			if tk, r := s.AdmitTenant(ctx, Default, "auth:a"); r == Admitted {
				mu.Lock()
				switch since := time.Since(bFrom); {
				case since < 0:
					if tk.Packed() {
						aloneA++
					}
				case since > time.Second:
					admittedBesideA++
					if tk.Packed() {
						besideA++
					}
				}
				mu.Unlock()
				go func() { time.Sleep(300 * time.Millisecond); tk.Release() }()
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	time.Sleep(time.Until(bFrom))
	for range 40 {
		tk, r := s.AdmitTenant(context.Background(), Default, "auth:b")
		if r != Admitted {
			t.Fatalf("b refused (%d)", r)
		}
		if tk.Packed() {
			packedB++
		}
		go func() { time.Sleep(300 * time.Millisecond); tk.Release() }()
		time.Sleep(100 * time.Millisecond)
	}
	stop()
	time.Sleep(time.Second)
	mu.Lock()
	defer mu.Unlock()
	return aloneA, besideA, admittedBesideA, packedB
}

// With pack_over_share, a tenant that wants more than its weighted share
// on average beside another active tenant is packed; alone it is not, and
// a tenant under its weighted share never is. Each packed admission is
// counted.
func TestPackOverShare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := refusedCfg()
		cfg.PackOverShare = true
		s := newTest(t, cfg, 8)
		aloneA, besideA, admitted, packedB := packRun(t, s)
		if aloneA != 0 {
			t.Errorf("a alone: %d tickets packed, want none (alone it misses capacity, not its share)", aloneA)
		}
		if admitted == 0 || besideA != admitted {
			t.Errorf("a beside b: %d of %d tickets packed, want every one", besideA, admitted)
		}
		if packedB != 0 {
			t.Errorf("b, under its weighted share: %d tickets packed, want none", packedB)
		}
		counted := testutil.ToFloat64(s.m.packed.WithLabelValues(s.m.tenants.label("auth:a")))
		if counted < float64(besideA) || testutil.ToFloat64(s.m.packed.WithLabelValues(s.m.tenants.label("auth:b"))) != 0 {
			t.Errorf("smg_scheduler_fair_share_packed_total: a %v (want at least %d), b %v (want 0)", counted, besideA,
				testutil.ToFloat64(s.m.packed.WithLabelValues(s.m.tenants.label("auth:b"))))
		}
	})
}

// Without the key no ticket is packed, whatever the tenants want.
func TestPackOverShareOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTest(t, refusedCfg(), 8)
		aloneA, besideA, admitted, packedB := packRun(t, s)
		if aloneA+besideA+packedB != 0 || admitted == 0 {
			t.Fatalf("packed without pack_over_share: a alone %d, a beside b %d of %d, b %d", aloneA, besideA, admitted, packedB)
		}
	})
}

// Fleet-wide: a tenant that floods through other routers (relayed) makes
// the one here active beside it, and one that wants more than its weighted
// share of the fleet on average is packed here though this router sees
// only a few of its requests.
func TestPackOverShareFleetWide(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := refusedCfg()
		cfg.PackOverShare = true
		s := newTest(t, cfg, 4)
		s.SetFleetCapacity(12)
		s.SetFleetTenants([]TenantDemand{{Tenant: "auth:flood", Weight: 1, InFlight: 5, Demand: 20, Mean: 20},
			{Tenant: "auth:steady", Weight: 1, InFlight: 2, Demand: 3, Mean: 3}})
		flood := admitN(t, s, "auth:flood", 1)[0]
		steady := admitN(t, s, "auth:steady", 1)[0]
		if !flood.Packed() || steady.Packed() {
			t.Fatalf("packed: flood %v (mean 20 against a weighted 6 of 12: want true), steady %v (mean 3: want false)", flood.Packed(), steady.Packed())
		}
	})
}
