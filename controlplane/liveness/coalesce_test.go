package liveness

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

func coalescing(t *testing.T) (*Tracker, *registry.Registry) {
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

// With Options.Flush, another writer's flush stores pending records (the
// ingester's, with the loads); the sweep calls it first, and judges the
// records that came since with the stored evidence: a worker that pushed a
// moment ago is never judged silent from older evidence. Those records are
// stored only with a verdict they move; otherwise the next flush stores
// them (the sweep wrote every such worker a second time).
func TestSweepJudgesPendingRecordsWithOptionsFlush(t *testing.T) {
	_, reg, _ := setup(t, registry.HealthHealthy)
	flushes, flushOn := 0, true
	var tr *Tracker
	tr = New(reg, Options{Rules: judge.DefaultLivenessConfig(), Coalesce: true, Flush: func() {
		flushes++
		if flushOn {
			riderFlush(t, tr, reg)
		}
	}}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	stale := time.Duration(judge.DefaultStaleSecs) * time.Second

	tr.Record("w1", judge.Record{Pushed: true}, t0)
	tr.Sweep(t0.Add(time.Second))
	if got := pushedAt(reg); !got.Equal(t0) {
		t.Fatalf("PushedAt = %v after the sweep's flush, want the pending record's %v", got, t0)
	}
	// A record after the flush: the sweep judges it, and writes nothing.
	flushOn = false
	last := t0.Add(stale - 500*time.Millisecond)
	tr.Record("w1", judge.Record{Pushed: true}, last)
	stored, rev := reg.Get("w1"), reg.Revision()
	tr.Sweep(t0.Add(stale + time.Second)) // stale from the stored evidence alone
	if got := liveness(reg); got != smgv1.Veto_VETO_UNSPECIFIED {
		t.Fatalf("liveness = %v, want live: the sweep judged without the record pushed 1.5 s before", got)
	}
	if reg.Get("w1") != stored || reg.Revision() != rev {
		t.Fatal("the sweep wrote a worker whose pending record moved no verdict")
	}
	if ids := tr.PendingIDs(nil); len(ids) != 1 || ids[0] != "w1" {
		t.Fatalf("pending after the sweep: %v, want w1's record kept for the next flush", ids)
	}
	flushOn = true
	tr.Sweep(t0.Add(stale + 2*time.Second))
	if got := pushedAt(reg); !got.Equal(last) {
		t.Fatalf("PushedAt = %v after the next flush, want %v", got, last)
	}
	// A record after the flush that does not keep the worker from going
	// stale: the sweep stores it with the veto.
	flushOn = false
	later := last.Add(time.Second)
	tr.Record("w1", judge.Record{Pushed: true}, later)
	tr.Sweep(later.Add(stale + time.Second))
	if got := liveness(reg); got == smgv1.Veto_VETO_UNSPECIFIED {
		t.Fatal("not vetoed: silent for longer than the stale bound after its last record")
	}
	if got := pushedAt(reg); !got.Equal(later) {
		t.Fatalf("PushedAt = %v with the veto, want the record it was judged with (%v)", got, later)
	}
	if ids := tr.PendingIDs(nil); len(ids) != 0 {
		t.Fatalf("pending after the veto's commit: %v, want none", ids)
	}
	if flushes != 4 {
		t.Fatalf("Options.Flush ran %d times for 4 sweeps, want 4", flushes)
	}
}

// riderFlush stores tr's pending records as the ingester's flush does
// (ingest.Options.Rider): Take inside one transaction.
func riderFlush(t *testing.T, tr *Tracker, reg *registry.Registry) {
	t.Helper()
	if err := flushRider(tr, reg); err != nil {
		t.Fatal(err)
	}
}

// With Options.Flush, Run flushes before every sweep and not on its own
// 50 ms ticker: four flushes a second.
func TestRunFlushesBeforeEverySweepWithOptionsFlush(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, reg, _ := setup(t, registry.HealthHealthy)
		var flushes atomic.Int64
		tr := New(reg, Options{Rules: judge.DefaultLivenessConfig(), Coalesce: true, Flush: func() { flushes.Add(1) }},
			slog.New(slog.DiscardHandler), prometheus.NewRegistry())
		tr.Record("w1", judge.Record{Pushed: true}, t0)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { tr.Run(ctx); close(done) }()
		time.Sleep(judge.SweepInterval / 2)
		synctest.Wait()
		if !pushedAt(reg).IsZero() {
			t.Fatal("the tracker flushed on its own ticker before the first sweep")
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if got, want := flushes.Load(), int64(time.Second/judge.SweepInterval); got != want {
			t.Fatalf("%d flushes after 1.125 s (a sweep every 250 ms), want %d", got, want)
		}
		cancel()
		<-done
	})
}
