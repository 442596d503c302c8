package evidence_test

import (
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/smg-project/smg/controlplane/evidence"
	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/loadpb"
)

// The inbox reuses memory: the caller's decoded load (ReportCopy copies
// it), fresh loads that the flush makes for the reports to come, records it
// clones into. None of it may be what a stored record holds: over random
// reports (flips, no-reports, a hostile load of 300 ranks, the caller's
// buffer rewritten for each) and flushes with liveness records, every
// record and load ever stored stays as it was stored, and each worker ends
// with its latest report (or the one before a no-report).
func TestStoredRecordsAndLoadsNeverChange(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) { checkStoredNeverChange(t, seed) })
	}
}

func checkStoredNeverChange(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 5))
	reg := registry.New("e", 0)
	ids := make([]string, 40)
	if _, err := reg.Update(func(tx *registry.Txn) error {
		for i := range ids {
			ids[i] = fmt.Sprintf("w%02d", i)
			tx.Insert(&registry.Worker{Registered: registry.Registered{ID: ids[i], Spec: &smgv1.WorkerSpec{Url: "http://" + ids[i]}, Model: "m", Thresholds: judge.DefaultGatewayThresholds().Resolve(nil)}, State: registry.State{Health: registry.HealthHealthy}})
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	log := slog.New(slog.DiscardHandler)
	in := evidence.New(reg, evidence.Options{Rules: judge.DefaultLivenessConfig(), Now: func() time.Time { return now }, Coalesce: true},
		log, prometheus.NewRegistry())
	tr := in

	records := map[*registry.Worker]registry.Worker{}  // every record stored, as stored
	loads := map[*smgv1.EngineLoad]*smgv1.EngineLoad{} // every load stored, as stored
	remember := func() {
		for _, id := range ids {
			w := reg.Get(id)
			if _, ok := records[w]; !ok {
				records[w] = *w
			}
			if _, ok := loads[w.Load]; w.Load != nil && !ok {
				loads[w.Load] = proto.CloneOf(w.Load)
			}
		}
	}
	check := func(step int) {
		t.Helper()
		for w, was := range records {
			if !reflect.DeepEqual(*w, was) {
				t.Fatalf("step %d: the stored record of %s changed after it was stored", step, w.ID)
			}
		}
		for l, was := range loads {
			if !proto.Equal(l, was) {
				t.Fatalf("step %d: a stored load changed after it was stored: %v, was %v", step, l, was)
			}
		}
	}
	buf := &smgv1.EngineLoad{} // the caller's, rewritten for each report
	last := map[string]*smgv1.EngineLoad{}
	flips := 0
	for step := range 400 {
		now = now.Add(10 * time.Millisecond)
		switch k := rng.IntN(10); {
		case k == 0:
			tr.Flush()
		case k == 1:
			id := ids[rng.IntN(len(ids))]
			if err := in.NoReport(id); err != nil {
				t.Fatal(err)
			}
			delete(last, id) // its pending load is dropped: the stored one stays

		default:
			for range 1 + rng.IntN(4) {
				ranks := 1 + rng.IntN(3)
				if rng.IntN(50) == 0 {
					ranks = 300 // hostile
				}
				buf.Reset()
				buf.Source = fmt.Sprint("s", step)
				buf.ReportedAt = timestamppb.New(now)
				for r := range ranks {
					buf.Ranks = append(buf.Ranks, &smgv1.RankLoad{DpRank: int32(r), WaitingRequests: int32(rng.IntN(12)), TokenUsage: rng.Float64()})
				}
				id := ids[rng.IntN(len(ids))]
				rev := reg.Revision()
				if err := in.ReportCopy(id, buf); err != nil {
					t.Fatal(err)
				}
				if reg.Revision() != rev {
					flips++
				}
				tr.Record(id, judge.Record{Pushed: true, Waiting: int64(buf.Ranks[0].WaitingRequests)}, now)
				last[id] = proto.CloneOf(buf)
			}
		}
		remember()
		if step%20 == 0 {
			check(step)
		}
	}
	tr.Flush()
	remember()
	check(400)
	if flips == 0 {
		t.Fatal("no report flipped a verdict: the test does not cover reports that commit at once")
	}
	for id, l := range last {
		want := proto.CloneOf(l)
		waiting, usage := loadpb.Signals(want.Ranks)
		want.WaitingRequests, want.TokenUsage = int32(min(waiting, math.MaxInt32)), usage
		if got := reg.Get(id).Load; !proto.Equal(got, want) {
			t.Fatalf("%s ends with load %v, want its latest report %v", id, got, want)
		}
	}
}
