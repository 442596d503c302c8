package evidence

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// ObserveAll of records without a load is Record of each in order: random batches of records
// (some that flip a verdict, in the middle of a batch, with records of the
// same worker after them), mixed with failures, router piles, flushes and
// sweeps, leave two registries fed one way and the other with the same
// records, evidence, verdicts and commits after every step.
func TestObserveAllIsRecordOfEach(t *testing.T) {
	ids := []string{"w1", "w2", "w3"}
	open := func() (*Inbox, *registry.Registry) { return openHealthy(t, ids, true) }
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 7))
		trA, regA := open() // ObserveAll
		trB, regB := open() // Record
		now := t0
		flips := 0
		for step := range 60 {
			now = now.Add(time.Duration(rng.IntN(2500)) * time.Millisecond)
			switch rng.IntN(8) {
			case 0:
				id := ids[rng.IntN(len(ids))]
				trA.Failure(id, judge.ConnectionFailure, now)
				trB.Failure(id, judge.ConnectionFailure, now)
			case 1:
				trA.Sweep(now)
				trB.Sweep(now)
			case 2:
				trA.Flush()
				trB.Flush()
			case 3:
				rep := &smgv1.RouterReport{Workers: []*smgv1.WorkerObservation{{WorkerId: ids[rng.IntN(len(ids))],
					StreamsInFlight: int32(rng.IntN(6)), Contact: rng.IntN(2) == 0}}}
				trA.RouterObservations("r1", rep, now)
				trB.RouterObservations("r1", rep, now)
			default:
				batch := make([]Observed, 1+rng.IntN(8))
				for i := range batch {
					batch[i] = Observed{WorkerID: ids[rng.IntN(len(ids))], Rec: judge.Record{
						Pushed: rng.IntN(8) != 0, Waiting: int64(rng.IntN(3)), StepWire: true, Idle: rng.IntN(2) == 0,
						Silence: time.Duration(rng.IntN(3)) * 2 * time.Second,
						Heard:   judge.Heard{Stream: 1, SentAt: now.Add(-time.Millisecond)}}}
				}
				rev := regA.Revision()
				trA.ObserveAll(batch, now, nil)
				if regA.Revision() != rev {
					flips++
				}
				for _, p := range batch {
					trB.Record(p.WorkerID, p.Rec, now)
				}
			}
			if a, b := regA.Revision(), regB.Revision(); a != b {
				t.Fatalf("seed %d step %d: revision %d with ObserveAll, %d with Record", seed, step, a, b)
			}
			for _, id := range ids {
				if err := sameWorker(regA.Snapshot().Get(id), regB.Snapshot().Get(id)); err != nil {
					t.Fatalf("seed %d step %d: %s: %v", seed, step, id, err)
				}
			}
		}
		if seed == 0 && flips == 0 {
			t.Fatal("no batch committed a verdict change: the test does not cover records that must commit")
		}
	}
}

func sameWorker(a, b *registry.Worker) error {
	if a.Liveness != b.Liveness || a.LivenessReason != b.LivenessReason {
		return fmt.Errorf("veto %v %q with ObserveAll, %v %q with Record", a.Liveness, a.LivenessReason, b.Liveness, b.LivenessReason)
	}
	if !reflect.DeepEqual(a.Evidence, b.Evidence) {
		return fmt.Errorf("evidence differs:\n%+v\n%+v", a.Evidence, b.Evidence)
	}
	return nil
}

