// Package liveness holds the control plane's liveness evidence per worker and
// turns it into unreachable and wedged vetoes (the spec's "When a Worker Dies
// or Loses Its Link", "When an Engine Freezes", "When a Worker Goes Silent
// Entirely"). The rules themselves are judge.Liveness; this package collects
// the evidence from every channel (agents, polls, health probes, routers),
// sums what routers see, runs the sweep, and stores each verdict change in
// the registry with a log line and metrics. No veto touches health.
package liveness

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// Tracker collects liveness evidence and keeps verdicts in the registry.
type Tracker struct {
	reg   *registry.Registry
	rules judge.Rules
	log   *slog.Logger
	now   func() time.Time

	stalled     *prometheus.GaugeVec
	transitions *prometheus.CounterVec

	mu      sync.Mutex
	workers map[string]*entry
}

type entry struct {
	url      string
	live     judge.Liveness
	routers  map[string]routerView // latest observation of each router
	pushedAt time.Time             // latest record an agent pushed
}

type routerView struct {
	streams      int64
	lastProgress time.Time
	prefill      int64
}

// New returns a tracker; metrics register on m.
func New(reg *registry.Registry, cfg judge.LivenessConfig, log *slog.Logger, m prometheus.Registerer) *Tracker {
	t := &Tracker{
		reg: reg, rules: cfg.Rules(), log: log, now: time.Now, workers: map[string]*entry{},
		stalled: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "smg_worker_stalled",
			Help: "1 while the worker is excluded from routing by liveness, labeled with the reason (unreachable or wedged).",
		}, []string{"worker", "reason"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "smg_worker_stall_transitions_total",
			Help: "Times the worker was vetoed by liveness, by reason.",
		}, []string{"worker", "reason"}),
	}
	m.MustRegister(t.stalled, t.transitions)
	return t
}

// SetClock replaces the clock (tests).
func (t *Tracker) SetClock(now func() time.Time) { t.now = now }

// Run sweeps every judge.SweepInterval until ctx ends.
func (t *Tracker) Run(ctx context.Context) {
	tick := time.NewTicker(judge.SweepInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			t.Sweep(t.now())
		}
	}
}

// Sweep re-judges every Ready worker at now, and drops the evidence of
// workers that left Ready or were removed (their vetoes go with it).
func (t *Tracker) Sweep(now time.Time) {
	snap := t.reg.Snapshot()
	ready := map[string]*registry.Worker{}
	for _, w := range snap.Workers() {
		if w.Ready() {
			ready[w.ID] = w
		}
	}
	t.mu.Lock()
	var changes []change
	for id, e := range t.workers {
		w := ready[id]
		if w == nil || w.Spec.GetUrl() != e.url {
			if v, _ := e.live.Status(); v != judge.Live {
				changes = append(changes, change{id: id, url: e.url, c: judge.Change{Verdict: judge.Live, Previous: v}, dropped: true})
			}
			delete(t.workers, id)
			continue
		}
		if c := e.live.Sweep(now, &t.rules); c.Changed() {
			changes = append(changes, change{id: id, url: e.url, c: c})
		}
	}
	t.mu.Unlock()
	t.apply(changes)
}

type change struct {
	id, url string
	c       judge.Change
	dropped bool
}

// with runs fn on a Ready worker's evidence and applies a verdict change.
func (t *Tracker) with(workerID string, fn func(e *entry) judge.Change) {
	w := t.reg.Snapshot().Get(workerID)
	if w == nil || !w.Ready() {
		return // the rules judge Ready workers only
	}
	t.mu.Lock()
	e := t.workers[workerID]
	if e == nil || e.url != w.Spec.GetUrl() {
		e = &entry{url: w.Spec.GetUrl(), routers: map[string]routerView{}}
		t.workers[workerID] = e
	}
	c := fn(e)
	t.mu.Unlock()
	if c.Changed() {
		t.apply([]change{{id: workerID, url: e.url, c: c}})
	}
}

// Contact records contact that carries no load (an answered poll without a
// usable report, a passing probe, a heartbeat for the engine).
func (t *Tracker) Contact(workerID string, now time.Time) {
	t.with(workerID, func(e *entry) judge.Change { return e.live.Contact(now, &t.rules) })
}

// Failure records a failure on one of the worker's channels.
func (t *Tracker) Failure(workerID string, kind judge.FailureKind, now time.Time) {
	t.with(workerID, func(e *entry) judge.Change { return e.live.Failure(now, kind, &t.rules) })
}

// Record ingests a load report's liveness side (pushed by an agent, or an
// answered poll).
func (t *Tracker) Record(workerID string, rec judge.Record, now time.Time) {
	t.with(workerID, func(e *entry) judge.Change {
		if rec.Pushed {
			e.pushedAt = now
		}
		return e.live.Record(now, rec, &t.rules)
	})
}

// RecentlyPushed tells the poller to skip a worker whose agent delivered a
// record within the interval (the poll takes over when records stop).
func (t *Tracker) RecentlyPushed(workerID string, within time.Duration, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.workers[workerID]
	return e != nil && !e.pushedAt.IsZero() && now.Sub(e.pushedAt) < within
}

