package evidence

import (
	"maps"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/enginegrpc"
)

// applyPushed moves ev by one pushed record.
func applyPushed(ev *registry.Evidence, r timedRecord, rules *judge.Rules) {
	if r.rec.Pushed {
		ev.PushedAt = r.at
	}
	ev.Live.Record(r.at, r.rec, rules)
}

// Sweep stores everything pending (Flush), re-judges every Ready worker at
// now with how far its agent's stream is read, and clears the metrics of
// vetoed workers gone from Ready. The fleet is judged outside the write lock
// (it would hold up every flip), those that move again in one transaction.
func (in *Inbox) Sweep(now time.Time) {
	in.Flush()
	reads := in.readStates(now)
	sweep := func(w *registry.Worker) (judge.Liveness, judge.Change) {
		live := w.Evidence.Live // a copy of the liveness evidence only, unless it moves
		return live, live.Sweep(now, reads[live.HeardStream()], &in.rules)
	}
	held, ids := 0, []string(nil)
	for _, w := range in.reg.Snapshot().Workers() {
		if !w.Ready() {
			continue
		}
		_, sw := sweep(w)
		if sw.Held {
			held++
		}
		if sw.Changed() {
			ids = append(ids, w.ID)
		}
	}
	in.held.Set(float64(held))
	var ch changes
	_, err := in.reg.Update(func(txn *registry.Txn) error {
		ch = changes{}
		for _, id := range ids {
			w := txn.Get(id)
			if w == nil || !w.Ready() {
				continue
			}
			live, sw := sweep(w)
			if !sw.Changed() {
				continue
			}
			c := w.Clone()
			c.Evidence.Live = live
			if cl := in.cell(w.ID); cl != nil {
				if moved, _ := cl.takeOnto(w, c, &in.rules); moved {
					c.Evidence.Live.Sweep(now, reads[c.Evidence.Live.HeardStream()], &in.rules)
				}
			}
			txn.Insert(c)
			in.committed(w, c, &ch)
		}
		return nil
	})
	in.done(ch, err)
	snap := in.reg.Snapshot()
	var gone [][2]string
	in.mu.Lock()
	for id, url := range in.vetoed {
		if w := snap.Get(id); w == nil || w.Spec.GetUrl() != url || w.Liveness == smgv1.Veto_VETO_UNSPECIFIED {
			in.setVetoLocked(id, url, smgv1.Veto_VETO_UNSPECIFIED)
			gone = append(gone, [2]string{id, url})
		}
	}
	in.mu.Unlock()
	for _, g := range gone {
		in.logVeto(g[0], g[1], smgv1.Veto_VETO_UNSPECIFIED, "left Ready or removed")
	}
}

// HeldForReadLag is smg_liveness_held_for_read_lag_workers as the last
// sweep set it, read from the gauge alone (no gather of every metric).
func (in *Inbox) HeldForReadLag() float64 {
	var m dto.Metric
	if err := in.held.Write(&m); err != nil {
		return 0
	}
	return m.GetGauge().GetValue()
}

// setVetoLocked shows worker id's liveness veto (at url) in the metrics
// (in.mu held).
func (in *Inbox) setVetoLocked(id, url string, veto smgv1.Veto) {
	for _, v := range []smgv1.Veto{smgv1.Veto_VETO_UNREACHABLE, smgv1.Veto_VETO_WEDGED} {
		val := 0.0
		if veto == v {
			val = 1
		}
		in.stalled.WithLabelValues(url, verdictLabel(v)).Set(val)
	}
	if veto == smgv1.Veto_VETO_UNSPECIFIED {
		delete(in.vetoed, id)
		return
	}
	in.transitions.WithLabelValues(url, verdictLabel(veto)).Inc()
	in.vetoed[id] = url
}

// logVeto logs a liveness veto change of worker id to veto, and its cause.
func (in *Inbox) logVeto(id, url string, veto smgv1.Veto, cause string) {
	if veto != smgv1.Veto_VETO_UNSPECIFIED {
		in.log.Warn("Worker vetoed by liveness", "worker_id", id, "url", url, "reason", verdictLabel(veto), "cause", cause)
		return
	}
	in.log.Info("Worker re-admitted by liveness", "worker_id", id, "url", url, "cause", cause)
}

