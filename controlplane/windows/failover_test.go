package windows

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// A new leader (or a restarted control plane) whose routers still hold rooms
// from the previous one: each router's share starts at what it reports
// holding (a router keeping its share through the failover reports at least
// that share), and no share grows until the longer warm-up has passed, so a
// router that reconnects late finds its rooms not handed out. Then shares
// rebalance as usual. Without rooms held, the short warm-up applies.
func TestNewLeaderKeepsWhatRoutersHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		spec := int32(4)
		a, reg := newAdmissionAllocator(t, &smgv1.WorkerSpec{Url: "http://w1", MaxRunningRequests: &spec}, 0)
		a.opts.Warmup, a.opts.HeldWarmup = time.Second, 5*time.Second
		round := runRounds(t, a, reg)
		d := func(inFlight, waiting int64) []*smgv1.DecodeDemand {
			return []*smgv1.DecodeDemand{{WorkerId: "w1", InFlight: inFlight, Waiting: waiting}}
		}
		// r1 held 2 under the previous leader and waits for more; r2, which
		// held the other 2, has not reconnected yet.
		a.RouterDemand("r1", reg.Revision(), d(2, 6), time.Now())
		if s := round(); s["r1"] != 2 {
			t.Fatalf("first round: %v, want r1 keeping the 2 it holds", s)
		}
		time.Sleep(3 * time.Second) // past the short warm-up
		if s := round(); s["r1"] != 2 {
			t.Fatalf("3 s in: %v, want r1 still at 2 (r2 may hold the rest)", s)
		}
		a.RouterDemand("r2", reg.Revision(), d(2, 0), time.Now())
		if s := round(); s["r1"] != 2 || s["r2"] != 2 {
			t.Fatalf("r2 back: %v, want 2 each", s)
		}
		// After the warm-up the window moves to where it is wanted, r2's
		// rooms only once it has given them up.
		time.Sleep(2 * time.Second)
		a.RouterDemand("r2", reg.Revision(), d(0, 0), time.Now())
		s := round()
		for range 8 {
			a.RouterDemand("r1", reg.Revision(), d(s["r1"], 6), time.Now())
			a.RouterDemand("r2", reg.Revision(), d(0, 0), time.Now())
			s = round()
		}
		if s["r1"] <= 2 || s["r1"]+s["r2"] > 4 {
			t.Fatalf("after the warm-up: %v, want r1 grown within the window", s)
		}
	})
}

// runRounds runs a's loop in the test's bubble until the test ends; each call
// of the returned round lets one round pass and returns w1's shares.
func runRounds(t *testing.T, a *Allocator, reg *registry.Registry) (round func() map[string]int64) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go a.Run(ctx)
	return func() map[string]int64 {
		time.Sleep(DefaultInterval)
		synctest.Wait()
		return reg.Snapshot().Get("w1").WindowShare
	}
}
