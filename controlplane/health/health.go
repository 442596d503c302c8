// Package health is the control plane's health checker: it probes each
// worker's health endpoint and moves it to Ready after
// --health-success-threshold consecutive passes and out of Ready after
// --health-failure-threshold consecutive failures. Leaving Ready clears the
// overload veto (the spec's fail-open rule). Workers not yet judged are probed
// every second, so a new or recovering worker enters routing in seconds.
// Workers that come in a batch (a restart, a takeover, a bulk registration)
// are probed at their phases (controlplane/spread), spread over the interval.
//
// It owns the probes and the Health field; it never sets a veto (the
// registry's decide clears them when a worker leaves Ready).
package health

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/smg-project/smg/controlplane/registry"
	"github.com/smg-project/smg/controlplane/spread"
	"github.com/smg-project/smg/internal/enginegrpc"
)

// Options are the --health-* flags (facts.md defaults).
type Options struct {
	FailureThreshold int
	SuccessThreshold int
	IntervalSecs     int
	TimeoutSecs      int
	Endpoint         string
	StartupInterval  time.Duration // the probe period of workers not Ready
	// Seed is mixed into each worker's probe phase so that two control
	// planes probing the same engines do not probe them in step.
	Seed string
	Now  func() time.Time // nil: time.Now
	// Burst is the budget of first probes started at once (nil:
	// spread.DefaultBurstSize a second); a worker beyond it waits for its
	// phase.
	Burst *spread.Burst
	// GRPC (nil: gRPC workers fail their probes) probes grpc:// and
	// grpcs:// workers with their HealthCheck call.
	GRPC *enginegrpc.Pool
}

// DefaultOptions returns the spec's defaults.
func DefaultOptions() Options {
	return Options{FailureThreshold: 3, SuccessThreshold: 2, IntervalSecs: 60, TimeoutSecs: 5, Endpoint: "/health", StartupInterval: time.Second}
}

// AddFlags registers the --health-* flags.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.IntVar(&o.FailureThreshold, "health-failure-threshold", o.FailureThreshold, "consecutive failed health probes that take a worker out of Ready")
	fs.IntVar(&o.SuccessThreshold, "health-success-threshold", o.SuccessThreshold, "consecutive passing health probes that make a worker Ready")
	fs.IntVar(&o.IntervalSecs, "health-check-interval-secs", o.IntervalSecs, "seconds between health probes of a Ready worker (workers not Ready are probed every second)")
	fs.IntVar(&o.TimeoutSecs, "health-check-timeout-secs", o.TimeoutSecs, "seconds before a health probe fails")
	fs.StringVar(&o.Endpoint, "health-check-endpoint", o.Endpoint, "path probed on each worker")
}

// Validate reports the first invalid flag.
func (o Options) Validate() error {
	switch {
	case o.FailureThreshold < 1:
		return fmt.Errorf("--health-failure-threshold must be >= 1, got %d", o.FailureThreshold)
	case o.SuccessThreshold < 1:
		return fmt.Errorf("--health-success-threshold must be >= 1, got %d", o.SuccessThreshold)
	case o.IntervalSecs < 1:
		return fmt.Errorf("--health-check-interval-secs must be >= 1, got %d", o.IntervalSecs)
	case o.TimeoutSecs < 1:
		return fmt.Errorf("--health-check-timeout-secs must be >= 1, got %d", o.TimeoutSecs)
	case !strings.HasPrefix(o.Endpoint, "/"):
		return fmt.Errorf("--health-check-endpoint must start with '/', got %q", o.Endpoint)
	}
	return nil
}

// Checker probes workers.
type Checker struct {
	reg     *registry.Registry
	opts    Options
	client  *http.Client
	log     *slog.Logger
	contact func(workerID string, now time.Time)
	seed    string
	maxWait time.Duration // Run looks again at least this often
	wake    chan struct{} // a probe's outcome scheduled one before wakeAt

	mu     sync.Mutex
	sched  spread.Schedule[probeState] // each worker's next probe
	wakeAt time.Time                   // when Run's timer fires
}

// probeState schedules a worker's probes; the consecutive passes and
// failures are stored with the worker (registry.Evidence), so the health
// transition is decided in the transaction that commits it.
type probeState struct {
	url    string
	phased bool // came in a batch beyond the burst budget: probed at its phase, not one cadence after its last probe
}

