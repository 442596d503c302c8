package evidence_test

import (
	"fmt"
	"log/slog"
	"math"
	"math/bits"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/smg-project/smg/controlplane/admin"
	"github.com/smg-project/smg/controlplane/evidence"
	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// BenchmarkReport measures one report's ingestion as an agent pushes it:
// protobuf decode of the EngineLoad, the overload verdict and the registry
// commit, over a registry of 1,000 workers. reports/s = 1e9 / ns_per_op.
func BenchmarkReport(b *testing.B) {
	reg, ids, wires := benchFleet(b)
	in := evidence.New(reg, evidence.Options{}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
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
			w := &registry.Worker{Registered: registry.Registered{ID: ids[i], Spec: &smgv1.WorkerSpec{Url: url}, Model: "m", Type: "regular", Thresholds: th}, State: registry.State{Health: registry.HealthHealthy}}
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
	in := evidence.New(reg, evidence.Options{Coalesce: true}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
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

// BenchmarkReportParallel is the agent streams' side of the control plane:
// 100 goroutines (one per stream on 2 cores) each decode and report their
// own workers' loads (1,000 workers in all, ReportCopy from a buffer of
// their own, each worker under the thresholds), and a goroutine of its own
// flushes every 5,000 reports (as Run does on its ticker). In flips, one report
// in 500 of each goroutine goes over the thresholds (and its next comes
// back): two commits at once. One op is one report, flushes included;
// report-p99-ns and report-p99.9-ns are a report's own time (with
// flips, a report that waits behind one is in the 0.1%), and
// mutex-wait-ns/op the time goroutines spent waiting for any lock
// (runtime/metrics), per report.
func BenchmarkReportParallel(b *testing.B) {
	for _, flipEvery := range []int{0, 500} {
		name := "steady"
		if flipEvery > 0 {
			name = "flips"
		}
		b.Run(name, func(b *testing.B) {
			reg, ids, wires := benchFleet(b)
			in := evidence.New(reg, evidence.Options{Coalesce: true}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
			const streams = 100
			var next, ops atomic.Int64
			var mu sync.Mutex
			var all latencies
			wait := []metrics.Sample{{Name: "/sync/mutex/wait/total:seconds"}}
			metrics.Read(wait)
			waited := wait[0].Value.Float64()
			kick, flushed := make(chan struct{}, 1), make(chan struct{})
			go func() {
				for range kick {
					in.Flush()
				}
				close(flushed)
			}()
			b.SetParallelism(max(1, streams/runtime.GOMAXPROCS(0)))
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				g := int(next.Add(1) - 1)
				load := &smgv1.EngineLoad{}
				var lat latencies
				for i := 0; pb.Next(); i++ {
					w := (g + streams*i) % len(ids)
					wire := wires[w%4]                         // waiting 0 to 6: under the default 8
					if flipEvery > 0 && (i+g)%flipEvery == 0 { // the streams' flips at different times
						wire = wires[5] // waiting 10
					}
					if err := proto.Unmarshal(wire, load); err != nil {
						b.Error(err)
						return
					}
					start := time.Now()
					if err := in.ReportCopy(ids[w], load); err != nil {
						b.Error(err)
						return
					}
					lat.add(time.Since(start))
					if ops.Add(1)%5000 == 0 {
						select {
						case kick <- struct{}{}:
						default: // a flush is due already
						}
					}
				}
				mu.Lock()
				all.merge(&lat)
				mu.Unlock()
			})
			close(kick)
			<-flushed
			in.Flush()
			metrics.Read(wait)
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "reports/s")
			b.ReportMetric(float64(all.quantile(0.99)), "report-p99-ns")
			b.ReportMetric(float64(all.quantile(0.999)), "report-p99.9-ns")
			b.ReportMetric((wait[0].Value.Float64()-waited)*1e9/float64(b.N), "mutex-wait-ns/op")
		})
	}
}

// latencies is a histogram of durations in buckets of 1/8 of a power of two.
type latencies [64 * 8]int64

func (h *latencies) add(d time.Duration) {
	n := uint64(max(d, 1))
	e := bits.Len64(n) - 1 // n is in [2^e, 2^(e+1))
	sub := 0
	if e >= 3 {
		sub = int(n>>(e-3)) & 7
	}
	h[e*8+sub]++
}

func (h *latencies) merge(o *latencies) {
	for i := range h {
		h[i] += o[i]
	}
}

// quantile returns the upper bound of the bucket that holds quantile q.
func (h *latencies) quantile(q float64) time.Duration {
	var total int64
	for _, c := range h {
		total += c
	}
	rank := int64(math.Ceil(q * float64(total)))
	for i, c := range h {
		if rank -= c; rank <= 0 {
			e, sub := i/8, i%8
			return time.Duration((uint64(8+sub+1) << e) >> 3)
		}
	}
	return 0
}

// BenchmarkFlush is one flush of the control plane's configuration over
// 10,000 workers, each with a pending load and a pending liveness record: what the 250 ms flush
// stores at 200,000 reports/s. One op is one flush; the reports between
// flushes are not timed, and their allocations are not counted (B/op and
// allocs/op are the flush's).
func BenchmarkFlush(b *testing.B) {
	const workers = 10000
	reg := registry.New("bench", registry.DefaultHistory)
	ids := make([]string, workers)
	th := judge.Thresholds{WaitingRequests: 1000, TokenUsage: 2}
	if _, err := reg.Update(func(t *registry.Txn) error {
		for i := range ids {
			url := fmt.Sprintf("http://10.%d.%d.%d:8000", i/62500, i/250%250, i%250)
			ids[i] = admin.WorkerID(url)
			t.Insert(&registry.Worker{Registered: registry.Registered{ID: ids[i], Spec: &smgv1.WorkerSpec{Url: url}, Model: "m", Type: "regular", Thresholds: th}, State: registry.State{Health: registry.HealthHealthy}})
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	log := slog.New(slog.DiscardHandler)
	in := evidence.New(reg, evidence.Options{Rules: judge.DefaultLivenessConfig(), Now: func() time.Time { return now }, Coalesce: true},
		log, prometheus.NewRegistry())
	load := &smgv1.EngineLoad{Source: "bench", ReportedAt: timestamppb.New(now), Ranks: []*smgv1.RankLoad{{WaitingRequests: 1, RunningRequests: 8, TokenUsage: 0.3}}}
	report := func() {
		now = now.Add(250 * time.Millisecond)
		for _, id := range ids {
			load.Ranks[0].RunningRequests++
			if err := in.ReportCopy(id, load); err != nil {
				b.Fatal(err)
			}
			in.Record(id, judge.Record{Pushed: true, Waiting: 1}, now)
		}
	}
	for range 3 { // the steady state: fresh loads and records in reserve
		report()
		in.Flush()
	}
	var m0, m1 runtime.MemStats
	var bytes, allocs uint64
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		report()
		runtime.ReadMemStats(&m0)
		b.StartTimer()
		in.Flush()
		b.StopTimer()
		runtime.ReadMemStats(&m1)
		bytes += m1.TotalAlloc - m0.TotalAlloc
		allocs += m1.Mallocs - m0.Mallocs
	}
	b.ReportMetric(float64(bytes)/float64(b.N), "flush-B/op")
	b.ReportMetric(float64(allocs)/float64(b.N), "flush-allocs/op")
}
