// Package health is the control plane's health checker: it probes each
// worker's health endpoint and moves it to Ready after
// --health-success-threshold consecutive passes and out of Ready after
// --health-failure-threshold consecutive failures. Leaving Ready clears the
// overload veto (the spec's fail-open rule). Workers not yet judged are probed
// every second, so a new or recovering worker enters routing in seconds.
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
)

// Options are the --health-* flags (facts.md defaults).
type Options struct {
	FailureThreshold int
	SuccessThreshold int
	IntervalSecs     int
	TimeoutSecs      int
	Endpoint         string
	// StartupInterval is the probe period of workers still pending.
	StartupInterval time.Duration
	// Now is the clock (nil: time.Now).
	Now func() time.Time
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

// ContactSink hears of every passing probe (contact, for liveness).
type ContactSink interface {
	HealthPassed(workerID string, now time.Time)
}

// Checker probes workers.
type Checker struct {
	reg    *registry.Registry
	opts   Options
	client *http.Client
	log    *slog.Logger
	now    func() time.Time
	sink   ContactSink

	mu    sync.Mutex
	state map[string]*probeState
}

// probeState schedules a worker's probes; the consecutive passes and
// failures are stored with the worker (registry.Evidence), so the health
// transition is decided in the transaction that commits it.
type probeState struct {
	url      string
	next     time.Time
	inFlight bool
}

// New returns a checker; sink (nil: none) hears of every passing probe.
func New(reg *registry.Registry, opts Options, client *http.Client, sink ContactSink, log *slog.Logger) *Checker {
	if opts.StartupInterval <= 0 {
		opts.StartupInterval = time.Second
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Checker{reg: reg, opts: opts, client: client, log: log, now: opts.Now, sink: sink, state: map[string]*probeState{}}
}

// Run probes until ctx ends.
func (c *Checker) Run(ctx context.Context) {
	tick := time.NewTicker(min(c.opts.StartupInterval, time.Duration(c.opts.IntervalSecs)*time.Second) / 4)
	defer tick.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c.probeDue(ctx, &wg)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-c.reg.MembershipChanged():
		}
	}
}

func (c *Checker) probeDue(ctx context.Context, wg *sync.WaitGroup) {
	now := c.now()
	workers := c.reg.Snapshot().Workers()
	seen := make(map[string]bool, len(workers))
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range workers {
		seen[w.ID] = true
		st := c.state[w.ID]
		if st == nil || st.url != w.Spec.GetUrl() {
			st = &probeState{url: w.Spec.GetUrl(), next: now}
			c.state[w.ID] = st
		}
		if st.inFlight || now.Before(st.next) {
			continue
		}
		st.inFlight = true
		wg.Add(1)
		go func(id, apiKey string, st *probeState) {
			defer wg.Done()
			ok, why := c.probe(ctx, st.url, apiKey)
			if ctx.Err() != nil {
				c.mu.Lock()
				st.inFlight = false // a later Run (the next term) probes it again
				c.mu.Unlock()
				return
			}
			c.record(id, st, ok, why)
		}(w.ID, w.Spec.GetApiKey(), st)
	}
	for id := range c.state {
		if !seen[id] {
			delete(c.state, id)
		}
	}
}

// probe asks the worker's health endpoint, with its api_key when it has one.
func (c *Checker) probe(ctx context.Context, url, apiKey string) (bool, string) {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(c.opts.TimeoutSecs)*time.Second)
	defer cancel()
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

// record applies a probe's outcome and schedules the worker's next probe.
func (c *Checker) record(id string, st *probeState, ok bool, why string) {
	now := c.now()
	to := c.Observe(id, st.url, ok, why, now)
	c.mu.Lock()
	defer c.mu.Unlock()
	st.inFlight = false
	if to != registry.HealthHealthy { // not Ready: look again soon
		st.next = now.Add(c.opts.StartupInterval)
	} else {
		st.next = now.Add(time.Duration(c.opts.IntervalSecs) * time.Second)
	}
}

// Observe records one probe outcome of the worker at url: the consecutive
// count is stored with the worker and a health transition is committed when
// a threshold is met, in one transaction (leaving Ready drops the worker's
// vetoes there too, by the registry's rule). It returns the worker's health
// after, or "" when the worker was removed or now has another URL.
func (c *Checker) Observe(id, url string, ok bool, why string, now time.Time) registry.Health {
	if ok && c.sink != nil {
		c.sink.HealthPassed(id, now)
	}
	var from, to registry.Health
	var failures int
	_, err := c.reg.Update(func(t *registry.Txn) error {
		from, to = "", ""
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
