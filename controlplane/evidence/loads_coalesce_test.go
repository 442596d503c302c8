package evidence_test

import (
	"context"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/smg-project/smg/controlplane/evidence"
	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

func coalescing(t *testing.T) (*evidence.Inbox, *registry.Registry) {
	t.Helper()
	reg := registry.New("e", 0)
	if _, err := reg.Update(func(tx *registry.Txn) error {
		tx.Insert(&registry.Worker{Registered: registry.Registered{ID: "w1", Spec: &smgv1.WorkerSpec{Url: "http://e1"}, Model: "m", Thresholds: judge.DefaultGatewayThresholds().Resolve(nil)}, State: registry.State{Health: registry.HealthHealthy}})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	in := evidence.New(reg, evidence.Options{Coalesce: true}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	return in, reg
}

func load(waiting int32) *smgv1.EngineLoad {
	return &smgv1.EngineLoad{Ranks: []*smgv1.RankLoad{{WaitingRequests: waiting}}}
}

func TestCoalescedReportWaitsForFlushLatestWins(t *testing.T) {
	in, reg := coalescing(t)
	rev := reg.Revision()
	for _, w := range []int32{1, 2, 3} {
		if err := in.Report("w1", load(w)); err != nil {
			t.Fatal(err)
		}
	}
	if reg.Revision() != rev || reg.Get("w1").Load != nil {
		t.Fatal("a report that keeps the verdict committed before the flush")
	}
	in.Flush()
	w := reg.Get("w1")
	if got := w.Load.GetWaitingRequests(); got != 3 {
		t.Fatalf("flushed waiting = %d, want the latest report's 3", got)
	}
	if reg.Revision() != rev+1 {
		t.Fatalf("flush made %d revisions, want 1", reg.Revision()-rev)
	}
}

func TestCoalescedFlipCommitsAtOnce(t *testing.T) {
	in, reg := coalescing(t)
	if err := in.Report("w1", load(8)); err != nil { // 8 >= the default 8
		t.Fatal(err)
	}
	if w := reg.Get("w1"); !w.Overloaded || w.Load.GetWaitingRequests() != 8 {
		t.Fatalf("a flipping report waited for the flush: overloaded %v load %v", w.Overloaded, w.Load)
	}
	if err := in.Report("w1", load(7)); err != nil { // the first report under every threshold clears
		t.Fatal(err)
	}
	if reg.Get("w1").Overloaded {
		t.Fatal("the first report under every threshold did not clear the veto at once")
	}
}

func TestNoReportDropsThePendingLoad(t *testing.T) {
	in, reg := coalescing(t)
	if err := in.Report("w1", load(9)); err != nil {
		t.Fatal(err)
	}
	if err := in.Report("w1", load(10)); err != nil { // still overloaded: pending
		t.Fatal(err)
	}
	if err := in.NoReport("w1"); err != nil {
		t.Fatal(err)
	}
	in.Flush()
	w := reg.Get("w1")
	if w.Overloaded {
		t.Fatal("a flush brought back a veto that a later no-report cleared")
	}
	if got := w.Load.GetWaitingRequests(); got != 9 {
		t.Fatalf("load = %d, want 9: the pending report older than the no-report must not land", got)
	}
}

func TestRunFlushesWithinTheInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		in, reg := coalescing(t)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { in.Run(ctx); close(done) }()
		if err := in.Report("w1", load(2)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(judge.SweepInterval)
		synctest.Wait()
		if got := reg.Get("w1").Load.GetWaitingRequests(); got != 2 {
			t.Fatalf("after one flush interval the load is %d, want 2", got)
		}
		cancel()
		<-done
	})
}

// A contact ("the engine answered with the load you have") moves the load
// revision at the next flush with the load as it is, so routers start their
// dispatch counts again; a pending load moves it once, and a no-report
// (no load to confirm) not at all.
func TestRefreshMovesTheLoadRevisionAtTheFlush(t *testing.T) {
	in, reg := coalescing(t)
	if err := in.Report("w1", load(2)); err != nil {
		t.Fatal(err)
	}
	in.Flush()
	before := reg.Get("w1")

	if err := in.Refresh("w1"); err != nil {
		t.Fatal(err)
	}
	if reg.Get("w1").LoadRevision != before.LoadRevision {
		t.Fatal("a refresh committed before the flush")
	}
	in.Flush()
	after := reg.Get("w1")
	if after.LoadRevision != before.LoadRevision+1 || after.Load != before.Load || after.Overloaded {
		t.Fatalf("after the flush: load revision %d (want %d), same load %v, overloaded %v",
			after.LoadRevision, before.LoadRevision+1, after.Load == before.Load, after.Overloaded)
	}
	in.Flush()
	if reg.Get("w1").LoadRevision != after.LoadRevision {
		t.Fatal("a refresh moved the load revision at two flushes")
	}

	// A refresh with a newer load pending: one move, the new load.
	if err := in.Report("w1", load(3)); err != nil {
		t.Fatal(err)
	}
	if err := in.Refresh("w1"); err != nil {
		t.Fatal(err)
	}
	in.Flush()
	if w := reg.Get("w1"); w.LoadRevision != after.LoadRevision+1 || w.Load.GetWaitingRequests() != 3 {
		t.Fatalf("load revision %d (want %d), waiting %d (want 3)", w.LoadRevision, after.LoadRevision+1, w.Load.GetWaitingRequests())
	}

	// After a no-report there is no load to confirm.
	if err := in.NoReport("w1"); err != nil {
		t.Fatal(err)
	}
	rev := reg.Get("w1").LoadRevision
	if err := in.Refresh("w1"); err != nil {
		t.Fatal(err)
	}
	in.Flush()
	if reg.Get("w1").LoadRevision != rev {
		t.Fatal("a refresh after a no-report moved the load revision")
	}
}