// New returns a checker; contact (nil: none) hears of every passing probe
// (for liveness).
func New(reg *registry.Registry, opts Options, client *http.Client, contact func(workerID string, now time.Time), log *slog.Logger) *Checker {
	if opts.StartupInterval <= 0 {
		opts.StartupInterval = time.Second
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Burst == nil {
		opts.Burst = spread.NewBurst(spread.DefaultBurstSize, spread.DefaultBurstPer)
	}
	c := &Checker{reg: reg, opts: opts, client: client, log: log, contact: contact, seed: opts.Seed + "\x00health", wake: make(chan struct{}, 1)}
	c.maxWait = max(min(c.cadence(false), c.cadence(true))/4, spread.Resolution)
	return c
}

// cadence is the probe period of a worker Ready or not.
func (c *Checker) cadence(ready bool) time.Duration {
	if ready {
		return time.Duration(c.opts.IntervalSecs) * time.Second
	}
	return c.opts.StartupInterval
}

// Run probes until ctx ends. Each run (a leader's term) schedules every
// worker afresh.
func (c *Checker) Run(ctx context.Context) {
	c.mu.Lock()
	c.sched = spread.Schedule[probeState]{}
	c.mu.Unlock()
	var wg sync.WaitGroup
	defer wg.Wait()
	spread.Loop(ctx, c.reg.MembershipChanged, c.wake, func(reconcile bool) time.Duration { return c.probeDue(ctx, &wg, reconcile) })
}

// probeDue starts the probes that are due, after taking in membership
// changes if reconcile, and returns how long to wait for the next probe due.
func (c *Checker) probeDue(ctx context.Context, wg *sync.WaitGroup, reconcile bool) time.Duration {
	snap := c.reg.Snapshot()
	now := c.opts.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if reconcile {
		c.reconcile(snap.Workers(), now)
	}
	for sl := c.sched.PopDue(now); sl != nil; sl = c.sched.PopDue(now) {
		w := snap.Get(sl.ID)
		if w == nil || w.Spec.GetUrl() != sl.State.url {
			continue // removed or replaced: the pending reconcile sees to it
		}
		apiKey := w.Spec.GetApiKey()
		wg.Go(func() {
			ok, why := c.probe(ctx, sl.State.url, apiKey)
			if ctx.Err() == nil {
				c.record(sl, ok, why)
			}
		})
	}
	wait := c.sched.Wait(now, c.maxWait)
	c.wakeAt = now.Add(wait)
	return wait
}

// reconcile schedules the first probe of each worker not seen before (or
// now at another URL) and forgets removed ones. A first probe starts at once
// while the burst budget lasts; beyond it (a restart, a leader taking over,
// a bulk registration), each worker waits for its phase within its cadence,
// so the first probes of N workers spread over one interval.
func (c *Checker) reconcile(workers []*registry.Worker, now time.Time) {
	for _, w := range workers {
		if w.External() {
			continue // a provider is never probed: Ready from its registration
		}
		if sl := c.sched.Keep(w.ID); sl == nil || sl.State.url != w.Spec.GetUrl() {
			sl = c.sched.Add(w.ID, probeState{url: w.Spec.GetUrl()})
			at := now
			if !c.opts.Burst.Take(now) {
				sl.State.phased = true
				at = spread.PhaseOf(c.seed, w.ID, c.cadence(w.Ready())).Next(now)
			}
			c.sched.At(sl, at)
		}
	}
	c.sched.Sweep()
}

// probe asks the worker's health endpoint, with its api_key when it has one.
func (c *Checker) probe(ctx context.Context, url, apiKey string) (bool, string) {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(c.opts.TimeoutSecs)*time.Second)
	defer cancel()
	if enginegrpc.IsGRPC(url) {
		if c.opts.GRPC == nil {
			return false, "no gRPC client configured"
		}
		gc, err := c.opts.GRPC.Get(url)
		if err == nil {
			err = gc.Health(ctx)
		}
		if err != nil {
			return false, err.Error()
		}
		return true, ""
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(url, "/")+c.opts.Endpoint, nil)
	if err != nil {
		return false, err.Error()
	}
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return false, err.Error()
	}
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return false, fmt.Sprintf("HTTP %d", resp.StatusCode)
	}
	return true, ""
}

// record applies a probe's outcome and schedules the worker's next probe:
// a phased worker at its phase in the cadence its health now calls for (at
// most one cadence away, and exactly one while the health holds), another
// one cadence after this probe.
func (c *Checker) record(sl *spread.Slot[probeState], ok bool, why string) {
	now := c.opts.Now()
	to := c.Observe(sl.ID, sl.State.url, ok, why, now)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sched.Get(sl.ID) != sl {
		return // removed or replaced while the probe ran
	}
	cadence := c.cadence(to == registry.HealthHealthy) // not Ready: look again soon
	next := now.Add(cadence)
	if sl.State.phased {
		next = spread.PhaseOf(c.seed, sl.ID, cadence).Next(now)
	}
	c.sched.At(sl, next)
	if next.Before(c.wakeAt) {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
}

// Observe records one probe outcome of the worker at url: the consecutive
// count is stored with the worker and a health transition is committed when
// a threshold is met, in one transaction (leaving Ready drops the worker's
// vetoes there too, by the registry's rule). It returns the worker's health
// after, or "" when the worker was removed or now has another URL.
func (c *Checker) Observe(id, url string, ok bool, why string, now time.Time) registry.Health {
	if ok && c.contact != nil {
		c.contact(id, now)
	}
	var from, to registry.Health
	var failures int
	_, err := c.reg.Update(func(t *registry.Txn) error {
		w := t.Get(id)
		if w == nil || w.Spec.GetUrl() != url {
			return nil // removed or replaced while the probe ran
		}
		n := w.Clone()
		ev := &n.Evidence
		if ok {
			ev.ProbePasses, ev.ProbeFailures = min(ev.ProbePasses+1, c.opts.SuccessThreshold), 0
		} else {
			ev.ProbePasses, ev.ProbeFailures = 0, min(ev.ProbeFailures+1, c.opts.FailureThreshold)
		}
		from, to, failures = w.Health, w.Health, ev.ProbeFailures
		switch {
		case ok && ev.ProbePasses >= c.opts.SuccessThreshold:
			to = registry.HealthHealthy
		case !ok && ev.ProbeFailures >= c.opts.FailureThreshold:
			to = registry.HealthUnhealthy
		}
		if to == w.Health && ev.ProbePasses == w.Evidence.ProbePasses && ev.ProbeFailures == w.Evidence.ProbeFailures {
			return nil // steady: nothing to store
		}
		n.Health = to
		t.Insert(n)
		return nil
	})
	if err != nil {
		c.log.Error("Health probe not recorded", "worker_id", id, "url", url, "error", err)
	}
	if from != to {
		if to == registry.HealthHealthy {
			c.log.Info("Worker is Ready", "worker_id", id, "url", url)
		} else {
			c.log.Warn("Worker left Ready: health probes failing", "worker_id", id, "url", url, "failures", failures, "last_error", why)
		}
	}
	return to
}
