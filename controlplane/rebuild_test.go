package controlplane_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/smg-project/smg/controlplane/registry"
)

const rebuiltWarning = `level=WARN msg="Load monitor rebuilt its state: overload vetoes cleared for every worker"`

// rebuilds returns the log's monitor-rebuild warnings.
func rebuilds(logs string) []string {
	var out []string
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, rebuiltWarning) {
			out = append(out, line)
		}
	}
	return out
}

// A replica that stops leading drops its verdicts (the spec: the veto is
// cleared for every worker when the monitor has to rebuild its state, logged
// as a warning), and one that takes up leading starts from no verdict, with
// the same warning.
func TestLeadershipChangesRebuildTheMonitorWithAWarning(t *testing.T) {
	dir := t.TempDir()
	opts := fastOptions()
	opts.Cluster.DataDir = dir
	opts.Cluster.RaftAddr = "127.0.0.1:0"
	h := startCP(t, opts)
	waitLeading(t, h)
	engine := frozenEngine(t, 5)
	waitEngineWaiting(t, engine, 5)
	id := h.register(t, fmt.Sprintf(`{"url":%q,"overload":{"waiting_requests":4}}`, engine.URL()))
	h.waitFor(t, "overloaded at 5 waiting >= 4", overloaded(id, true))
	if got := rebuilds(h.logs.String()); len(got) != 1 || !strings.Contains(got[0], `reason="elected leader in term `) || !strings.Contains(got[0], "workers=0 cleared=0") {
		t.Fatalf("taking up leading logs one rebuild warning (no worker yet), got %q", got)
	}

	h.stop() // leadership ends: the replica's loops stop
	w := h.reg.Snapshot().Get(id)
	if w == nil || w.Overloaded || w.OverloadReason != "" || w.Load != nil || w.Health != registry.HealthHealthy {
		t.Fatalf("a replica that stopped leading keeps soft state: %+v", w)
	}
	got := rebuilds(h.logs.String())
	if len(got) != 2 || !strings.Contains(got[1], `reason="no longer the leader: its verdicts are dropped" workers=1 cleared=1`) {
		t.Fatalf("stepping down logs the rebuild with the veto it cleared, got %q", got)
	}

	// The same data dir leads again: its stored worker is presumed Ready
	// with no veto until its first report, and the warning says so.
	h2 := startCP(t, opts)
	waitLeading(t, h2)
	h2.waitFor(t, "the stored worker presumed Ready", ready(id))
	if got := rebuilds(h2.logs.String()); len(got) != 1 || !strings.Contains(got[0], `reason="elected leader in term `) || !strings.Contains(got[0], "workers=1 cleared=0") {
		t.Fatalf("a restarted replica logs its rebuild with the stored worker, got %q", got)
	}
	h2.waitFor(t, "the veto back from the first report", overloaded(id, true))
}

// waitLeading waits for a one-node cluster to elect itself and take up
// leading.
func waitLeading(t *testing.T, h *harness) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, ok := h.cp.Cluster.Leading(); ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the node never took up leading")
		}
		<-time.After(10 * time.Millisecond)
	}
}
