// Package ingest applies load reports to the registry: the overload check runs
// once per report against the worker's own thresholds and the verdict is
// stored on the worker (the spec's "Polling" and "When a Worker Does Not
// Report"). Nothing here runs per request.
//
// With coalescing on (Coalesce), a report that leaves the verdict as it is
// only replaces the worker's pending load, latest wins, and Flush commits
// every pending load in one transaction; a report that flips the verdict
// commits at once. Verdicts are never delayed, the memdb commit is paid per
// flush instead of per report, and watchers see one revision per flush.
package ingest

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// ErrUnknownWorker is returned for a report about a worker not registered.
var ErrUnknownWorker = errors.New("unknown worker")

// Ingester stores reports and overload verdicts.
type Ingester struct {
	reg *registry.Registry
	log *slog.Logger

	mu       sync.Mutex                   // serializes the check against the stored verdict
	coalesce bool                         // load-only reports wait for Flush
	pending  map[string]*smgv1.EngineLoad // by worker id, latest wins
}

// New returns an Ingester writing to reg; every report commits at once until
// Coalesce is called.
func New(reg *registry.Registry, log *slog.Logger) *Ingester {
	return &Ingester{reg: reg, log: log, pending: map[string]*smgv1.EngineLoad{}}
}

// DefaultFlushInterval bounds how long a load-only update waits for its commit.
const DefaultFlushInterval = 50 * time.Millisecond

// Coalesce turns coalescing on: Run must then flush.
func (in *Ingester) Coalesce() {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.coalesce = true
}

// Run flushes pending loads every interval until ctx ends, then once more.
func (in *Ingester) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			in.Flush()
			return
		case <-t.C:
			in.Flush()
		}
	}
}

// Flush commits every pending load in one transaction. It never changes a
// verdict: one that the stored state no longer matches waits for the next
// report, which commits at once if it flips.
func (in *Ingester) Flush() {
	in.mu.Lock()
	defer in.mu.Unlock()
	if len(in.pending) == 0 {
		return
	}
	_, _ = in.reg.Update(func(t *registry.Txn) error {
		for id, load := range in.pending {
			w := t.Get(id)
			if w == nil {
				continue
			}
			c := w.Clone()
			c.Load = load
			c.LoadRevision++
			if c.Overloaded {
				_, reason := judge.Check(int64(load.GetWaitingRequests()), load.GetTokenUsage(), w.Thresholds)
				c.OverloadReason = reason.String()
			}
			if err := t.Insert(c); err != nil {
				return err
			}
		}
		return nil
	})
	clear(in.pending)
}

