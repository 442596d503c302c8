package evidence

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
	if got := tr.HeldForReadLag(); got != 1 { // what the last sweep set the gauge to
		t.Fatalf("HeldForReadLag = %v while one worker is held, want 1", got)
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
	if got := tr.HeldForReadLag(); got != 0 {
		t.Fatalf("HeldForReadLag = %v after the veto, want 0", got)
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

// A sweep that comes long after the previous one (the process was paused or
// starved) runs before the receive loops have read what arrived meanwhile:
// the stall is credited to every stream not read since, up to the cap.
func TestSweepAfterAStallOfTheProcessWaitsForTheStreams(t *testing.T) {
	tr, reg, _ := setup(t, registry.HealthHealthy)
	agent := t0.Add(-time.Hour)
	st := tr.OpenStream()
	tr.Record("w1", judge.Record{Pushed: true, Heard: st.Read(t0, agent)}, t0)
	st.Applied() // waiting for the next message
	at := t0
	for ; at.Before(t0.Add(5 * time.Second)); at = at.Add(judge.SweepInterval) {
		tr.Sweep(at)
	}
	at = at.Add(20 * time.Second) // the process stood still
	tr.Sweep(at)
	if got := liveness(reg); got != smgv1.Veto_VETO_UNSPECIFIED {
		t.Fatalf("vetoed by the first sweep after a 20 s stall: %v", got)
	}
	// The stall's credit is capped: a stream that reads nothing more is
	// vetoed at most 15 s (the cap) after the stale bound.
	for ; at.Before(t0.Add(30 * time.Second)); at = at.Add(judge.SweepInterval) {
		tr.Sweep(at)
		if got := liveness(reg); got != smgv1.Veto_VETO_UNSPECIFIED {
			t.Fatalf("vetoed at %v, before the stale bound plus the cap", at.Sub(t0))
		}
	}
	tr.Sweep(at)
	if got := liveness(reg); got != smgv1.Veto_VETO_UNREACHABLE {
		t.Fatalf("a silent stream after a stall, at %v: %v, want unreachable", at.Sub(t0), got)
	}
}

// Sweeps on time count no stall: a stream waiting for its next message, read
// to the end, is taken as silent from its last message.
func TestSweepsOnTimeCountNoStall(t *testing.T) {
	tr, reg, _ := setup(t, registry.HealthHealthy)
	st := tr.OpenStream()
	tr.Record("w1", judge.Record{Pushed: true, Heard: st.Read(t0, t0)}, t0)
	st.Applied()
	at := t0
	for ; at.Before(t0.Add(15 * time.Second)); at = at.Add(900 * time.Millisecond) { // late, not stalled
		tr.Sweep(at)
	}
	tr.Sweep(t0.Add(15 * time.Second))
	if got := liveness(reg); got != smgv1.Veto_VETO_UNREACHABLE {
		t.Fatalf("silent 15 s, swept on time: %v, want unreachable", got)
	}
}
