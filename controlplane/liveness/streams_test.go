package liveness

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// The sweep judges a worker with its agent stream's read state: a stream
// whose receive loop is stuck on a message holds the stale veto off (and
// the gauge counts the worker), up to the cap; once the stream is closed its
// worker is judged on the control plane's clock alone.
func TestSweepHoldsTheStaleVetoForAStreamBehind(t *testing.T) {
	tr, reg, m := setup(t, registry.HealthHealthy)
	agent := t0.Add(-time.Hour)
	st := tr.OpenStream()
	tr.Record("w1", judge.Record{Pushed: true, Heard: st.Read(t0, agent)}, t0)
	st.Applied()
	st.Read(t0.Add(time.Second), agent.Add(time.Second)) // its apply is stuck

	tr.Sweep(t0.Add(16 * time.Second))
	if got := liveness(reg); got != smgv1.Veto_VETO_UNSPECIFIED {
		t.Fatalf("vetoed while the stream was not read: %v", got)
	}
	if v := testutil.ToFloat64(tr.held); v != 1 {
		t.Fatalf("smg_liveness_held_for_read_lag_workers = %v, want 1", v)
	}
	if n := testutil.CollectAndCount(m, "smg_liveness_held_for_read_lag_workers"); n != 1 {
		t.Fatalf("gauge not registered: %d series", n)
	}
	tr.Sweep(t0.Add(31 * time.Second)) // past the stale bound plus the cap
	if got := liveness(reg); got != smgv1.Veto_VETO_UNREACHABLE {
		t.Fatalf("held past the cap: %v", got)
	}
	if v := testutil.ToFloat64(tr.held); v != 0 {
		t.Fatalf("gauge %v after the veto, want 0", v)
	}

	tr.Heard("w1", st.Read(t0.Add(32*time.Second), agent.Add(32*time.Second)), t0.Add(32*time.Second))
	if got := liveness(reg); got != smgv1.Veto_VETO_UNSPECIFIED {
		t.Fatalf("the agent's contact did not re-admit: %v", got)
	}
	tr.CloseStream(st) // stuck and gone: no credit
	tr.Sweep(t0.Add(47 * time.Second))
	if got := liveness(reg); got != smgv1.Veto_VETO_UNREACHABLE {
		t.Fatalf("a closed stream's worker not vetoed at the stale bound: %v", got)
	}
}
