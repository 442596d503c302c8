package evidence

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// An engine killed just after answering a router: the agent's failed poll
// vetoes it, and the router's next report (up to a report interval later)
// says it had contact. That answer is older than the failure: the worker
// stays out until contact after the failure.
func TestRouterContactOlderThanTheFailureLeavesTheVeto(t *testing.T) {
	tr, reg, _ := setup(t, registry.HealthHealthy)
	tr.Contact("w1", t0)
	answered := t0.Add(2400 * time.Millisecond)
	failed := t0.Add(2500 * time.Millisecond) // past the 2 s stall bound
	tr.Failure("w1", judge.ConnectionFailure, failed)
	if got := liveness(reg); got != smgv1.Veto_VETO_UNREACHABLE {
		t.Fatalf("a connection failure after %s of silence left liveness %v, want unreachable", failed.Sub(t0), got)
	}
	report := func(at time.Time) *smgv1.RouterReport {
		return &smgv1.RouterReport{Workers: []*smgv1.WorkerObservation{{WorkerId: "w1", Contact: true, LastContact: timestamppb.New(at)}}}
	}
	tr.RouterObservations("r1", report(answered), failed.Add(200*time.Millisecond))
	for at := failed.Add(250 * time.Millisecond); at.Before(failed.Add(20 * time.Second)); at = at.Add(judge.SweepInterval) {
		tr.Sweep(at)
		if got := liveness(reg); got != smgv1.Veto_VETO_UNREACHABLE {
			t.Fatalf("%s after the failure, an answer from %s before it left liveness %v, want unreachable",
				at.Sub(failed), failed.Sub(answered), got)
		}
	}
	back := failed.Add(21 * time.Second)
	tr.RouterObservations("r1", report(back), back.Add(100*time.Millisecond))
	if got := liveness(reg); got != smgv1.Veto_VETO_UNSPECIFIED {
		t.Fatalf("an answer after the failure left liveness %v, want re-admitted", got)
	}
}
