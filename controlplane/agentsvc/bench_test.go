package agentsvc

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/smg-project/smg/controlplane/ingest"
	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/liveness"
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

func benchIngestRecords(b *testing.B, workers int) {
	perFlush := workers // every worker reports once per 50 ms tick
	reg := registry.New("e", 0)
	now := time.Unix(1_700_000_000, 0)
	clk := func() time.Time { return now }
	in, tr := pipeline(reg, clk)
	s := New(reg, in, tr, nil, Options{Now: clk}, discard())
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
	st := &agentStream{node: "n1", refused: map[string]bool{}, covered: map[string]bool{},
		engines: map[string]*engineState{}, known: map[string]knownWorker{}, pending: map[string]*smgv1.LoadRecord{},
		read: tr.OpenStream()}
	rng := rand.New(rand.NewPCG(1, 2))
	wires := make([][]byte, 4*workers)
	for i := range wires {
		rec := &smgv1.LoadRecord{WorkerUrl: urls[i%workers], StepWire: true,
			EngineSilence: durationpb.New(0), ObservedAt: timestamppb.New(now),
			Load: &smgv1.EngineLoad{Source: "bench", Ranks: []*smgv1.RankLoad{{
				WaitingRequests: rng.Int32N(4), RunningRequests: 8 + rng.Int32N(8), TokenUsage: 0.1 + 0.4*rng.Float64()}}}}
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
			tick(in, tr, now, ticks)
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

// cpuTime is the process's user and system CPU time (the garbage
// collector's included): the figure other jobs on the machine cannot
// inflate.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// pipeline is the control plane's wiring: one flush, before every sweep,
// stores loads and liveness records.
func pipeline(reg *registry.Registry, now func() time.Time) (*ingest.Ingester, *liveness.Tracker) {
	var in *ingest.Ingester
	tr := liveness.New(reg, liveness.Options{Rules: judge.DefaultLivenessConfig(), Now: now, Coalesce: true,
		Flush: func() { in.Flush() }}, discard(), prometheus.NewRegistry())
	in = ingest.New(reg, ingest.Options{Coalesce: true, Rider: tr}, discard())
	return in, tr
}

// tick is 50 ms of the control plane's loops: every fifth, the sweep
// (which flushes first).
func tick(_ *ingest.Ingester, tr *liveness.Tracker, now time.Time, n int) {
	if n%5 == 0 {
		tr.Sweep(now)
	}
}
