package evidence_test

import (
	"errors"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/smg-project/smg/controlplane/evidence"
	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// ObserveAll is ReportCopy and then Record of each agent record in order:
// random batches (flips in the middle, the same worker again after them,
// no-reports, unknown workers, a worker out of Ready) leave two registries
// fed one way and the other with the same loads, verdicts and commits, and
// the same errors.
func TestObserveAllIsReportCopyOfEach(t *testing.T) {
	ids := []string{"w1", "w2", "w3", "gone"}
	open := func() (*evidence.Inbox, *registry.Registry) {
		reg := registry.New("e", 0)
		if _, err := reg.Update(func(tx *registry.Txn) error {
			for i, id := range ids[:3] {
				health := registry.HealthHealthy
				if i == 2 {
					health = registry.HealthPending
				}
				tx.Insert(&registry.Worker{Registered: registry.Registered{ID: id, Spec: &smgv1.WorkerSpec{Url: "http://" + id}, Model: "m", Thresholds: judge.DefaultGatewayThresholds().Resolve(nil)}, State: registry.State{Health: health}})
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return evidence.New(reg, evidence.Options{Coalesce: true}, slog.New(slog.DiscardHandler), prometheus.NewRegistry()), reg
	}
	flips := 0
	at := time.Unix(1_700_000_000, 0)
	for seed := range uint64(100) {
		rng := rand.New(rand.NewPCG(seed, 3))
		inA, regA := open() // ObserveAll
		inB, regB := open() // ReportCopy, Record
		for step := range 40 {
			if rng.IntN(5) == 0 {
				inA.Flush()
				inB.Flush()
			} else {
				batch := make([]evidence.Observed, 1+rng.IntN(8))
				for i := range batch {
					batch[i].WorkerID = ids[rng.IntN(len(ids))]
					batch[i].Load = &smgv1.EngineLoad{} // no report
					if rng.IntN(6) != 0 {
						batch[i].Load = load(int32(rng.IntN(12))) // the default ceiling is 8
					}
					batch[i].Rec = judge.Record{Pushed: true, Waiting: int64(batch[i].Load.GetWaitingRequests())}
				}
				var errsA, errsB []error
				rev := regA.Revision()
				inA.ObserveAll(batch, at, func(i int, err error) { errsA = append(errsA, err) })
				if regA.Revision() != rev {
					flips++
				}
				for _, r := range batch {
					l := proto.CloneOf(r.Load)
					if err := inB.ReportCopy(r.WorkerID, l); err != nil {
						errsB = append(errsB, err)
					}
					if !proto.Equal(l, r.Load) {
						t.Fatal("ReportCopy changed its caller's load")
					}
					inB.Record(r.WorkerID, r.Rec, at)
				}
				if len(errsA) != len(errsB) {
					t.Fatalf("seed %d step %d: %d errors with ObserveAll, %d one by one", seed, step, len(errsA), len(errsB))
				}
				for i := range errsA {
					if !errors.Is(errsA[i], evidence.ErrUnknownWorker) || !errors.Is(errsB[i], evidence.ErrUnknownWorker) {
						t.Fatalf("seed %d step %d: errors %v and %v, want unknown worker", seed, step, errsA[i], errsB[i])
					}
				}
			}
			if a, b := regA.Revision(), regB.Revision(); a != b {
				t.Fatalf("seed %d step %d: revision %d with ObserveAll, %d one by one", seed, step, a, b)
			}
			for _, id := range ids[:3] {
				a, b := regA.Get(id), regB.Get(id)
				if a.Overloaded != b.Overloaded || a.LoadRevision != b.LoadRevision || a.Evidence.NoReport != b.Evidence.NoReport ||
					!proto.Equal(a.Load, b.Load) {
					t.Fatalf("seed %d step %d: %s differs: overloaded %v/%v, load revision %d/%d, no report %v/%v, load %v / %v",
						seed, step, id, a.Overloaded, b.Overloaded, a.LoadRevision, b.LoadRevision, a.Evidence.NoReport, b.Evidence.NoReport, a.Load, b.Load)
				}
			}
		}
	}
	if flips == 0 {
		t.Fatal("no batch committed: the test does not cover reports that flip")
	}
}
