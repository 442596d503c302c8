package liveness

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

// RecordAll is Record of each record in order: random batches of records
// (some that flip a verdict, in the middle of a batch, with records of the
// same worker after them), mixed with failures, router piles, flushes and
// sweeps, leave two registries fed one way and the other with the same
// records, evidence, verdicts and commits after every step.
func TestRecordAllIsRecordOfEach(t *testing.T) {
	ids := []string{"w1", "w2", "w3"}
	open := func() (*Tracker, *registry.Registry) {
		reg := registry.New("e", 0)
		if _, err := reg.Update(func(txn *registry.Txn) error {
			for _, id := range ids {
				txn.Insert(&registry.Worker{ID: id, Spec: &smgv1.WorkerSpec{Url: "http://" + id}, Model: "m", Type: "regular",
					Health: registry.HealthHealthy})
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return New(reg, Options{Rules: judge.DefaultLivenessConfig(), Coalesce: true}, slog.New(slog.DiscardHandler), prometheus.NewRegistry()), reg
	}
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 7))
		trA, regA := open() // RecordAll
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
				batch := make([]Pushed, 1+rng.IntN(8))
				for i := range batch {
					batch[i] = Pushed{WorkerID: ids[rng.IntN(len(ids))], Rec: judge.Record{
						Pushed: rng.IntN(8) != 0, Waiting: int64(rng.IntN(3)), StepWire: true, Idle: rng.IntN(2) == 0,
						Silence: time.Duration(rng.IntN(3)) * 2 * time.Second,
						Heard:   judge.Heard{Stream: 1, SentAt: now.Add(-time.Millisecond)}}}
				}
				rev := regA.Revision()
				trA.RecordAll(batch, now)
				if regA.Revision() != rev {
					flips++
				}
				for _, p := range batch {
					trB.Record(p.WorkerID, p.Rec, now)
				}
			}
			if a, b := regA.Revision(), regB.Revision(); a != b {
				t.Fatalf("seed %d step %d: revision %d with RecordAll, %d with Record", seed, step, a, b)
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
		return fmt.Errorf("veto %v %q with RecordAll, %v %q with Record", a.Liveness, a.LivenessReason, b.Liveness, b.LivenessReason)
	}
	if !reflect.DeepEqual(a.Evidence, b.Evidence) {
		return fmt.Errorf("evidence differs:\n%+v\n%+v", a.Evidence, b.Evidence)
	}
	return nil
}
