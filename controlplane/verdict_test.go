package controlplane_test

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/smg-project/smg/controlplane/evidence"
	"github.com/smg-project/smg/controlplane/health"
	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// TestStoredVerdictIsTheJudgesOfTheStoredEvidence races every writer of
// verdict evidence (every source through the inbox, flushes, sweeps,
// rebuilds, the health checker) on the same workers, round after round, and
// checks after each round, and
// continuously in between, that every stored verdict is what the judge makes
// of the evidence stored with it. The previous design (the tracker deciding
// under its own lock and committing afterwards) ended 1 to 15 of 20,000
// such rounds with the tracker holding a verdict the registry did not.
func TestStoredVerdictIsTheJudgesOfTheStoredEvidence(t *testing.T) {
	const workers, rounds = 2, 3000
	reg := registry.New("e", 0)
	ids := make([]string, workers)
	th := judge.DefaultGatewayThresholds().Resolve(nil)
	if _, err := reg.Update(func(tx *registry.Txn) error {
		for i := range ids {
			ids[i] = fmt.Sprint("w", i)
			tx.Insert(&registry.Worker{Registered: registry.Registered{ID: ids[i], Spec: &smgv1.WorkerSpec{Url: "http://" + ids[i]}, Thresholds: th}, State: registry.State{Health: registry.HealthHealthy}})
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var clock atomic.Int64
	now := func() time.Time { return t0.Add(time.Duration(clock.Add(int64(time.Millisecond)))) }
	log := slog.New(slog.DiscardHandler)
	// It coalesces, as in the control plane: pending loads and records are
	// not stored evidence until a flush or a later transaction stores them.
	in := evidence.New(reg, evidence.Options{Rules: judge.LivenessConfig{StallSecs: 0, WedgeSecs: 1, StaleSecs: 1}, Now: now, Coalesce: true},
		log, prometheus.NewRegistry())
	tr := in
	hc := health.New(reg, health.Options{FailureThreshold: 1, SuccessThreshold: 1, IntervalSecs: 1, TimeoutSecs: 1, Endpoint: "/health", Now: now}, nil, in.Contact, log)

	var violations atomic.Int64
	var firstViolation atomic.Value
	check := func() {
		for _, w := range reg.Snapshot().Workers() {
			if err := judged(w); err != nil {
				violations.Add(1)
				firstViolation.CompareAndSwap(nil, err.Error())
			}
		}
	}
	stop := make(chan struct{})
	checked := make(chan struct{})
	go func() { // checks while the writers race
		defer close(checked)
		for {
			select {
			case <-stop:
				return
			default:
				check()
			}
		}
	}()

	r := rand.New(rand.NewPCG(1, 2))
	for range rounds {
		id := ids[r.IntN(workers)]
		waiting := int32(r.IntN(16)) // over the default 8 about half the time
		probeOK := r.IntN(4) != 0
		silence := time.Duration(r.IntN(3)) * time.Second
		var wg sync.WaitGroup
		for _, op := range []func(){
			func() { tr.Failure(id, judge.ConnectionFailure, now()) },
			func() { tr.Contact(id, now()) },
			func() {
				tr.Record(id, judge.Record{Pushed: true, Waiting: int64(waiting), Silence: silence, StepWire: true}, now())
			},
			func() {
				_ = in.Report(id, &smgv1.EngineLoad{Ranks: []*smgv1.RankLoad{{WaitingRequests: waiting}}})
			},
			func() { _ = in.NoReport(id) },
			func() { in.Flush() },
			func() { in.Rebuild("test", nil) },
			func() { hc.Observe(id, "http://"+id, probeOK, "probe", now()) },
			func() { tr.Sweep(now()) },
		} {
			if r.IntN(3) == 0 {
				continue // a different mix each round
			}
			wg.Add(1)
			go func() { defer wg.Done(); op() }()
		}
		wg.Wait()
		check()
	}
	close(stop)
	<-checked
	in.Flush()
	check()
	if n := violations.Load(); n > 0 {
		t.Fatalf("%d stored verdicts were not the judge's verdict of the stored evidence; first: %s", n, firstViolation.Load())
	}
}

// judged recomputes w's verdicts from its stored evidence with the judge.
func judged(w *registry.Worker) error {
	over := false
	if w.Ready() && !w.Evidence.NoReport && w.Load != nil {
		over, _ = judge.Check(int64(w.Load.GetWaitingRequests()), w.Load.GetTokenUsage(), w.Thresholds)
	}
	if over != w.Overloaded {
		return fmt.Errorf("%s: overloaded %v, the judge says %v of waiting %d (ready %v, no report %v)",
			w.ID, w.Overloaded, over, w.Load.GetWaitingRequests(), w.Ready(), w.Evidence.NoReport)
	}
	veto := smgv1.Veto_VETO_UNSPECIFIED
	if w.Ready() {
		v, _ := w.Evidence.Live.Status()
		veto = registry.VetoOf(v)
	} else if w.Evidence.Live != (judge.Liveness{}) {
		return fmt.Errorf("%s: not Ready yet holds liveness evidence", w.ID)
	}
	if veto != w.Liveness {
		return fmt.Errorf("%s: liveness veto %v, the judge's verdict of the stored evidence is %v", w.ID, w.Liveness, veto)
	}
	return nil
}
