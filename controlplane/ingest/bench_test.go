package ingest_test

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/smg-project/smg/controlplane/admin"
	"github.com/smg-project/smg/controlplane/ingest"
	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// BenchmarkReport measures one report's ingestion as an agent pushes it:
// protobuf decode of the EngineLoad, the overload verdict and the memdb
// commit, over a registry of 1,000 workers. reports/s = 1e9 / ns_per_op.
func BenchmarkReport(b *testing.B) {
	reg, ids, wires := benchFleet(b)
	in := ingest.New(reg, ingest.Options{}, slog.New(slog.DiscardHandler))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		load := &smgv1.EngineLoad{}
		if err := proto.Unmarshal(wires[i%len(wires)], load); err != nil {
			b.Fatal(err)
		}
		if err := in.Report(ids[i%len(ids)], load); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "reports/s")
}

// benchFleet is a registry of 1,000 Ready workers with realistic ids, and
// wire-encoded reports, some over the default thresholds so verdicts flip.
func benchFleet(b *testing.B) (*registry.Registry, []string, [][]byte) {
	const workers = 1000
	reg := registry.New("bench", registry.DefaultHistory)
	ids := make([]string, workers)
	th := judge.DefaultGatewayThresholds().Resolve(nil)
	_, err := reg.Update(func(t *registry.Txn) error {
		for i := range ids {
			url := fmt.Sprintf("http://10.0.%d.%d:8000", i/250, i%250)
			ids[i] = admin.WorkerID(url)
			w := &registry.Worker{ID: ids[i], Spec: &smgv1.WorkerSpec{Url: url},
				Model: "m", Type: "regular", Thresholds: th, Health: registry.HealthHealthy}
			t.Insert(w)
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	// A few wire reports per worker, some over the thresholds, so verdicts flip.
	wires := make([][]byte, 16)
	for i := range wires {
		load := &smgv1.EngineLoad{Source: "vllm", ReportedAt: timestamppb.New(time.Unix(1700000000, 0))}
		for r := range 2 {
			load.Ranks = append(load.Ranks, &smgv1.RankLoad{DpRank: int32(r), WaitingRequests: int32(i % 6), RunningRequests: 32,
				TokenUsage: float64(i%10) / 10, GenThroughput: 1500, CacheHitRate: 0.4, MaxRunningRequests: 256})
		}
		load.WaitingRequests, load.TokenUsage = int32(2*(i%6)), float64(i%10)/10
		wires[i], _ = proto.Marshal(load)
	}
	return reg, ids, wires
}

// BenchmarkReportCoalesced is the control plane's configuration: a report
// that leaves the verdict as it is waits for the next flush (latest wins per
// worker), one that flips it commits at once. Each worker keeps its load
// level, as in steady state, and a flush runs every 5,000 reports: what the
// 50 ms flush sees at 100,000 reports/s over 1,000 workers. One op is one
// report, flushes included.
func BenchmarkReportCoalesced(b *testing.B) {
	reg, ids, wires := benchFleet(b)
	in := ingest.New(reg, ingest.Options{Coalesce: true}, slog.New(slog.DiscardHandler))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		w := i % len(ids)
		load := &smgv1.EngineLoad{}
		if err := proto.Unmarshal(wires[w%len(wires)], load); err != nil {
			b.Fatal(err)
		}
		if err := in.Report(ids[w], load); err != nil {
			b.Fatal(err)
		}
		i++
		if i%5000 == 0 {
			in.Flush()
		}
	}
	in.Flush()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "reports/s")
}
