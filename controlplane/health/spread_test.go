package health

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/smg-project/smg/controlplane/registry"
	"github.com/smg-project/smg/controlplane/spread"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/testutil"
)

// fleet is one real HTTP engine on loopback standing in for many workers:
// worker w's URL is <server>/w, so its probe asks <server>/w/health. It logs
// each probe at the fake clock's time.
type fleet struct {
	*httptest.Server
	clk    *clock
	status atomic.Int32
	mu     sync.Mutex
	probes map[string][]probeAt
}

type probeAt struct {
	at time.Time
	ok bool
}

func newFleet(t *testing.T, clk *clock) *fleet {
	f := &fleet{clk: clk, probes: map[string][]probeAt{}}
	f.status.Store(http.StatusOK)
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := strings.CutSuffix(strings.TrimPrefix(r.URL.Path, "/"), "/health")
		if !ok {
			http.NotFound(w, r)
			return
		}
		st := int(f.status.Load())
		f.mu.Lock()
		f.probes[id] = append(f.probes[id], probeAt{at: f.clk.Now(), ok: st == http.StatusOK})
		f.mu.Unlock()
		w.WriteHeader(st)
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *fleet) log(id string) []probeAt {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]probeAt(nil), f.probes[id]...)
}

// healthy answers a probe with 200.
var healthy = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })

func ids(n int, prefix string) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%04d", prefix, i)
	}
	return out
}

