// Package ingest applies load reports to the registry: the overload check runs
// once per report against the worker's own thresholds and the verdict is
// stored on the worker (the spec's "Polling" and "When a Worker Does Not
// Report"). Nothing here runs per request.
package ingest

import (
	"errors"
	"log/slog"

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
}

// New returns an Ingester writing to reg.
func New(reg *registry.Registry, log *slog.Logger) *Ingester {
	return &Ingester{reg: reg, log: log}
}

// Report ingests one load report for a worker. A nil or empty report is "no
// report": the veto clears (fail open) and the last load stays visible.
func (in *Ingester) Report(workerID string, load *smgv1.EngineLoad) error {
	if load == nil || len(load.GetRanks()) == 0 {
		return in.NoReport(workerID)
	}
	var flipped, over bool
	var reason judge.OverloadReason
	var model string
	_, err := in.reg.Update(func(t *registry.Txn) error {
		w := t.Get(workerID)
		if w == nil {
			return ErrUnknownWorker
		}
		over, reason = judge.Check(int64(load.GetWaitingRequests()), load.GetTokenUsage(), w.Thresholds)
		c := w.Clone()
		c.Load = load
		c.LoadRevision++
		if over != w.Overloaded {
			flipped = true
			c.Overloaded = over
			c.OverloadReason = ""
			if over {
				c.OverloadReason = reason.String()
			}
		} else if over && (reason.Waiting != int64(w.Load.GetWaitingRequests()) || reason.TokenUsage != w.Load.GetTokenUsage()) {
			c.OverloadReason = reason.String()
		}
		model = w.Model
		return t.Insert(c)
	})
	if err != nil {
		return err
	}
	if flipped {
		if over {
			in.log.Info("Worker overloaded: excluded from routing", "worker_id", workerID, "model", model, "reason", reason.String())
		} else {
			in.log.Info("Worker under every threshold: back in routing", "worker_id", workerID, "model", model, "reason", reason.String())
		}
	}
	return nil
}

// NoReport records a poll that produced no report: the overload veto clears.
func (in *Ingester) NoReport(workerID string) error {
	cleared := false
	_, err := in.reg.Update(func(t *registry.Txn) error {
		w := t.Get(workerID)
		if w == nil {
			return ErrUnknownWorker
		}
		if !w.Overloaded {
			return nil
		}
		c := w.Clone()
		c.Overloaded, c.OverloadReason = false, ""
		cleared = true
		return t.Insert(c)
	})
	if cleared {
		in.log.Info("Worker sent no load report: overload veto cleared (fail open)", "worker_id", workerID)
	}
	return err
}

// ClearOverload drops a worker's overload veto (it left Ready).
func (in *Ingester) ClearOverload(workerID, why string) {
	_ = in.NoReport(workerID)
}

// Rebuild clears the overload veto of every worker: the monitor lost its state
// and holds no fresh signal for any of them.
func (in *Ingester) Rebuild(why string) {
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
