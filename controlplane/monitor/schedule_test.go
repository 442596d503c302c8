package monitor

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/smg-project/smg/controlplane/evidence"
	"github.com/smg-project/smg/controlplane/registry"
	"github.com/smg-project/smg/controlplane/spread"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/testutil"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// fleet is one real HTTP engine on loopback standing in for many workers:
// worker w's URL is <server>/w, so its poll asks <server>/w/metrics (a vLLM
// answer). It logs each poll at the fake clock's time.
type fleet struct {
	*httptest.Server
	clk   *clock
	mu    sync.Mutex
	polls map[string][]time.Time
}

func newFleet(t *testing.T, clk *clock) *fleet {
	f := &fleet{clk: clk, polls: map[string][]time.Time{}}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := strings.CutSuffix(strings.TrimPrefix(r.URL.Path, "/"), "/metrics")
		if !ok {
			http.NotFound(w, r)
			return
		}
		f.mu.Lock()
		f.polls[id] = append(f.polls[id], f.clk.Now())
		f.mu.Unlock()
		vllm.ServeHTTP(w, r)
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *fleet) log(id string) []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Time(nil), f.polls[id]...)
}

func ids(n int, prefix string) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%04d", prefix, i)
	}
	return out
}

// vllm answers a poll as vLLM does.
var vllm = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
	_, _ = w.Write([]byte("# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 1\n"))
})