// register adds the workers at once, in one transaction (a restart, a
// leader taking over, a bulk registration).
func register(t *testing.T, reg *registry.Registry, base string, h registry.Health, workers []string) {
	t.Helper()
	if _, err := reg.Update(func(tx *registry.Txn) error {
		for _, id := range workers {
			tx.Insert(&registry.Worker{Registered: registry.Registered{ID: id, Spec: &smgv1.WorkerSpec{Url: base + "/" + id}}, State: registry.State{Health: h}})
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func newChecker(reg *registry.Registry, clk *clock, client *http.Client, mod func(*Options)) *Checker {
	opts := DefaultOptions()
	opts.Now = clk.Now
	opts.Seed = "cp-test"
	if mod != nil {
		mod(&opts)
	}
	return New(reg, opts, client, nil, slog.New(slog.DiscardHandler))
}

func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// step moves the clock to the next probe due and runs that round, as Run
// would (without its resolution); it reports false past until.
func step(c *Checker, clk *clock, until time.Time) bool {
	c.mu.Lock()
	at, ok := c.sched.Peek()
	c.mu.Unlock()
	if !ok || at.After(until) {
		return false
	}
	if at.After(clk.Now()) {
		clk.Set(at)
	}
	round(c)
	return true
}

// TestABatchIsProbedOverOneIntervalAndStaysSpread: 1,000 Ready workers
// registered at once are not probed at one instant. The burst budget's 64
// are probed at once; the rest at their phases, spread evenly over the
// first interval (no twentieth of it holds much more than a twentieth of
// them), every one within it; and each worker is probed again exactly one
// interval later, twice.
func TestABatchIsProbedOverOneIntervalAndStaysSpread(t *testing.T) {
	const n, k = 1000, 20
	clk := &clock{now: t0}
	f := newFleet(t, clk)
	reg := registry.New("e", 0)
	workers := ids(n, "w")
	register(t, reg, f.URL, registry.HealthHealthy, workers)
	c := newChecker(reg, clk, f.Client(), nil)
	iv := time.Minute

	round(c)
	for step(c, clk, t0.Add(3*iv-time.Nanosecond)) {
	}
	contacts := map[string][]time.Time{}
	for _, id := range workers {
		log := f.log(id)
		if len(log) != 3 {
			t.Fatalf("%s probed %d times in three intervals, want 3", id, len(log))
		}
		for _, p := range log {
			contacts[id] = append(contacts[id], p.at)
		}
	}
	testutil.CheckSpread(t, contacts, t0, iv, spread.DefaultBurstSize, k)
}

// TestALoneWorkerIsProbedAtOnce: a worker registered on its own is probed
// the instant it is seen, even just after a batch, once a second has
// refilled the burst budget; one registered while the budget is spent
// waits at most its cadence (a pending worker: the startup interval).
func TestALoneWorkerIsProbedAtOnce(t *testing.T) {
	clk := &clock{now: t0}
	f := newFleet(t, clk)
	reg := registry.New("e", 0)
	register(t, reg, f.URL, registry.HealthHealthy, ids(200, "w"))
	c := newChecker(reg, clk, f.Client(), nil)
	round(c)

	register(t, reg, f.URL, registry.HealthPending, []string{"spent"})
	round(c)
	if log := f.log("spent"); len(log) != 0 {
		t.Fatal("a worker registered while the budget was spent was probed at once")
	}
	for step(c, clk, t0.Add(time.Second)) {
		if len(f.log("spent")) > 0 {
			break
		}
	}
	if log := f.log("spent"); len(log) != 1 || log[0].at.Sub(t0) > time.Second {
		t.Fatalf("the pending worker registered while the budget was spent: probes %v, want one within the startup interval (1s)", log)
	}

	clk.Set(t0.Add(2 * time.Second))
	register(t, reg, f.URL, registry.HealthPending, []string{"lone"})
	round(c)
	if log := f.log("lone"); len(log) != 1 || !log[0].at.Equal(t0.Add(2*time.Second)) {
		t.Fatalf("a lone worker's probes %v, want one at the instant it was registered", log)
	}
}

// TestPhasedWorkersAreJudgedAtTheSpecTimes: workers of a batch, all at their
// phase (no burst budget), are judged exactly as the spec's timings say.
// Pending: Ready at the second consecutive pass, one startup interval after
// the first, which came within one startup interval. Ready and failing:
// still Ready after two failed probes, unhealthy at the third, probed one
// interval apart (the first failure within one interval of the engine's
// fault). Unhealthy and passing again: Ready one startup interval after the
// first pass.
func TestPhasedWorkersAreJudgedAtTheSpecTimes(t *testing.T) {
	const n = 40
	clk := &clock{now: t0}
	f := newFleet(t, clk)
	reg := registry.New("e", 0)
	workers := ids(n, "w")
	register(t, reg, f.URL, registry.HealthPending, workers)
	c := newChecker(reg, clk, f.Client(), func(o *Options) { o.Burst = spread.NewBurst(0, time.Second) })
	iv, startup := time.Minute, time.Second

	// transitions logs each worker's health changes at the clock's time.
	type change struct {
		at time.Time
		to registry.Health
	}
	transitions := map[string][]change{}
	last := map[string]registry.Health{}
	run := func(until time.Time) {
		round(c)
		for {
			for _, id := range workers {
				if h := reg.Get(id).Health; h != last[id] {
					transitions[id] = append(transitions[id], change{clk.Now(), h})
					last[id] = h
				}
			}
			if !step(c, clk, until) {
				return
			}
		}
	}
	for _, id := range workers {
		last[id] = registry.HealthPending
	}

	run(t0.Add(iv / 2))
	for _, id := range workers {
		log, tr := f.log(id), transitions[id]
		if len(tr) != 1 || tr[0].to != registry.HealthHealthy {
			t.Fatalf("%s: transitions %v, want Ready", id, tr)
		}
		if log[0].at.Sub(t0) > startup || log[0].at.Equal(t0) {
			t.Fatalf("%s: first probe %s after registration, want at its phase within the startup interval", id, log[0].at.Sub(t0))
		}
		if got := tr[0].at.Sub(log[0].at); got != startup {
			t.Fatalf("%s: Ready %s after its first pass, want exactly the startup interval (%s)", id, got, startup)
		}
	}

	fault := clk.Now()
	f.status.Store(http.StatusServiceUnavailable)
	run(fault.Add(3*iv + 2*startup))
	for _, id := range workers {
		var failed []time.Time
		for _, p := range f.log(id) {
			if !p.ok {
				failed = append(failed, p.at)
			}
		}
		tr := transitions[id]
		if len(tr) != 2 || tr[1].to != registry.HealthUnhealthy {
			t.Fatalf("%s: transitions %v, want Ready then unhealthy", id, tr)
		}
		if failed[0].Sub(fault) > iv {
			t.Fatalf("%s: first failed probe %s after the fault, want within one interval", id, failed[0].Sub(fault))
		}
		if failed[1].Sub(failed[0]) != iv || failed[2].Sub(failed[1]) != iv {
			t.Fatalf("%s: failed probes at %v, want one interval apart", id, failed[:3])
		}
		if !tr[1].at.Equal(failed[2]) {
			t.Fatalf("%s: unhealthy at %s, want at its third failed probe (%s), not before or after", id, tr[1].at, failed[2])
		}
		if got := failed[3].Sub(failed[2]); got > startup {
			t.Fatalf("%s: probed %s after leaving Ready, want within the startup interval", id, got)
		}
	}

	healed := clk.Now()
	f.status.Store(http.StatusOK)
	run(healed.Add(iv / 2))
	for _, id := range workers {
		log, tr := f.log(id), transitions[id]
		var firstPass time.Time
		for _, p := range log {
			if p.ok && p.at.After(healed) {
				firstPass = p.at
				break
			}
		}
		if len(tr) != 3 || tr[2].to != registry.HealthHealthy {
			t.Fatalf("%s: transitions %v, want Ready again", id, tr)
		}
		if firstPass.Sub(healed) > startup || tr[2].at.Sub(firstPass) != startup {
			t.Fatalf("%s: first pass %s after healing, Ready %s after it; want within and exactly the startup interval",
				id, firstPass.Sub(healed), tr[2].at.Sub(firstPass))
		}
	}
}

// TestABatchHoldsFewProbeConnectionsAtOnce: 300 workers on a real loopback
// engine that answers each probe only at the end of its tenth of the
// interval (a slow engine: every probe started in that tenth is open at
// once), over the first interval and its end. Spread, the connections open
// at once stay near the burst budget and a tenth of the batch; probed all at
// once, as before, all 300 are.
func TestABatchHoldsFewProbeConnectionsAtOnce(t *testing.T) {
	const n, k = 300, 10
	for _, tc := range []struct {
		name  string
		burst int
		limit int
	}{
		{"spread", spread.DefaultBurstSize, spread.DefaultBurstSize + n/k*15/10},
		{"all at once (before)", n, n},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := &clock{now: t0}
			e := testutil.NewHeldEngine(t, nil)
			reg := registry.New("e", 0)
			register(t, reg, e.URL, registry.HealthHealthy, ids(n, "w"))
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
			defer client.CloseIdleConnections()
			c := newChecker(reg, clk, client, func(o *Options) { o.Burst = spread.NewBurst(tc.burst, time.Second) })
			iv := time.Minute
			peak := e.PeakOpen(k+1, func(s int) (int, func()) {
				clk.Set(t0.Add(iv * time.Duration(s) / k))
				var wg sync.WaitGroup
				c.probeDue(context.Background(), &wg, s == 0)
				c.mu.Lock()
				defer c.mu.Unlock()
				started := 0
				for _, id := range ids(n, "w") {
					if c.sched.Get(id).Next().IsZero() { // popped: in flight
						started++
					}
				}
				return started, wg.Wait
			})
			e.CheckPeak(t, n, peak, tc.limit, tc.burst == n)
		})
	}
}

// TestRunProbesEachWorkerAtItsPhase: the real loop, on synctest's clock,
// probes a batch of 500 pending workers at their phases in the startup
// interval, makes each Ready one startup interval after its first pass, and
// probes it from then on at its phase in the health interval, every
// interval, late by no more than the schedule's resolution; a worker
// registered alone later is probed at once.
func TestRunProbesEachWorkerAtItsPhase(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 500
		iv, startup := time.Minute, time.Second
		reg := registry.New("e", 0)
		workers := ids(n, "w")
		register(t, reg, "http://fleet", registry.HealthPending, workers)
		rec := &testutil.Recorder{Suffix: "/health", Answer: healthy}
		opts := DefaultOptions()
		opts.Seed = "cp-test"
		c := New(reg, opts, &http.Client{Transport: rec}, nil, slog.New(slog.DiscardHandler))
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		start := time.Now()
		go func() { c.Run(ctx); close(done) }()
		time.Sleep(150 * time.Second)
		alone := time.Now()
		register(t, reg, "http://fleet", registry.HealthPending, []string{"lone"})
		time.Sleep(time.Second)
		cancel()
		<-done

		atOnce := 0
		late := func(got, due time.Time) bool { return got.Before(due) || got.Sub(due) > spread.Resolution }
		for _, id := range workers {
			probes := rec.Contacts(id)
			if len(probes) < 4 {
				t.Fatalf("%s probed %d times in 150 s, want two passes and two or three probes once Ready", id, len(probes))
			}
			if probes[0].Equal(start) {
				atOnce++
			} else if due := spread.PhaseOf(c.seed, id, startup).Next(start); late(probes[0], due) {
				t.Fatalf("%s first probed %s after start, want at its phase (%s)", id, probes[0].Sub(start), due.Sub(start))
			}
			if d := probes[1].Sub(probes[0]); d < startup-spread.Resolution || d > startup+spread.Resolution {
				t.Fatalf("%s: second pass %s after the first, want the startup interval", id, d)
			}
			if reg.Get(id).Health != registry.HealthHealthy {
				t.Fatalf("%s not Ready after two passes", id)
			}
			if !probes[0].Equal(start) {
				if due := spread.PhaseOf(c.seed, id, iv).Next(probes[1]); late(probes[2], due) {
					t.Fatalf("%s: first probe once Ready %s after it, want at its phase (%s)", id, probes[2].Sub(probes[1]), due.Sub(probes[1]))
				}
			}
			for i := 3; i < len(probes); i++ {
				if d := probes[i].Sub(probes[i-1]); d < iv-spread.Resolution || d > iv+spread.Resolution {
					t.Fatalf("%s: Ready, probed %s after its previous probe, want the interval %s", id, d, iv)
				}
			}
		}
		if atOnce != spread.DefaultBurstSize {
			t.Fatalf("%d probed at once, want the burst budget %d", atOnce, spread.DefaultBurstSize)
		}
		if lone := rec.Contacts("lone"); len(lone) == 0 || lone[0].Sub(alone) > spread.Resolution {
			t.Fatalf("the worker registered alone was probed at %v, want at once (%s)", lone, alone)
		}
	})
}
