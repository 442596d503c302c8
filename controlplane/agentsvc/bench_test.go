package agentsvc

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/smg-project/smg/controlplane/evidence"
	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// BenchmarkIngestRecords is the control plane's ingestion path without
// gRPC's transport: a wire-encoded agent record decoded and applied
// (ingest and liveness, coalescing as the control plane runs them) for
// 5,000 and 10,000 workers reporting 20 times a second, with the 50 ms
// flushes and the 250 ms sweep on the simulated clock (tick: as the control
// plane runs them). Worker ids are shaped like the admin API's (a hash of
// the URL). ns/op and allocs/op are per report, flushes and sweeps included.
func BenchmarkIngestRecords(b *testing.B) {
	for _, workers := range []int{5000, 10000} {
		b.Run(fmt.Sprint("workers=", workers), func(b *testing.B) { benchIngestRecords(b, workers) })
	}
}

// benchFleet registers workers Ready workers (never overloaded) on node n1
// and returns their URLs.
func benchFleet(reg *registry.Registry, workers int) []string {
	urls := make([]string, workers)
	reg.Update(func(t *registry.Txn) error {
		for i := range urls {
			urls[i] = fmt.Sprintf("http://10.%d.%d.%d:8000", i/62500, i/250%250, i%250)
			sum := sha256.Sum256([]byte(urls[i]))
			w := worker("w-"+hex.EncodeToString(sum[:6]), urls[i], "n1")
			w.Thresholds = judge.Thresholds{WaitingRequests: 1000, TokenUsage: 2}
			t.Insert(w)
		}
		return nil
	})
	return urls
}

// benchStream is an agent stream of node n1, as Report opens it.
func benchStream(tr *evidence.Inbox) *agentStream {
	return &agentStream{node: "n1", refused: map[string]bool{}, covered: map[string]bool{},
		engines: map[string]*engineState{}, known: map[string]knownWorker{}, pending: map[string]*smgv1.LoadRecord{},
		read: tr.OpenStream()}
}

// benchRecord is a load record of url as the harness's agents send it.
func benchRecord(url string, rng *rand.Rand, now time.Time) *smgv1.LoadRecord {
	return &smgv1.LoadRecord{WorkerUrl: url, StepWire: true,
		EngineSilence: durationpb.New(0), ObservedAt: timestamppb.New(now),
		Load: &smgv1.EngineLoad{Source: "bench", Ranks: []*smgv1.RankLoad{{
			WaitingRequests: rng.Int32N(4), RunningRequests: 8 + rng.Int32N(8), TokenUsage: 0.1 + 0.4*rng.Float64()}}}}
}

func benchIngestRecords(b *testing.B, workers int) {
	perFlush := workers // every worker reports once per 50 ms tick
	reg := registry.New("e", 0)
	now := time.Unix(1_700_000_000, 0)
	clk := func() time.Time { return now }
	tr := pipeline(reg, clk)
	s := New(reg, tr, nil, Options{Now: clk}, discard())
	urls := benchFleet(reg, workers)
	st := benchStream(tr)
	rng := rand.New(rand.NewPCG(1, 2))
	wires := make([][]byte, 4*workers)
	for i := range wires {
		rec := benchRecord(urls[i%workers], rng, now)
		wires[i], _ = proto.Marshal(&smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Record{Record: rec}})
	}
	i, ticks := 0, 0
	step := func() {
		if err := s.handle(st, wires[i%len(wires)], now); err != nil {
			b.Fatal(err)
		}
		i++
		if i%perFlush == 0 {
			now = now.Add(50 * time.Millisecond)
			ticks++
			tick(tr, now, ticks)
		}
	}
	// The steady state: a stream's first record of a worker stores its
	// agent node and moves its liveness at once, one transaction each.
	for range 5 * perFlush {
		step()
	}
	b.ReportAllocs()
	cpu0 := cpuTime()
	for b.Loop() {
		step()
	}
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
}