func register(t *testing.T, reg *registry.Registry, base string, h registry.Health, workers []string) {
	t.Helper()
	if _, err := reg.Update(func(tx *registry.Txn) error {
		for _, id := range workers {
			tx.Insert(&registry.Worker{Registered: registry.Registered{ID: id, Model: "m", Type: "regular", Spec: &smgv1.WorkerSpec{Url: base + "/" + id}}, State: registry.State{Health: h}})
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func setHealth(t *testing.T, reg *registry.Registry, id string, h registry.Health) {
	t.Helper()
	if _, err := reg.Update(func(tx *registry.Txn) error {
		w := tx.Get(id).Clone()
		w.Health = h
		tx.Insert(w)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// pushes is a RecentlyPushed: a worker's agent pushed at the times set.
type pushes struct {
	mu   sync.Mutex
	last map[string]time.Time
}

func (p *pushes) RecentlyPushed(id string, within time.Duration, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	at, ok := p.last[id]
	return ok && now.Sub(at) < within
}

// sched drives the monitor's schedule on the fake clock, as Run does on the
// real one (without its resolution).
type sched struct {
	m   *Monitor
	s   schedule
	clk *clock
	reg *registry.Registry
}

func newSched(t *testing.T, reg *registry.Registry, clk *clock, client *http.Client, burst *spread.Burst, skip func(string, time.Duration, time.Time) bool) *sched {
	log := slog.New(slog.DiscardHandler)
	m := New(reg, evidence.New(reg, evidence.Options{}, log, prometheus.NewRegistry()), client,
		Options{Interval: 10 * time.Second, Now: clk.Now, Seed: "cp-test", Burst: burst, RecentlyPushed: skip}, log)
	return &sched{m: m, clk: clk, reg: reg}
}

// kick is a membership change reaching the schedule.
func (s *sched) kick() {
	s.m.pollDue(context.Background(), &s.s, true)
	s.m.polls.Wait()
}

// step moves the clock to the next poll due and runs it; false past until.
func (s *sched) step(until time.Time) bool {
	at, ok := s.s.Peek()
	if !ok || at.After(until) {
		return false
	}
	if at.After(s.clk.Now()) {
		s.clk.Set(at)
	}
	s.m.pollDue(context.Background(), &s.s, false)
	s.m.polls.Wait()
	return true
}

// TestABatchIsPolledOverOneIntervalAndStaysSpread: 1,000 workers Ready at
// once (a restart, a leader taking over) are not polled at one instant: the
// burst budget's 64 at once, the rest at their phases, spread evenly over
// the first interval and all within it, each polled again exactly every
// interval.
func TestABatchIsPolledOverOneIntervalAndStaysSpread(t *testing.T) {
	const n, k = 1000, 20
	clk := &clock{now: t0}
	f := newFleet(t, clk)
	reg := registry.New("e", 0)
	workers := ids(n, "w")
	register(t, reg, f.URL, registry.HealthHealthy, workers)
	s := newSched(t, reg, clk, f.Client(), nil, nil)
	iv := 10 * time.Second

	s.kick()
	for s.step(t0.Add(3*iv - time.Nanosecond)) {
	}
	contacts := map[string][]time.Time{}
	for _, id := range workers {
		if contacts[id] = f.log(id); len(contacts[id]) != 3 {
			t.Fatalf("%s polled %d times in three intervals, want 3", id, len(contacts[id]))
		}
	}
	testutil.CheckSpread(t, contacts, t0, iv, spread.DefaultBurstSize, k)
}

// TestAWorkerNewlyReadyIsPolledAtOnce: a worker that becomes Ready on its
// own is polled at that instant (and then every interval from it), even
// just after a batch once the budget has refilled; one that leaves Ready is
// not polled, and is polled at once when it comes back.
func TestAWorkerNewlyReadyIsPolledAtOnce(t *testing.T) {
	clk := &clock{now: t0}
	f := newFleet(t, clk)
	reg := registry.New("e", 0)
	register(t, reg, f.URL, registry.HealthHealthy, ids(100, "w"))
	register(t, reg, f.URL, registry.HealthPending, []string{"lone"})
	s := newSched(t, reg, clk, f.Client(), nil, nil)
	s.kick()

	ready := t0.Add(2 * time.Second)
	clk.Set(ready)
	setHealth(t, reg, "lone", registry.HealthHealthy)
	s.kick()
	for s.step(ready.Add(25 * time.Second)) {
	}
	want := []time.Time{ready, ready.Add(10 * time.Second), ready.Add(20 * time.Second)}
	if got := f.log("lone"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("the worker made Ready alone was polled at %v, want %v", got, want)
	}

	left := clk.Now()
	setHealth(t, reg, "lone", registry.HealthUnhealthy)
	s.kick()
	for s.step(left.Add(30 * time.Second)) {
	}
	if got := f.log("lone"); len(got) != 3 {
		t.Fatalf("a worker out of Ready was polled: %v", got[3:])
	}
	back := clk.Now()
	setHealth(t, reg, "lone", registry.HealthHealthy)
	s.kick()
	if got := f.log("lone"); len(got) != 4 || !got[3].Equal(back) {
		t.Fatalf("back in Ready: polls %v, want one at once (%s)", got, back)
	}
}

// TestAPushingWorkerIsPolledWhenItsRecordsStop: a worker whose agent pushed
// within the interval is skipped at its phase; once the records stop, the
// poll takes over at its first phase a full interval after the last record
// (within two intervals of it, as with one tick for the whole group).
func TestAPushingWorkerIsPolledWhenItsRecordsStop(t *testing.T) {
	clk := &clock{now: t0}
	f := newFleet(t, clk)
	reg := registry.New("e", 0)
	register(t, reg, f.URL, registry.HealthHealthy, []string{"pusher"})
	p := &pushes{last: map[string]time.Time{}}
	lastPush := t0.Add(35 * time.Second)
	p.last["pusher"] = lastPush
	s := newSched(t, reg, clk, f.Client(), spread.NewBurst(0, time.Second), p.RecentlyPushed)
	iv := 10 * time.Second
	s.kick()
	for s.step(lastPush) {
	}
	if got := f.log("pusher"); len(got) != 0 {
		t.Fatalf("a worker pushing within the interval was polled at %v", got)
	}
	for s.step(lastPush.Add(3 * iv)) {
	}
	got := f.log("pusher")
	phase := spread.PhaseOf("cp-test\x00poll", "pusher", iv)
	if len(got) == 0 || !got[0].Equal(phase.Next(lastPush.Add(iv-time.Nanosecond))) || got[0].Sub(lastPush) > 2*iv {
		t.Fatalf("after the last record at %s: polled at %v, want at its first phase an interval after it", lastPush, got)
	}
}

// TestABatchHoldsFewPollConnectionsAtOnce: 300 workers on a real loopback
// engine that answers each poll only at the end of its tenth of the
// interval, over the first interval and its end: spread, the connections
// open at once stay near the burst budget and a tenth of the batch; polled
// all at once, as before, all 300 are.
func TestABatchHoldsFewPollConnectionsAtOnce(t *testing.T) {
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
			e := testutil.NewHeldEngine(t, vllm)
			reg := registry.New("e", 0)
			register(t, reg, e.URL, registry.HealthHealthy, ids(n, "w"))
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
			defer client.CloseIdleConnections()
			s := newSched(t, reg, clk, client, spread.NewBurst(tc.burst, time.Second), nil)
			iv := 10 * time.Second
			peak := e.PeakOpen(k+1, func(i int) (int, func()) {
				clk.Set(t0.Add(iv * time.Duration(i) / k))
				s.m.pollDue(context.Background(), &s.s, i == 0) // the batch's membership change, then its ticks
				s.m.mu.Lock()
				defer s.m.mu.Unlock()
				started := 0
				for _, rd := range s.m.readers {
					if rd.inFlight {
						started++
					}
				}
				return started, s.m.polls.Wait
			})
			e.CheckPeak(t, n, peak, tc.limit, tc.burst == n)
		})
	}
}

// TestRunPollsEachWorkerAtItsPhase: the real loop, on synctest's clock, polls
// a batch of 500 workers over the first interval and each every interval
// after, late by no more than the schedule's resolution; and a worker made
// Ready alone later is polled at once.
func TestRunPollsEachWorkerAtItsPhase(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 500
		iv := 10 * time.Second
		reg := registry.New("e", 0)
		workers := ids(n, "w")
		register(t, reg, "http://fleet", registry.HealthHealthy, workers)
		register(t, reg, "http://fleet", registry.HealthPending, []string{"lone"})
		rec := &testutil.Recorder{Suffix: "/metrics", Answer: vllm}
		log := slog.New(slog.DiscardHandler)
		m := New(reg, evidence.New(reg, evidence.Options{}, log, prometheus.NewRegistry()), &http.Client{Transport: rec}, Options{Interval: iv, Seed: "cp-test"}, log)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		start := time.Now()
		go func() { m.Run(ctx); close(done) }()
		time.Sleep(25 * time.Second)
		ready := time.Now()
		setHealth(t, reg, "lone", registry.HealthHealthy)
		time.Sleep(time.Second)
		cancel()
		<-done

		atOnce := 0
		for _, id := range workers {
			polls := rec.Contacts(id)
			if len(polls) < 2 || len(polls) > 3 {
				t.Fatalf("%s polled %d times in 26 s at a 10 s interval, want 2 or 3", id, len(polls))
			}
			first := polls[0].Sub(start)
			if first == 0 {
				atOnce++
			} else if due := spread.PhaseOf(m.seed, id, iv).Next(start); first > iv+spread.Resolution || polls[0].Sub(due) > spread.Resolution || polls[0].Before(due) {
				t.Fatalf("%s first polled %s after start, want at its phase (%s), within the resolution", id, first, due.Sub(start))
			}
			for i := 1; i < len(polls); i++ {
				if d := polls[i].Sub(polls[i-1]); d < iv-spread.Resolution || d > iv+spread.Resolution {
					t.Fatalf("%s polled %s after its previous poll, want the interval %s", id, d, iv)
				}
			}
		}
		if atOnce != spread.DefaultBurstSize {
			t.Fatalf("%d polled at once, want the burst budget %d", atOnce, spread.DefaultBurstSize)
		}
		if lone := rec.Contacts("lone"); len(lone) != 1 || lone[0].Sub(ready) > spread.Resolution {
			t.Fatalf("the worker made Ready alone was polled at %v, want at once (%s)", lone, ready)
		}
	})
}