func verdictLabel(v smgv1.Veto) string {
	switch v {
	case smgv1.Veto_VETO_UNREACHABLE:
		return judge.Unreachable.String()
	case smgv1.Veto_VETO_WEDGED:
		return judge.Wedged.String()
	}
	return judge.Live.String()
}

// with moves one worker's evidence.
func (in *Inbox) with(workerID string, fn func(ev *registry.Evidence)) {
	_ = in.commit([]string{workerID}, func(_ int, w *registry.Worker) { fn(&w.Evidence) })
}

// Contact records contact that carries no load (an answered poll without a
// usable report, a passing probe, a heartbeat for the engine).
func (in *Inbox) Contact(workerID string, now time.Time) {
	in.with(workerID, func(ev *registry.Evidence) { ev.Live.Contact(now, &in.rules) })
}

// Failure records a failure on one of the worker's channels.
func (in *Inbox) Failure(workerID string, kind judge.FailureKind, now time.Time) {
	in.with(workerID, func(ev *registry.Evidence) { ev.Live.Failure(now, kind, &in.rules) })
}

// Record takes a load report's liveness side (pushed by an agent, or an
// answered poll). A pushed record of a Ready worker may wait for the flush
// (pend); any other is stored at once.
func (in *Inbox) Record(workerID string, rec judge.Record, now time.Time) {
	r := timedRecord{rec, now}
	if in.opts.Coalesce && rec.Pushed {
		if w := in.reg.Get(workerID); w != nil && w.Ready() {
			_ = in.pend(workerID, w, nil, nil, false, &r)
			return
		}
	}
	in.with(workerID, func(ev *registry.Evidence) { applyPushed(ev, r, &in.rules) })
}

// Observed is one agent record: its load (nil: none to judge) and its
// liveness side; Slot, when set, is WorkerID's (Inbox.Slot).
type Observed struct {
	WorkerID string
	Load     *smgv1.EngineLoad
	Rec      judge.Record
	Slot     *Slot
}

// Observe takes one agent record received at now: its load (ReportCopy: it
// stays the caller's), then its liveness record; the error is the load's.
func (in *Inbox) Observe(o *Observed, now time.Time) (err error) {
	if in.opts.Coalesce && o.Rec.Pushed && len(o.Load.GetRanks()) > 0 {
		// A Ready worker's load and pushed record: one lookup, one lock and
		// one run of the rule for both.
		c, w := o.Slot, (*registry.Worker)(nil)
		if c == nil {
			c = in.cell(o.WorkerID)
		}
		if c != nil {
			w = c.h.Get()
		} else {
			w = in.reg.Get(o.WorkerID)
		}
		if w != nil && w.Ready() {
			_ = in.pend(o.WorkerID, w, c, o.Load, true, &timedRecord{o.Rec, now})
			return nil
		}
	}
	if o.Load != nil {
		err = in.ReportCopy(o.WorkerID, o.Load)
	}
	in.Record(o.WorkerID, o.Rec, now)
	return err
}

// RecentlyPushed tells the poller to skip a worker whose agent delivered a
// record within the interval (the poll takes over when records stop).
func (in *Inbox) RecentlyPushed(workerID string, within time.Duration, now time.Time) bool {
	w := in.reg.Get(workerID)
	return w != nil && !w.Evidence.PushedAt.IsZero() && now.Sub(w.Evidence.PushedAt) < within
}

// StopPushed forgets when the worker's agent last pushed (its stream ended),
// so the poller takes over at once.
func (in *Inbox) StopPushed(workerID string) {
	in.with(workerID, func(ev *registry.Evidence) { ev.PushedAt = time.Time{} })
}

// PollTransportFailure: an HTTP worker's failed poll never arms the
// unreachable veto; a gRPC worker's (load poll or KV event stream) does.
func (in *Inbox) PollTransportFailure(workerID string, _ error, now time.Time) {
	kind := judge.HTTPPollFailed
	if w := in.reg.Get(workerID); w != nil && enginegrpc.IsGRPC(w.Spec.GetUrl()) {
		kind = judge.ConnectionFailure
	}
	in.Failure(workerID, kind, now)
}

