package health

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// engine is a real HTTP engine on loopback whose /health answers status.
type engine struct {
	*httptest.Server
	status atomic.Int32
	auth   atomic.Value // last Authorization header
	probes atomic.Int32
}

func newEngine(t *testing.T) *engine {
	e := &engine{}
	e.status.Store(http.StatusOK)
	e.auth.Store("")
	e.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" {
			http.NotFound(w, r)
			return
		}
		e.probes.Add(1)
		e.auth.Store(r.Header.Get("Authorization"))
		w.WriteHeader(int(e.status.Load()))
	}))
	t.Cleanup(e.Close)
	return e
}

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

type sink struct{ passed atomic.Int32 }

func (s *sink) Contact(string, time.Time) { s.passed.Add(1) }

func setup(t *testing.T, url, apiKey string, h registry.Health) (*Checker, *registry.Registry, *clock, *sink) {
	t.Helper()
	reg := registry.New("e", 0)
	if _, err := reg.Update(func(tx *registry.Txn) error {
		tx.Insert(&registry.Worker{Registered: registry.Registered{ID: "w1", Spec: &smgv1.WorkerSpec{Url: url, ApiKey: apiKey}, Thresholds: judge.Thresholds{WaitingRequests: 8}}, State: registry.State{Health: h}})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	clk := &clock{now: t0}
	s := &sink{}
	opts := DefaultOptions()
	opts.Now = clk.Now
	return New(reg, opts, http.DefaultClient, s.Contact, slog.New(slog.DiscardHandler)), reg, clk, s
}

// round runs one probe round and waits for its probes. It reconciles every
// round: a round without a membership change finds nothing to reconcile.
func round(c *Checker) {
	var wg sync.WaitGroup
	c.probeDue(context.Background(), &wg, true)
	wg.Wait()
}

func TestSuccessThresholdMakesAPendingWorkerReady(t *testing.T) {
	e := newEngine(t)
	c, reg, clk, s := setup(t, e.URL, "", registry.HealthPending)
	round(c)
	if h := reg.Get("w1").Health; h != registry.HealthPending {
		t.Fatalf("after 1 pass of 2: %v, want pending", h)
	}
	round(c) // not due yet: a pending worker is probed every second
	if n := e.probes.Load(); n != 1 {
		t.Fatalf("probed %d times within the startup interval, want 1", n)
	}
	clk.Add(time.Second)
	round(c)
	if h := reg.Get("w1").Health; h != registry.HealthHealthy {
		t.Fatalf("after 2 passes: %v, want healthy", h)
	}
	if s.passed.Load() != 2 {
		t.Fatalf("the contact sink heard %d passes, want 2", s.passed.Load())
	}
	// Ready: the next probe waits for --health-check-interval-secs.
	clk.Add(59 * time.Second)
	round(c)
	if n := e.probes.Load(); n != 2 {
		t.Fatalf("a Ready worker was probed before its interval (%d probes)", n)
	}
	clk.Add(time.Second)
	round(c)
	if n := e.probes.Load(); n != 3 {
		t.Fatalf("a Ready worker was not probed at its interval (%d probes)", n)
	}
}

func TestFailureThresholdTakesAWorkerOutOfReadyAndDropsItsVetoes(t *testing.T) {
	e := newEngine(t)
	c, reg, clk, _ := setup(t, e.URL, "", registry.HealthHealthy)
	rules := judge.DefaultLivenessConfig().Rules()
	if _, err := reg.Update(func(tx *registry.Txn) error {
		w := tx.Get("w1").Clone()
		w.Load = &smgv1.EngineLoad{WaitingRequests: 9}
		w.Evidence.Live.Failure(t0, judge.ConnectionFailure, &rules)
		tx.Insert(w)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if w := reg.Get("w1"); !w.Overloaded || w.Liveness != smgv1.Veto_VETO_UNREACHABLE {
		t.Fatalf("setup: overloaded %v liveness %v", w.Overloaded, w.Liveness)
	}
	e.status.Store(http.StatusServiceUnavailable)
	for i := range 3 {
		if h := reg.Get("w1").Health; h != registry.HealthHealthy {
			t.Fatalf("left Ready after %d failures of 3", i)
		}
		round(c)
		clk.Add(time.Minute)
	}
	w := reg.Get("w1")
	if w.Health != registry.HealthUnhealthy {
		t.Fatalf("after 3 failed probes: %v, want unhealthy", w.Health)
	}
	if w.Overloaded || w.Liveness != smgv1.Veto_VETO_UNSPECIFIED {
		t.Fatalf("leaving Ready must clear the vetoes (fail open): overloaded %v liveness %v", w.Overloaded, w.Liveness)
	}
	// A failure in between resets the count of passes.
	e.status.Store(http.StatusOK)
	round(c)
	e.status.Store(http.StatusInternalServerError)
	clk.Add(time.Second)
	round(c)
	e.status.Store(http.StatusOK)
	clk.Add(time.Second)
	round(c)
	if h := reg.Get("w1").Health; h != registry.HealthUnhealthy {
		t.Fatalf("pass, fail, pass made it %v; the passes must be consecutive", h)
	}
	clk.Add(time.Second)
	round(c)
	if h := reg.Get("w1").Health; h != registry.HealthHealthy {
		t.Fatalf("two consecutive passes made it %v, want healthy", h)
	}
}

func TestProbeSendsTheWorkersAPIKey(t *testing.T) {
	e := newEngine(t)
	c, _, _, _ := setup(t, e.URL, "sekret", registry.HealthPending)
	round(c)
	if got := e.auth.Load(); got != "Bearer sekret" {
		t.Fatalf("Authorization = %q, want the worker's api_key as a bearer token", got)
	}
}

func TestUnreachableEngineFailsTheProbe(t *testing.T) {
	e := newEngine(t)
	url := e.URL
	e.Close() // nothing listens there any more
	c, reg, _, s := setup(t, url, "", registry.HealthHealthy)
	c.opts.FailureThreshold = 1
	round(c)
	if h := reg.Get("w1").Health; h != registry.HealthUnhealthy {
		t.Fatalf("a refused probe left it %v", h)
	}
	if s.passed.Load() != 0 {
		t.Fatal("a failed probe counted as contact")
	}
}

func TestObserveIgnoresAProbeOfAReplacedURL(t *testing.T) {
	c, reg, _, _ := setup(t, "http://new", "", registry.HealthPending)
	c.opts.SuccessThreshold = 1
	if h := c.Observe("w1", "http://old", true, "", t0); h != "" {
		t.Fatalf("a probe of the old URL returned %q", h)
	}
	if reg.Get("w1").Health != registry.HealthPending {
		t.Fatal("a probe of the old URL made the new engine Ready")
	}
	if h := c.Observe("gone", "http://x", true, "", t0); h != "" {
		t.Fatal("a probe of a removed worker was recorded")
	}
}

func TestValidateNamesTheFlag(t *testing.T) {
	for _, tc := range []struct {
		mod  func(*Options)
		flag string
	}{
		{func(o *Options) { o.FailureThreshold = 0 }, "--health-failure-threshold"},
		{func(o *Options) { o.SuccessThreshold = 0 }, "--health-success-threshold"},
		{func(o *Options) { o.IntervalSecs = 0 }, "--health-check-interval-secs"},
		{func(o *Options) { o.TimeoutSecs = 0 }, "--health-check-timeout-secs"},
		{func(o *Options) { o.Endpoint = "health" }, "--health-check-endpoint"},
	} {
		o := DefaultOptions()
		tc.mod(&o)
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), tc.flag) {
			t.Errorf("%s: Validate() = %v, want an error naming it", tc.flag, err)
		}
	}
	if err := DefaultOptions().Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
}
