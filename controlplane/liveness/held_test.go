package liveness

import (
	"testing"
	"time"

	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
)

// HeldForReadLag reads what the last sweep set the gauge to.
func TestHeldForReadLagIsTheGauge(t *testing.T) {
	tr, _, _ := setup(t, registry.HealthHealthy)
	agent := t0.Add(-time.Hour)
	st := tr.OpenStream()
	tr.Record("w1", judge.Record{Pushed: true, Heard: st.Read(t0, agent)}, t0)
	st.Applied()
	st.Read(t0.Add(time.Second), agent.Add(time.Second)) // its apply is stuck
	tr.Sweep(t0.Add(16 * time.Second))
	if got := tr.HeldForReadLag(); got != 1 {
		t.Fatalf("HeldForReadLag = %v while one worker is held, want 1", got)
	}
	tr.Sweep(t0.Add(31 * time.Second)) // past the cap: vetoed, no longer held
	if got := tr.HeldForReadLag(); got != 0 {
		t.Fatalf("HeldForReadLag = %v after the veto, want 0", got)
	}
}
