package evidence

import (
	"context"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

func coalescing(t *testing.T) (*Inbox, *registry.Registry) {
	t.Helper()
	_, reg, _ := setup(t, registry.HealthHealthy)
	return New(reg, Options{Rules: judge.DefaultLivenessConfig(), Coalesce: true}, slog.New(slog.DiscardHandler), prometheus.NewRegistry()), reg
}

func pushedAt(reg *registry.Registry) time.Time { return reg.Snapshot().Get("w1").Evidence.PushedAt }

// A pushed record that leaves the verdict as it is waits for the flush: no
// transaction of its own.
func TestCoalescedRecordWaitsForTheFlush(t *testing.T) {
	tr, reg := coalescing(t)
	tr.Record("w1", judge.Record{Pushed: true}, t0)
	tr.Record("w1", judge.Record{Pushed: true, Waiting: 2}, t0.Add(50*time.Millisecond))
	if !pushedAt(reg).IsZero() {
		t.Fatal("a record that changes no verdict was stored before the flush")
	}
	tr.Flush()
	if got := pushedAt(reg); !got.Equal(t0.Add(50 * time.Millisecond)) {
		t.Fatalf("after the flush PushedAt = %v, want the latest record's time", got)
	}
}

// A record that changes the verdict commits at once: contact re-admits an
// unreachable worker without waiting for a flush.
func TestCoalescedRecordThatFlipsCommitsAtOnce(t *testing.T) {
	tr, reg := coalescing(t)
	tr.Contact("w1", t0)
	tr.Failure("w1", judge.ConnectionFailure, t0.Add(time.Second))
	tr.Sweep(t0.Add(2 * time.Second))
	if got := liveness(reg); got != smgv1.Veto_VETO_UNREACHABLE {
		t.Fatalf("liveness = %v, want unreachable", got)
	}
	tr.Record("w1", judge.Record{Pushed: true}, t0.Add(3*time.Second))
	if got := liveness(reg); got != smgv1.Veto_VETO_UNSPECIFIED {
		t.Fatalf("after a record: liveness %v, want re-admitted at once", got)
	}
}

// Pending records are older than any evidence that commits after them: a
// transaction touching the worker stores them first, in order.
func TestPendingRecordsGoBeforeLaterEvidence(t *testing.T) {
	tr, reg := coalescing(t)
	tr.Record("w1", judge.Record{Pushed: true}, t0)
	tr.Failure("w1", judge.ConnectionFailure, t0.Add(100*time.Millisecond))
	if got := pushedAt(reg); !got.Equal(t0) {
		t.Fatalf("PushedAt = %v after a later failure committed, want the pending record's %v", got, t0)
	}
	// The failure came after the record's contact: the worker is
	// unreachable once the stall bound passes without contact.
	tr.Sweep(t0.Add(10 * time.Second))
	if got := liveness(reg); got != smgv1.Veto_VETO_UNREACHABLE {
		t.Fatalf("liveness = %v, want unreachable: the failure must not be undone by the older record", got)
	}
}

// The sweep stores the pending records first and judges the worker with
// them: a worker that pushed a moment ago is never judged silent from older
// evidence, and one whose last record does not keep it from going stale is
// vetoed with that record stored.
func TestSweepStoresPendingRecordsFirst(t *testing.T) {
	tr, reg := coalescing(t)
	stale := time.Duration(judge.DefaultStaleSecs) * time.Second

	tr.Record("w1", judge.Record{Pushed: true}, t0)
	tr.Sweep(t0.Add(time.Second))
	if got := pushedAt(reg); !got.Equal(t0) {
		t.Fatalf("PushedAt = %v after the sweep, want the pending record's %v", got, t0)
	}
	last := t0.Add(stale - 500*time.Millisecond)
	tr.Record("w1", judge.Record{Pushed: true}, last)
	tr.Sweep(t0.Add(stale + time.Second)) // stale from the stored evidence alone
	if got := liveness(reg); got != smgv1.Veto_VETO_UNSPECIFIED {
		t.Fatalf("liveness = %v, want live: the sweep judged without the record pushed 1.5 s before", got)
	}
	if got := pushedAt(reg); !got.Equal(last) {
		t.Fatalf("PushedAt = %v after the sweep, want %v", got, last)
	}
	later := last.Add(time.Second)
	tr.Record("w1", judge.Record{Pushed: true}, later)
	tr.Sweep(later.Add(stale + time.Second))
	if got := liveness(reg); got == smgv1.Veto_VETO_UNSPECIFIED {
		t.Fatal("not vetoed: silent for longer than the stale bound after its last record")
	}
	if got := pushedAt(reg); !got.Equal(later) {
		t.Fatalf("PushedAt = %v with the veto, want the record it was judged with (%v)", got, later)
	}
	if ids := pendingIDs(tr); len(ids) != 0 {
		t.Fatalf("pending after the veto's commit: %v, want none", ids)
	}
}

// Run stores pending records at every sweep (every judge.SweepInterval),
// not before.
func TestRunFlushesAtEverySweep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, reg, _ := setup(t, registry.HealthHealthy)
		tr := New(reg, Options{Rules: judge.DefaultLivenessConfig(), Coalesce: true, Now: time.Now},
			slog.New(slog.DiscardHandler), prometheus.NewRegistry())
		at := time.Now()
		tr.Record("w1", judge.Record{Pushed: true}, at)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { tr.Run(ctx); close(done) }()
		time.Sleep(judge.SweepInterval / 2)
		synctest.Wait()
		if !pushedAt(reg).IsZero() {
			t.Fatal("the record was stored before the first sweep")
		}
		time.Sleep(judge.SweepInterval)
		synctest.Wait()
		if got := pushedAt(reg); !got.Equal(at) {
			t.Fatalf("PushedAt = %v after the first sweep, want the record's %v", got, at)
		}
		cancel()
		<-done
	})
}