// StopPushed forgets when the worker's agent last pushed (its stream ended),
// so the poller takes over at once.
func (t *Tracker) StopPushed(workerID string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.workers[workerID]; e != nil {
		e.pushedAt = time.Time{}
	}
}

// PollAnswered implements monitor.Observer.
func (t *Tracker) PollAnswered(workerID string, now time.Time) { t.Contact(workerID, now) }

// PollReport implements monitor.Observer: an answered poll is contact and
// shows the waiting queue.
func (t *Tracker) PollReport(workerID string, waiting int64, now time.Time) {
	t.Record(workerID, judge.Record{Waiting: waiting}, now)
}

// PollTransportFailure implements monitor.Observer: an HTTP worker's failed
// poll never arms the unreachable veto.
func (t *Tracker) PollTransportFailure(workerID string, _ error, now time.Time) {
	t.Failure(workerID, judge.HTTPPollFailed, now)
}

// HealthPassed implements health.ContactSink.
func (t *Tracker) HealthPassed(workerID string, now time.Time) { t.Contact(workerID, now) }

// RouterObservations implements watch.ObservationSink: piles and progress
// are summed over routers.
func (t *Tracker) RouterObservations(routerID string, rep *smgv1.RouterReport, now time.Time) {
	for _, o := range rep.GetWorkers() {
		id := o.GetWorkerId()
		var lastProgress time.Time
		if o.GetLastProgress() != nil {
			lastProgress = o.GetLastProgress().AsTime()
		}
		t.with(id, func(e *entry) judge.Change {
			// The contact or failure below may move the verdict on its own;
			// the change to commit runs from the verdict before the report.
			before, _ := e.live.Status()
			if o.GetContact() {
				e.live.Contact(now, &t.rules)
			}
			if o.GetConnectionFailures() > 0 {
				at := now
				if o.GetLastFailure() != nil {
					at = o.GetLastFailure().AsTime()
				}
				e.live.Failure(at, judge.ConnectionFailure, &t.rules)
			}
			e.live.SetPrefillRate(o.GetPrefillTokensPerSec())
			e.routers[routerID] = routerView{streams: int64(o.GetStreamsInFlight()), lastProgress: lastProgress, prefill: o.GetPromptTokensInFlight()}
			c := e.live.Routers(now, e.sum(), &t.rules)
			c.Previous = before
			return c
		})
	}
}

// RouterGone implements watch.ObservationSink: the router's piles no longer count.
func (t *Tracker) RouterGone(routerID string) {
	now := t.now()
	t.mu.Lock()
	var changes []change
	for id, e := range t.workers {
		if _, ok := e.routers[routerID]; !ok {
			continue
		}
		delete(e.routers, routerID)
		if c := e.live.Routers(now, e.sum(), &t.rules); c.Changed() {
			changes = append(changes, change{id: id, url: e.url, c: c})
		}
	}
	t.mu.Unlock()
	t.apply(changes)
}

// sum adds up the routers' piles and takes the latest progress.
func (e *entry) sum() judge.RouterObservation {
	var o judge.RouterObservation
	for _, v := range e.routers {
		o.Streams += v.streams
		o.PrefillTokens += v.prefill
		if v.lastProgress.After(o.LastProgress) {
			o.LastProgress = v.lastProgress
		}
	}
	return o
}

// apply stores verdict changes, logs them and updates the metrics.
func (t *Tracker) apply(changes []change) {
	if len(changes) == 0 {
		return
	}
	_, _ = t.reg.Update(func(txn *registry.Txn) error {
		for _, ch := range changes {
			w := txn.Get(ch.id)
			if w == nil {
				continue
			}
			c := w.Clone()
			c.Liveness, c.LivenessReason = vetoOf(ch.c.Verdict), ""
			if ch.c.Verdict != judge.Live {
				c.LivenessReason = ch.c.Cause.String()
			}
			if ch.c.Previous == judge.Unreachable && ch.c.Verdict != judge.Unreachable {
				c.ContactSeq++ // routers close the worker's circuit breaker
			}
			if err := txn.Insert(c); err != nil {
				return err
			}
		}
		return nil
	})
	for _, ch := range changes {
		for _, v := range []judge.Verdict{judge.Unreachable, judge.Wedged} {
			val := 0.0
			if ch.c.Verdict == v {
				val = 1
			}
			t.stalled.WithLabelValues(ch.url, v.String()).Set(val)
		}
		if ch.c.Verdict != judge.Live {
			t.transitions.WithLabelValues(ch.url, ch.c.Verdict.String()).Inc()
			t.log.Warn("Worker vetoed by liveness", "worker_id", ch.id, "url", ch.url, "reason", ch.c.Verdict.String(), "cause", ch.c.Cause.String())
		} else if ch.dropped {
			t.log.Info("Worker re-admitted by liveness", "worker_id", ch.id, "url", ch.url, "cause", "left Ready or removed")
		} else {
			t.log.Info("Worker re-admitted by liveness", "worker_id", ch.id, "url", ch.url, "cause", ch.c.Cause.String())
		}
	}
}

func vetoOf(v judge.Verdict) smgv1.Veto {
	switch v {
	case judge.Unreachable:
		return smgv1.Veto_VETO_UNREACHABLE
	case judge.Wedged:
		return smgv1.Veto_VETO_WEDGED
	}
	return smgv1.Veto_VETO_UNSPECIFIED
}