// maxPromptTokens bounds one router's prompt tokens in flight on a worker
// (far above any engine's queue) so that the sum cannot overflow.
const maxPromptTokens = 1 << 40

// RouterObservations implements watch.ObservationSink: piles and progress
// are summed over routers, in one transaction for the report.
func (in *Inbox) RouterObservations(routerID string, rep *smgv1.RouterReport, now time.Time) {
	obs := rep.GetWorkers()
	ids := make([]string, len(obs))
	for i, o := range obs {
		ids[i] = o.GetWorkerId()
	}
	_ = in.commit(ids, func(i int, w *registry.Worker) {
		ev, o := &w.Evidence, obs[i]
		if o.GetContact() {
			// The answer's own time: the report may come after a failure
			// the answer preceded (an older router sends none: now).
			ev.Live.ContactAt(timeOr(o.GetLastContact(), now), now, &in.rules)
		}
		if o.GetConnectionFailures() > 0 {
			ev.Live.Failure(timeOr(o.GetLastFailure(), now), routerFailureKind(w), &in.rules)
		}
		ev.Live.SetPrefillRate(o.GetPrefillTokensPerSec())
		routers := make(map[string]judge.RouterObservation, len(ev.Routers)+1)
		maps.Copy(routers, ev.Routers)
		// A negative count would cancel the other routers' part of the sum, a
		// huge one overflow it.
		prefill := min(max(o.GetPromptTokensInFlight(), 0), maxPromptTokens)
		if old, ok := routers[routerID]; !ok || old.PrefillTokens != prefill {
			w.AheadRevision++
		}
		routers[routerID] = judge.RouterObservation{Streams: int64(o.GetStreamsInFlight()),
			LastProgress: timeOr(o.GetLastProgress(), time.Time{}), PrefillTokens: prefill}
		ev.Routers = routers
		before := ev.Live.PromptTokensAhead()
		ev.Live.Routers(now, sum(routers), &in.rules)
		if d := ev.Live.PromptTokensAhead() - before; (d >= AheadJumpTokens || d <= -AheadJumpTokens) && in.jumps.AllowN(now, 1) {
			w.AheadJump++
		}
	})
}

// timeOr is ts, or def when unset.
func timeOr(ts *timestamppb.Timestamp, def time.Time) time.Time {
	if ts == nil {
		return def
	}
	return ts.AsTime()
}

// routerFailureKind is what a router's failed connection to w is to the
// rules: a request to a gRPC worker rides its channel; the spec leaves
// HTTP workers to health checks and the circuit breaker.
func routerFailureKind(w *registry.Worker) judge.FailureKind {
	if w.Spec.GetConnectionMode() == "grpc" || strings.HasPrefix(w.Spec.GetUrl(), "grpc") {
		return judge.ConnectionFailure
	}
	return judge.HTTPRequestFailed
}

// RouterGone implements watch.ObservationSink: the router's piles no longer count.
func (in *Inbox) RouterGone(routerID string) {
	now := in.opts.Now()
	var ids []string
	for _, w := range in.reg.Snapshot().Workers() {
		if _, ok := w.Evidence.Routers[routerID]; ok {
			ids = append(ids, w.ID)
		}
	}
	_ = in.commit(ids, func(_ int, w *registry.Worker) {
		ev := &w.Evidence
		if _, ok := ev.Routers[routerID]; !ok {
			return
		}
		routers := maps.Clone(ev.Routers)
		delete(routers, routerID)
		ev.Routers = routers
		w.AheadRevision++
		ev.Live.Routers(now, sum(routers), &in.rules)
	})
}

// sum adds up the routers' piles and takes the latest progress.
func sum(routers map[string]judge.RouterObservation) judge.RouterObservation {
	var o judge.RouterObservation
	for _, v := range routers {
		o.Streams += v.Streams
		o.PrefillTokens += v.PrefillTokens
		if v.LastProgress.After(o.LastProgress) {
			o.LastProgress = v.LastProgress
		}
	}
	return o
}
