package controlplane_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/sim"
)

// An engine restarted between two of the control plane's own polls is never
// seen unreachable; the new process_start_time_seconds its /metrics page
// carries is the contact that ends the spell: ContactSeq bumps (routers
// close its breaker, the window learner probes again) and the restart is
// logged with the old and new start time.
func TestFastRestartSeenByItsStartTime(t *testing.T) {
	h := startCP(t, fastOptions())
	engine := startSim(t, nil)
	id := h.register(t, fmt.Sprintf(`{"url":%q}`, engine.URL()))
	h.waitFor(t, "the engine's start time held", func(s *registry.Snapshot) bool { return s.Get(id).Evidence.StartTime > 0 })
	w := h.reg.Get(id)
	first, seq := w.Evidence.StartTime, w.ContactSeq

	if err := engine.SetFault(sim.Fault{Kill: true}); err != nil {
		t.Fatal(err)
	}
	if err := engine.SetFault(sim.Fault{}); err != nil { // back within one poll (1 s)
		t.Fatal(err)
	}
	h.waitFor(t, "contact_seq to bump on the new start time", func(s *registry.Snapshot) bool { return s.Get(id).ContactSeq > seq })
	w = h.reg.Get(id)
	if w.ContactSeq != seq+1 || !(w.Evidence.StartTime > first) || w.Liveness != smgv1.Veto_VETO_UNSPECIFIED {
		t.Fatalf("after the restart: contact_seq %d (was %d), start %v (was %v), liveness %v; want one bump, a later start, no veto",
			w.ContactSeq, seq, w.Evidence.StartTime, first, w.Liveness)
	}
	// The restart is logged after its commit, by the poll that made it,
	// before that poll's next report commits.
	h.waitFor(t, "the next report", func(s *registry.Snapshot) bool { return s.Get(id).LoadRevision > w.LoadRevision })
	for _, line := range strings.Split(h.logs.String(), "\n") {
		if strings.Contains(line, "Engine restarted") && strings.Contains(line, "worker_id="+id) &&
			strings.Contains(line, "old_start_time=") && strings.Contains(line, "new_start_time=") {
			return
		}
	}
	t.Fatalf("no restart log line naming %s with its old and new start time", id)
}