// Report ingests one load report for a worker and takes ownership of load. A
// nil or empty report is "no report": the veto clears (fail open) and the last
// load stays visible. The signals are computed from the ranks (waiting summed,
// token usage averaged), whatever aggregates the sender filled in. A worker
// that is not Ready gets no veto: leaving Ready clears it, and a report racing
// that transition must not set it again.
func (in *Ingester) Report(workerID string, load *smgv1.EngineLoad) error {
	if load == nil || len(load.GetRanks()) == 0 {
		return in.NoReport(workerID)
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.coalesce {
		w := in.reg.Get(workerID)
		if w == nil {
			return ErrUnknownWorker
		}
		waiting, usage := Signals(load.GetRanks())
		load.WaitingRequests, load.TokenUsage = int32(min(waiting, math.MaxInt32)), usage
		over, _ := judge.Check(waiting, usage, w.Thresholds)
		if (over && w.Ready()) == w.Overloaded {
			in.pending[workerID] = load // the verdict stands: commit with the next flush
			return nil
		}
		delete(in.pending, workerID) // this report is newer
	}
	var f flip
	_, err := in.reg.Update(func(t *registry.Txn) error {
		var err error
		f, err = apply(t, workerID, load)
		return err
	})
	if err != nil {
		return err
	}
	in.logFlip(f)
	return nil
}

// flip is a verdict change to log after the commit.
type flip struct {
	flipped  bool
	over     bool
	noReport bool
	workerID string
	model    string
	reason   judge.OverloadReason
}

// apply stores one report and its verdict in t.
func apply(t *registry.Txn, workerID string, load *smgv1.EngineLoad) (flip, error) {
	w := t.Get(workerID)
	if w == nil {
		return flip{}, ErrUnknownWorker
	}
	waiting, usage := Signals(load.GetRanks())
	load.WaitingRequests, load.TokenUsage = int32(min(waiting, math.MaxInt32)), usage
	over, reason := judge.Check(waiting, usage, w.Thresholds)
	over = over && w.Ready()
	c := w.Clone()
	c.Load = load
	c.LoadRevision++
	f := flip{over: over, workerID: workerID, model: w.Model, reason: reason}
	if over != w.Overloaded {
		f.flipped = true
		c.Overloaded = over
		c.OverloadReason = ""
		if over {
			c.OverloadReason = reason.String()
		}
	} else if over && (reason.Waiting != int64(w.Load.GetWaitingRequests()) || reason.TokenUsage != w.Load.GetTokenUsage()) {
		c.OverloadReason = reason.String()
	}
	return f, t.Insert(c)
}

// clearVeto is "no report" in t: the overload veto clears.
func clearVeto(t *registry.Txn, workerID string) (flip, error) {
	w := t.Get(workerID)
	if w == nil {
		return flip{}, ErrUnknownWorker
	}
	if !w.Overloaded {
		return flip{}, nil
	}
	c := w.Clone()
	c.Overloaded, _ = judge.NoReport() // fail open: no fresh signal, no opinion
	c.OverloadReason = ""
	return flip{flipped: true, noReport: true, workerID: workerID, model: w.Model}, t.Insert(c)
}

func (in *Ingester) logFlip(f flip) {
	switch {
	case !f.flipped:
	case f.noReport:
		in.log.Info("Worker sent no load report: overload veto cleared (fail open)", "worker_id", f.workerID, "model", f.model)
	case f.over:
		in.log.Info("Worker overloaded: excluded from routing", "worker_id", f.workerID, "model", f.model, "reason", f.reason.String())
	default:
		in.log.Info("Worker under every threshold: back in routing", "worker_id", f.workerID, "model", f.model, "reason", f.reason.String())
	}
}

// Signals computes a report's two signals: waiting requests summed over the
// ranks and KV token usage averaged over them. A field a rank leaves out
// reads 0.
func Signals(ranks []*smgv1.RankLoad) (waiting int64, tokenUsage float64) {
	if len(ranks) == 0 {
		return 0, 0
	}
	for _, r := range ranks {
		waiting += int64(max(r.GetWaitingRequests(), 0))
		tokenUsage += r.GetTokenUsage()
	}
	return waiting, tokenUsage / float64(len(ranks))
}

// NoReport records a poll that produced no report: the overload veto clears.
func (in *Ingester) NoReport(workerID string) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	delete(in.pending, workerID) // "no report" is newer than any pending load
	var f flip
	_, err := in.reg.Update(func(t *registry.Txn) error {
		var err error
		f, err = clearVeto(t, workerID)
		return err
	})
	in.logFlip(f)
	return err
}

// Rebuild clears the overload veto of every worker: the monitor lost its state
// and holds no fresh signal for any of them.
func (in *Ingester) Rebuild(why string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	clear(in.pending)
	n := 0
	_, _ = in.reg.Update(func(t *registry.Txn) error {
		for _, w := range t.Workers() {
			if !w.Overloaded {
				continue
			}
			c := w.Clone()
			c.Overloaded, c.OverloadReason = false, ""
			n++
			if err := t.Insert(c); err != nil {
				return err
			}
		}
		return nil
	})
	in.log.Warn("Load monitor rebuilt its state: overload vetoes cleared for every worker", "reason", why, "cleared", n)
}