// BenchmarkIngestStreams is BenchmarkIngestRecords as the scale harness's
// ingest-N10000 row feeds it: 10,000 workers reporting 20 times a second
// over 100 agent streams, each its own goroutine, each message a batch of
// 10 records (an agent's 5 ms round), the flushes and sweeps running
// concurrently with the streams on the simulated clock. Where the focused
// benchmark shows a record's own work, this one shows what the streams
// contend for. ns/op and cpu-ns/op are per report, as are the bytes and
// allocations (the garbage collector's pace: GCs per million reports).
func BenchmarkIngestStreams(b *testing.B) {
	const workers, streams, batch = 10000, 100, 10
	reg := registry.New("e", 0)
	var clock atomic.Int64
	clock.Store(time.Unix(1_700_000_000, 0).UnixNano())
	clk := func() time.Time { return time.Unix(0, clock.Load()) }
	tr := pipeline(reg, clk)
	s := New(reg, tr, nil, Options{Now: clk}, discard())
	urls := benchFleet(reg, workers)
	per := workers / streams
	type feed struct {
		st    *agentStream
		wires [][]byte // 4 rounds of its workers' records, batch a message
		next  int
	}
	feeds := make([]*feed, streams)
	for k := range feeds {
		f := &feed{st: benchStream(tr)}
		rng := rand.New(rand.NewPCG(uint64(k), 2))
		for range 4 {
			for i := 0; i < per; i += batch {
				msg := &smgv1.LoadRecords{}
				for j := i; j < i+batch; j++ {
					msg.Records = append(msg.Records, benchRecord(urls[k*per+j], rng, clk()))
				}
				w, _ := proto.Marshal(&smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Records{Records: msg}})
				f.wires = append(f.wires, w)
			}
		}
		feeds[k] = f
	}
	// A round is 50 ms: every worker reports once, every stream sends its
	// per/batch messages; the 250 ms sweep (flush first) runs alongside
	// the next round, as the control plane's loops do.
	round := func() {
		now := clk()
		var wg sync.WaitGroup
		for _, f := range feeds {
			wg.Go(func() {
				for range per / batch {
					if err := s.handle(f.st, f.wires[f.next%len(f.wires)], now); err != nil {
						b.Error(err)
					}
					f.next++
				}
			})
		}
		wg.Wait()
	}
	sweeps := 0
	var sweep sync.WaitGroup
	tickRound := func() {
		round()
		sweep.Wait()
		now := time.Unix(0, clock.Add(int64(50*time.Millisecond)))
		if sweeps++; sweeps%5 == 0 {
			sweep.Go(func() { tr.Sweep(now) })
		}
	}
	for range 5 { // the steady state (agent nodes stored, first records)
		tickRound()
	}
	sweep.Wait()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	rev0 := reg.Revision()
	cpu0 := cpuTime()
	b.ResetTimer()
	reports := 0
	for reports < b.N {
		tickRound()
		reports += workers
	}
	sweep.Wait()
	b.StopTimer()
	runtime.ReadMemStats(&m1)
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(reports), "cpu-ns/report")
	b.ReportMetric(float64(m1.Mallocs-m0.Mallocs)/float64(reports), "allocs/report")
	b.ReportMetric(float64(m1.TotalAlloc-m0.TotalAlloc)/float64(reports), "B/report")
	b.ReportMetric(float64(m1.NumGC-m0.NumGC)*1e6/float64(reports), "GCs/1M-reports")
	b.ReportMetric(float64(reg.Revision()-rev0)*float64(workers)/float64(reports), "commits/round")
}

// cpuTime is the process's user and system CPU time (the garbage
// collector's included): the figure other jobs on the machine cannot
// inflate.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// pipeline is the control plane's wiring: one inbox, flushed before every
// sweep.
func pipeline(reg *registry.Registry, now func() time.Time) *evidence.Inbox {
	return evidence.New(reg, evidence.Options{Rules: judge.DefaultLivenessConfig(), Now: now, Coalesce: true}, discard(), prometheus.NewRegistry())
}

func tick(tr *evidence.Inbox, now time.Time, n int) {
	if n%5 == 0 {
		tr.Sweep(now)
	}
}