// A coalescing tracker never holds back a verdict: fed the same evidence as
// one that commits every record, its registry shows the same veto and
// reason after every step (a record pends only when it leaves them as they
// are), and the same evidence once flushed.
func TestCoalescingHoldsBackNoVerdict(t *testing.T) {
	ids := []string{"w1", "w2"}
	open := func(coalesce bool) (*Inbox, *registry.Registry) { return openHealthy(t, ids, coalesce) }
	changes := 0
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, 5))
		trA, regA := open(true)
		trB, regB := open(false)
		now := t0
		for step := range 80 {
			now = now.Add(time.Duration(rng.IntN(1500)) * time.Millisecond)
			id := ids[rng.IntN(len(ids))]
			switch rng.IntN(7) {
			case 0:
				trA.Failure(id, judge.ConnectionFailure, now)
				trB.Failure(id, judge.ConnectionFailure, now)
			case 1:
				trA.Sweep(now)
				trB.Sweep(now)
			case 2:
				rep := &smgv1.RouterReport{Workers: []*smgv1.WorkerObservation{{WorkerId: id,
					StreamsInFlight: int32(rng.IntN(6)), Contact: rng.IntN(3) == 0}}}
				trA.RouterObservations("r1", rep, now)
				trB.RouterObservations("r1", rep, now)
			default:
				rec := judge.Record{Pushed: rng.IntN(10) != 0, Waiting: int64(rng.IntN(3)), StepWire: rng.IntN(4) != 0,
					Idle: rng.IntN(2) == 0, Silence: time.Duration(rng.IntN(4)) * 1500 * time.Millisecond,
					Heard: judge.Heard{Stream: 1, SentAt: now.Add(-time.Millisecond)}}
				before := regB.Get(id).Liveness
				trA.Record(id, rec, now)
				trB.Record(id, rec, now)
				if regB.Get(id).Liveness != before {
					changes++
				}
			}
			for _, id := range ids {
				a, b := regA.Get(id), regB.Get(id)
				if a.Liveness != b.Liveness || a.LivenessReason != b.LivenessReason {
					t.Fatalf("seed %d step %d: %s: veto %v %q coalescing, %v %q committing every record",
						seed, step, id, a.Liveness, a.LivenessReason, b.Liveness, b.LivenessReason)
				}
			}
		}
		trA.Flush()
		for _, id := range ids {
			a, b := regA.Get(id), regB.Get(id)
			if !reflect.DeepEqual(a.Evidence.Live, b.Evidence.Live) || !a.Evidence.PushedAt.Equal(b.Evidence.PushedAt) {
				t.Fatalf("seed %d: %s: flushed evidence differs:\n%+v\n%+v", seed, id, a.Evidence.Live, b.Evidence.Live)
			}
		}
	}
	if changes < 100 {
		t.Fatalf("%d verdict changes by records in all runs: the test does not exercise records that flip", changes)
	}
}

// A record that pends is judged against the stored verdict even when the
// stored record changed under its pending ones (a sweep that committed while
// they pended): pending contact that the new stored evidence lacks
// re-admits at the next record, at once.
func TestRecordAfterTheStoredRecordMovedUnderPendingOnes(t *testing.T) {
	tr, reg := coalescing(t)
	rules := judge.DefaultLivenessConfig().Rules()
	tr.Record("w1", judge.Record{Pushed: true}, t0)
	tr.Flush()
	tr.Record("w1", judge.Record{Pushed: true}, t0.Add(14*time.Second)) // pends: live
	// A sweep's transaction that began before that record: it judges the
	// stored evidence alone (stale at 15 s), leaving the record pending.
	stale := t0.Add(16 * time.Second)
	if _, err := reg.Update(func(txn *registry.Txn) error {
		c := txn.Get("w1").Clone()
		c.Evidence.Live.Sweep(stale, nil, &rules)
		txn.Insert(c)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := liveness(reg); got != smgv1.Veto_VETO_UNREACHABLE {
		t.Fatalf("liveness = %v after the sweep, want unreachable (stale)", got)
	}
	tr.Record("w1", judge.Record{Pushed: true}, stale.Add(10*time.Millisecond))
	if got := liveness(reg); got != smgv1.Veto_VETO_UNSPECIFIED {
		t.Fatalf("liveness = %v after a record, want re-admitted at once, not at the next flush", got)
	}
}

// openHealthy is a tracker over a registry of healthy workers ids.
func openHealthy(t *testing.T, ids []string, coalesce bool) (*Inbox, *registry.Registry) {
	t.Helper()
	reg := registry.New("e", 0)
	if _, err := reg.Update(func(txn *registry.Txn) error {
		for _, id := range ids {
			txn.Insert(&registry.Worker{Registered: registry.Registered{ID: id, Spec: &smgv1.WorkerSpec{Url: "http://" + id}, Model: "m", Type: "regular"}, State: registry.State{Health: registry.HealthHealthy}})
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return New(reg, Options{Rules: judge.DefaultLivenessConfig(), Coalesce: coalesce}, slog.New(slog.DiscardHandler), prometheus.NewRegistry()), reg
}
