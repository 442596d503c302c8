package evidence_test

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/smg-project/smg/controlplane/evidence"
	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// A flush stores a worker's pending load and its pending liveness records on
// one record, in one transaction, and one with records alone is written too.
func TestFlushStoresLoadsAndRecordsTogether(t *testing.T) {
	reg := registry.New("e", 0)
	th := judge.DefaultGatewayThresholds().Resolve(nil)
	if _, err := reg.Update(func(tx *registry.Txn) error {
		for _, id := range []string{"w1", "w2", "w3"} {
			tx.Insert(&registry.Worker{Registered: registry.Registered{ID: id, Spec: &smgv1.WorkerSpec{Url: "http://" + id}, Model: "m", Thresholds: th}, State: registry.State{Health: registry.HealthHealthy}})
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1_700_000_000, 0)
	log := slog.New(slog.DiscardHandler)
	in := evidence.New(reg, evidence.Options{Rules: judge.DefaultLivenessConfig(), Now: func() time.Time { return t0 }, Coalesce: true},
		log, prometheus.NewRegistry())
	tr := in

	if err := in.Report("w1", load(2)); err != nil { // a load and records
		t.Fatal(err)
	}
	tr.Record("w1", judge.Record{Pushed: true, Waiting: 2}, t0)
	tr.Record("w1", judge.Record{Pushed: true, Waiting: 2}, t0.Add(50*time.Millisecond))
	tr.Record("w2", judge.Record{Pushed: true}, t0.Add(20*time.Millisecond)) // records alone
	if err := in.Report("w3", load(1)); err != nil {                         // a load alone
		t.Fatal(err)
	}
	if w := reg.Get("w1"); w.Load != nil || !w.Evidence.PushedAt.IsZero() {
		t.Fatal("evidence that changes no verdict was stored before the flush")
	}
	rev := reg.Revision()
	tr.Flush()

	if got := reg.Revision(); got != rev+1 {
		t.Fatalf("the flush committed %d revisions, want 1", got-rev)
	}
	w1 := reg.Get("w1")
	if w1.Load.GetWaitingRequests() != 2 || !w1.Evidence.PushedAt.Equal(t0.Add(50*time.Millisecond)) {
		t.Fatalf("w1: load %v, pushed at %v; want both the load and the latest record", w1.Load, w1.Evidence.PushedAt)
	}
	if w2 := reg.Get("w2"); !w2.Evidence.PushedAt.Equal(t0.Add(20 * time.Millisecond)) {
		t.Fatalf("w2's records alone were not stored: pushed at %v", w2.Evidence.PushedAt)
	}
	if w3 := reg.Get("w3"); w3.Load.GetWaitingRequests() != 1 {
		t.Fatalf("w3's load was not stored: %v", w3.Load)
	}
	// Nothing pending is left for a second flush.
	rev = reg.Revision()
	tr.Flush()
	if reg.Revision() != rev {
		t.Fatal("a second flush found evidence left over")
	}
}

// A flush stores a large fleet in transactions of a bounded size, so a
// report that flips a verdict waits for one of them, not for all: one
// arriving between two of them commits at once, and the older load it
// replaced, not stored yet, is not stored after it.
func TestFlushCommitsInChunksAndNewerReportsWin(t *testing.T) {
	const workers = 2500 // three transactions of at most 1,024
	reg := registry.New("e", 0)
	th := judge.DefaultGatewayThresholds().Resolve(nil)
	ids := make([]string, workers)
	if _, err := reg.Update(func(tx *registry.Txn) error {
		for i := range ids {
			ids[i] = fmt.Sprintf("w%04d", i)
			tx.Insert(&registry.Worker{Registered: registry.Registered{ID: ids[i], Spec: &smgv1.WorkerSpec{Url: "http://" + ids[i]}, Model: "m", Thresholds: th}, State: registry.State{Health: registry.HealthHealthy}})
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	in := evidence.New(reg, evidence.Options{Coalesce: true}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	for _, id := range ids {
		if err := in.Report(id, load(1)); err != nil {
			t.Fatal(err)
		}
	}
	rev := reg.Revision()
	chunks := 0
	var flipped string
	evidence.BetweenChunks(in, func() {
		chunks++
		if chunks > 1 {
			return
		}
		// Between the first two transactions: a report over the ceiling
		// for a worker not stored yet commits at once.
		for _, id := range ids {
			if reg.Get(id).Load == nil {
				flipped = id
				break
			}
		}
		if err := in.Report(flipped, load(20)); err != nil {
			t.Fatal(err)
		}
		if w := reg.Get(flipped); !w.Overloaded || w.Load.GetWaitingRequests() != 20 {
			t.Fatalf("a flip between two flush transactions did not commit at once: %+v", w)
		}
	})
	in.Flush()
	if got := reg.Revision() - rev; got != 3+1 { // three chunks and the flip
		t.Fatalf("%d revisions for a flush of %d workers and one flip, want 4", got, workers)
	}
	for _, id := range ids {
		w := reg.Get(id)
		want := int32(1)
		if id == flipped {
			want = 20
		}
		if got := w.Load.GetWaitingRequests(); got != want {
			t.Fatalf("%s: stored waiting %d, want %d", id, got, want)
		}
	}
	if !reg.Get(flipped).Overloaded {
		t.Fatal("the flush's older load undid the flip")
	}
}
