package evidence

import (
	"testing"

	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// The prompt tokens ahead on a worker, which routers predict TTFT from, are
// the routers' sum, or the engine's own count of tokens to prefill when that
// is larger (both count the same requests), and a router that leaves no
// longer counts. The change reaches routers paced, as a load change.
func TestPromptTokensAheadAreSummedOverRoutersOrTheEngines(t *testing.T) {
	tr, reg, _ := setup(t, registry.HealthHealthy)
	tr.Contact("w1", t0)
	obs := func(tokens int64) *smgv1.RouterReport {
		return &smgv1.RouterReport{Workers: []*smgv1.WorkerObservation{{WorkerId: "w1", PromptTokensInFlight: tokens}}}
	}
	ahead := func() int64 { return reg.Snapshot().Get("w1").PromptTokensAhead }
	tr.RouterObservations("r1", obs(3000), t0)
	rev := reg.Revision()
	tr.RouterObservations("r2", obs(1000), t0)
	if got := ahead(); got != 4000 {
		t.Fatalf("ahead = %d, want 4000 (3000 + 1000)", got)
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
	if got := ahead(); got != 1000 {
		t.Fatalf("ahead after r1 left = %d, want 1000", got)
	}
}
