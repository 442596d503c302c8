package evidence_test

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/smg-project/smg/controlplane/evidence"
	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/loadpb"
)

// workers is a registry of Ready workers with the default thresholds.
func workers(t *testing.T, ids ...string) *registry.Registry {
	t.Helper()
	reg := registry.New("e", 0)
	if _, err := reg.Update(func(tx *registry.Txn) error {
		for _, id := range ids {
			tx.Insert(&registry.Worker{Registered: registry.Registered{ID: id, Spec: &smgv1.WorkerSpec{Url: "http://" + id}, Model: "m", Thresholds: judge.DefaultGatewayThresholds().Resolve(nil)}, State: registry.State{Health: registry.HealthHealthy}})
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return reg
}

// A report that flips a verdict waits for the registry's lock holding its
// own worker's state only: while it waits behind a flush transaction, the
// other workers' reports, refreshes and batches go on (with one lock for
// every worker, as before, they stopped behind the flip and this test
// hangs), and the flip then commits over the older load the flush held.
func TestAFlipWaitingForTheRegistryStopsNoOtherWorker(t *testing.T) {
	reg := workers(t, "w1", "w2", "w3")
	inTxn, release := make(chan struct{}), make(chan struct{})
	first := true
	in := evidence.New(reg, evidence.Options{Coalesce: true}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	evidence.InFlush(in, func() {
		if first { // the first flush transaction holds the registry until released
			first = false
			inTxn <- struct{}{}
			<-release
		}
	})
	for _, id := range []string{"w1", "w2"} {
		if err := in.Report(id, load(1)); err != nil {
			t.Fatal(err)
		}
	}
	flushed := make(chan struct{})
	go func() { in.Flush(); close(flushed) }()
	<-inTxn

	flipped := make(chan error, 1)
	go func() { flipped <- in.Report("w1", load(20)) }()
	for evidence.PendingLoad(in, "w1").GetWaitingRequests() != 20 { // the flip goes on to wait for the registry
		runtime.Gosched()
	}
	for id, l := range map[string]*smgv1.EngineLoad{"w2": load(2), "w3": load(3)} {
		if err := in.ReportCopy(id, l); err != nil {
			t.Error(err)
		}
	}
	if err := in.Refresh("w2"); err != nil {
		t.Fatal(err)
	}
	if err := in.Report("w3", load(4)); err != nil {
		t.Fatal(err)
	}
	if w := reg.Get("w1"); w.Overloaded || w.Load != nil {
		t.Fatal("the flip committed while the flush transaction held the registry")
	}

	close(release)
	<-flushed
	if err := <-flipped; err != nil {
		t.Fatal(err)
	}
	if w := reg.Get("w1"); !w.Overloaded || w.Load.GetWaitingRequests() != 20 {
		t.Fatalf("w1: overloaded %v waiting %d, want the flip's 20 over the flush's older 1", w.Overloaded, w.Load.GetWaitingRequests())
	}
	if got := reg.Get("w2").Load.GetWaitingRequests(); got != 1 {
		t.Fatalf("w2: stored waiting %d, want the flushed 1 (2 pends for the next flush)", got)
	}
	in.Flush()
	for id, want := range map[string]int32{"w1": 20, "w2": 2, "w3": 4} {
		if got := reg.Get(id).Load.GetWaitingRequests(); got != want {
			t.Errorf("%s: stored waiting %d after the next flush, want %d", id, got, want)
		}
	}
}

// Only a registered worker gets pending state, and a flush drops that of a
// worker the registry no longer has: hostile agents' made-up ids and a
// fleet's churn leave nothing behind.
func TestPendingStateOnlyForRegisteredWorkers(t *testing.T) {
	reg := workers(t, "w1", "w2")
	in := evidence.New(reg, evidence.Options{Coalesce: true}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	for i := range 100 {
		id := fmt.Sprint("made-up-", i)
		for _, err := range []error{in.Report(id, load(1)), in.ReportCopy(id, load(20)), in.NoReport(id), in.Refresh(id)} {
			if !errors.Is(err, evidence.ErrUnknownWorker) {
				t.Fatalf("%s: err = %v, want ErrUnknownWorker", id, err)
			}
		}
	}
	if n := evidence.Cells(in); n != 0 {
		t.Fatalf("%d workers with pending state after reports about unknown ones, want 0", n)
	}
	for _, id := range []string{"w1", "w2"} {
		if err := in.Report(id, load(1)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := reg.Update(func(tx *registry.Txn) error { tx.Delete("w2"); return nil }); err != nil {
		t.Fatal(err)
	}
	in.Flush() // w2's load finds no record
	in.Flush()
	if n := evidence.Cells(in); n != 1 {
		t.Fatalf("%d workers with pending state after w2 left, want 1", n)
	}
	if err := in.Report("w2", load(1)); !errors.Is(err, evidence.ErrUnknownWorker) {
		t.Fatalf("a report about the removed w2: err = %v, want ErrUnknownWorker", err)
	}
	if got := reg.Get("w1").Load.GetWaitingRequests(); got != 1 {
		t.Fatalf("w1: stored waiting %d, want 1", got)
	}
}

// Reporters, no-reports, refreshes, flushes and rebuilds run at once on the
// same and on different workers (run it with -race). A worker with one
// reporter never has an older load of it stored after a newer one (a
// watcher reads the registry all along). Each reporter ends with a last
// load report for every worker it touches; then each worker stores its last
// report: its reporter's for a worker with one reporter, one of the
// reporters' last for a worker several share (their order is the race's).
func TestConcurrentReportsEndWithTheLastReport(t *testing.T) {
	const reporters, owned, shared = 4, 12, 8
	var ids []string
	for i := range owned + shared {
		ids = append(ids, fmt.Sprintf("w%02d", i))
	}
	reg := workers(t, ids...)
	in := evidence.New(reg, evidence.Options{Coalesce: true}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())

	mine := func(g int) []string { // the workers reporter g reports
		var ws []string
		for i := g; i < owned; i += reporters {
			ws = append(ws, ids[i])
		}
		return append(ws, ids[owned:]...)
	}
	last := make([]map[string]*smgv1.EngineLoad, reporters) // each reporter's last report per worker
	// The flusher flushes until stop, and rebuilds too until noRebuild
	// (acknowledged on quiet): a rebuild clears every veto, and must not
	// come after the last reports.
	stop, noRebuild, quiet := make(chan struct{}), make(chan struct{}), make(chan struct{})
	flusher := make(chan struct{})
	go func() {
		defer close(flusher)
		rebuilds := true
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			case <-noRebuild:
				if rebuilds {
					rebuilds = false
					close(quiet)
				}
			default:
			}
			in.Flush()
			if rebuilds && n%25 == 24 {
				in.Rebuild("test", nil)
			}
		}
	}()
	watcher := make(chan struct{})
	go func() {
		defer close(watcher)
		seen := map[string]string{} // the newest Source stored, by owned worker
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, id := range ids[:owned] {
				src := reg.Get(id).Load.GetSource() // "reporter-step", the step zero-padded
				if src < seen[id] {
					t.Errorf("%s stores the report %q after the newer %q", id, src, seen[id])
					return
				}
				seen[id] = src
			}
			runtime.Gosched()
		}
	}()
	steps, final := sync.WaitGroup{}, make(chan struct{})
	steps.Add(reporters)
	var wg sync.WaitGroup
	for g := range reporters {
		last[g] = map[string]*smgv1.EngineLoad{}
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			ws := mine(g)
			buf := &smgv1.EngineLoad{} // the caller's, rewritten for each report
			report := func(id string, step int) {
				buf.Reset()
				buf.Source = fmt.Sprintf("%d-%06d", g, step)
				for r := range 1 + rng.IntN(2) {
					buf.Ranks = append(buf.Ranks, &smgv1.RankLoad{DpRank: int32(r), WaitingRequests: int32(rng.IntN(12)), TokenUsage: rng.Float64()})
				}
				if err := in.ReportCopy(id, buf); err != nil {
					t.Error(err)
				}
				last[g][id] = proto.CloneOf(buf)
			}
			for step := range 3000 {
				id := ws[rng.IntN(len(ws))]
				var err error
				switch k := rng.IntN(10); k {
				case 0:
					err = in.NoReport(id)
				case 1:
					err = in.Refresh(id)
				default:
					report(id, step)
				}
				if err != nil {
					t.Error(err)
				}
			}
			steps.Done()
			<-final
			for _, i := range rng.Perm(len(ws)) {
				report(ws[i], 3000+i)
			}
		})
	}
	steps.Wait()
	close(noRebuild)
	<-quiet
	close(final)
	wg.Wait()
	close(stop)
	<-flusher
	<-watcher
	in.Flush()

	for i, id := range ids {
		var candidates []*smgv1.EngineLoad
		for g := range reporters {
			if l, ok := last[g][id]; ok && (i >= owned || i%reporters == g) {
				candidates = append(candidates, l)
			}
		}
		w := reg.Get(id)
		matched := false
		for _, c := range candidates {
			want := proto.CloneOf(c)
			waiting, usage := loadpb.Signals(want.Ranks)
			want.WaitingRequests, want.TokenUsage = int32(min(waiting, math.MaxInt32)), usage
			matched = matched || proto.Equal(w.Load, want)
		}
		if !matched || len(candidates) == 0 {
			t.Errorf("%s stores load %v (from %q), want one of its reporters' last reports", id, w.Load, w.Load.GetSource())
			continue
		}
		over, _ := judge.Check(int64(w.Load.GetWaitingRequests()), w.Load.GetTokenUsage(), w.Thresholds)
		if w.Evidence.NoReport || w.Overloaded != over {
			t.Errorf("%s: no report %v, overloaded %v, want false and %v (its stored load's verdict)", id, w.Evidence.NoReport, w.Overloaded, over)
		}
	}
	if n := evidence.Cells(in); n != len(ids) {
		t.Errorf("%d workers with pending state, want %d", n, len(ids))
	}
}
