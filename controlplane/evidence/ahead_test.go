package evidence

import (
	"testing"
	"time"

	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// The prompt tokens ahead on a worker, which routers predict TTFT from, are
// the routers' sum, or the engine's own count of tokens to prefill when that
// is larger (both count the same requests), and a router that leaves no
// longer counts. A change short of a jump reaches routers paced, as a load
// change.
func TestPromptTokensAheadAreSummedOverRoutersOrTheEngines(t *testing.T) {
	tr, reg, _ := setup(t, registry.HealthHealthy)
	tr.Contact("w1", t0)
	obs := func(tokens int64) *smgv1.RouterReport {
		return &smgv1.RouterReport{Workers: []*smgv1.WorkerObservation{{WorkerId: "w1", PromptTokensInFlight: tokens}}}
	}
	ahead := func() int64 { return reg.Snapshot().Get("w1").PromptTokensAhead }
	tr.RouterObservations("r1", obs(3000), t0)
	rev := reg.Revision()
	tr.RouterObservations("r2", obs(400), t0)
	if got := ahead(); got != 3400 {
		t.Fatalf("ahead = %d, want 3400 (3000 + 400)", got)
	}
	changes, _, _ := reg.ChangesSince(rev)
	if len(changes) != 1 || !changes[0].LoadOnly {
		t.Fatalf("changes = %+v, want one load-only change", changes)
	}
	tr.Record("w1", judge.Record{PrefillInHand: 9000}, t0)
	if got := ahead(); got != 9000 {
		t.Fatalf("ahead = %d, want the engine's 9000", got)
	}
	tr.Record("w1", judge.Record{PrefillInHand: 0}, t0)
	tr.RouterGone("r1")
	if got := ahead(); got != 400 {
		t.Fatalf("ahead after r1 left = %d, want 400", got)
	}
}

// A change of a router's part that leaves the sum alone (the engine's
// larger count stands) still reaches routers, paced as a load change, so each
// learns which of its reports the sum holds; a negative report counts as 0 (it would
// cancel the other routers' part) and a huge one is bounded.
func TestRoutersPartsOfPromptTokensAheadReachRouters(t *testing.T) {
	tr, reg, _ := setup(t, registry.HealthHealthy)
	tr.Contact("w1", t0)
	obs := func(tokens int64) *smgv1.RouterReport {
		return &smgv1.RouterReport{Workers: []*smgv1.WorkerObservation{{WorkerId: "w1", PromptTokensInFlight: tokens}}}
	}
	w := func() *registry.Worker { return reg.Snapshot().Get("w1") }
	tr.RouterObservations("r1", obs(3000), t0)
	tr.RouterObservations("r2", obs(1000), t0)
	tr.Record("w1", judge.Record{PrefillInHand: 9000}, t0)
	rev := reg.Revision()
	tr.RouterObservations("r1", obs(1000), t0)
	if got := w(); got.PromptTokensAhead != 9000 || got.Evidence.Routers["r1"].PrefillTokens != 1000 {
		t.Fatalf("ahead %d, r1's part %d; want the engine's 9000 and 1000", got.PromptTokensAhead, got.Evidence.Routers["r1"].PrefillTokens)
	}
	changes, _, _ := reg.ChangesSince(rev)
	if len(changes) != 1 || !changes[0].LoadOnly {
		t.Fatalf("changes = %+v, want one load-only change (r1's part)", changes)
	}
	tr.Record("w1", judge.Record{PrefillInHand: 0}, t0)
	tr.RouterObservations("r2", obs(-1<<50), t0)
	if got := w().PromptTokensAhead; got != 1000 {
		t.Fatalf("ahead with r2 reporting a negative count = %d, want r1's 1000", got)
	}
	tr.RouterObservations("r2", obs(1<<62), t0)
	tr.RouterObservations("r3", obs(1<<62), t0)
	if got := w().PromptTokensAhead; got != 1000+2*maxPromptTokens {
		t.Fatalf("ahead with two huge reports = %d, want each bounded (%d)", got, 1000+2*maxPromptTokens)
	}
}

// A report that moves the sum ahead by AheadJumpTokens or more, up or
// down, is a jump: the worker reaches routers at once, as a routing change,
// at most AheadJumpsPerSec times a second over the fleet; a smaller move
// and a jump beyond the bound stay load changes, paced.
func TestAJumpOfPromptTokensAheadReachesRoutersAtOnceWithinTheBound(t *testing.T) {
	tr, reg, _ := setup(t, registry.HealthHealthy)
	tr.Contact("w1", t0)
	report := func(router string, tokens int64, at time.Time) registry.Change {
		t.Helper()
		rev := reg.Revision()
		tr.RouterObservations(router, &smgv1.RouterReport{Workers: []*smgv1.WorkerObservation{{WorkerId: "w1", PromptTokensInFlight: tokens}}}, at)
		changes, _, _ := reg.ChangesSince(rev)
		if len(changes) != 1 {
			t.Fatalf("%s reporting %d: changes %+v, want one", router, tokens, changes)
		}
		return changes[0]
	}
	const j = AheadJumpTokens
	for _, step := range []struct {
		tokens  int64
		routing bool
		what    string
	}{
		{j - 1, false, "a first report under a jump"},
		{2*j - 2, false, "a rise under a jump"},
		{3*j - 2, true, "a rise of a jump"},
		{2*j - 1, false, "a fall under a jump"},
		{j - 1, true, "a fall of a jump"},
	} {
		if c := report("r1", step.tokens, t0); c.LoadOnly == step.routing {
			t.Fatalf("%s (to %d): %+v, want routing %v", step.what, step.tokens, c, step.routing)
		}
	}
	// The bucket started with AheadJumpsPerSec and r1 took two: r2 jumping
	// again and again in the same instant gets the rest, then none.
	var n int64
	for i := 2; i < AheadJumpsPerSec; i++ {
		n += j
		if c := report("r2", n, t0); c.LoadOnly {
			t.Fatalf("jump %d in one instant: %+v, want a routing change", i+1, c)
		}
	}
	if c := report("r2", n+j, t0); !c.LoadOnly {
		t.Fatalf("jump %d in one instant: %+v, want a load change (beyond the bound)", AheadJumpsPerSec+1, c)
	}
	if c := report("r2", 0, t0.Add(time.Second/AheadJumpsPerSec)); c.LoadOnly {
		t.Fatalf("a jump 1/%d s later: %+v, want a routing change (the bucket refilled one)", AheadJumpsPerSec, c)
	}
	if got := reg.Snapshot().Get("w1").PromptTokensAhead; got != j-1 {
		t.Fatalf("ahead = %d, want r1's %d", got, j-1)
	}
	// A part that moves while the engine's larger count stands moves no
	// sum: no jump.
	tr.Record("w1", judge.Record{PrefillInHand: 100 * j}, t0.Add(time.Second))
	if c := report("r1", 10*j, t0.Add(time.Second)); !c.LoadOnly {
		t.Fatalf("a part's rise under the engine's count: %+v, want a load change", c)
	}
}

// Reports arrive slightly out of order (each ingest reads the clock
// before taking its locks): the jump bound holds within a token a second
// for every millisecond of disorder, never more.
func TestJumpBoundHoldsOutOfOrder(t *testing.T) {
	tr, _, _ := setup(t, registry.HealthHealthy)
	const secs, skew = 10, time.Millisecond
	granted := 0
	for i := range secs * 1000 {
		at := t0.Add(time.Duration(i) * time.Millisecond)
		if i%2 == 1 {
			at = at.Add(-skew)
		}
		if tr.jumps.AllowN(at, 1) {
			granted++
		}
	}
	if limit := AheadJumpsPerSec*(secs+1) + secs; granted > limit {
		t.Fatalf("%d jumps in %d s of reports out of order by %v, want at most %d", granted, secs, skew, limit)
	}
}
