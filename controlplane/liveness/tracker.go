// Package liveness moves each worker's liveness evidence, stored with its
// registry record, inside the registry transaction that decides the
// unreachable and wedged vetoes from it (the spec's "When a Worker Dies
// or Loses Its Link", "When an Engine Freezes", "When a Worker Goes Silent
// Entirely"). The rules themselves are judge.Liveness; this package collects
// the evidence from every channel (agents, polls, health probes, routers),
// sums what routers see, runs the sweep, and stores each verdict change in
// the registry with a log line and metrics. No veto touches health.
//
// It owns the pending liveness records, the routers' sums and the sweep's
// schedule; the rules are judge's and the verdicts are committed by the
// registry.
package liveness

import (
	"context"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/enginegrpc"
)

// Tracker feeds liveness evidence to the registry and reports verdict changes.
// It keeps no evidence of its own: each worker's judge.Liveness is stored
// with its registry record and moved inside the write transaction that
// commits the verdict (the registry decides the veto from it), so the
// stored verdict is always what the judge makes of the stored evidence.
type Tracker struct {
	reg   *registry.Registry
	rules judge.Rules
	log   *slog.Logger
	now   func() time.Time

	stalled     *prometheus.GaugeVec
	transitions *prometheus.CounterVec
	held        prometheus.Gauge

	// streams are the open agent streams and how far each is read.
	streams streams

	// vetoed is the URL of each worker whose veto the metrics show; written
	// inside registry transactions (so in commit order) and by Sweep.
	mu     sync.Mutex
	vetoed map[string]string

	// With Coalesce, pushed records that leave the verdict as it is wait
	// in their worker's cell, in order, for the next flush (or the next
	// transaction that touches their worker), so a record costs a read,
	// not a commit.
	coalesce bool
	flush    func() // Options.Flush
	cells    cells
	// taken is what the running flush transaction took (Take), by worker
	// id, reused by the next: the registry runs its transactions one at a
	// time, and Take's apply is called only inside its own. A cell hands
	// its record buffer to the flush and gets one from spare, which the
	// next Take refills with the buffers this one took: a cell keeps one
	// buffer, not one for its pushers and one for the flush (at 10,000
	// workers half the tracker's heap, which every collection marks).
	taken map[string]int // index in takes
	takes []takenRecords
	spare [][]timedRecord
}

// takenRecords is one worker's records taken by a flush transaction, with
// the prediction's work: base and ev as the cell had them.
type takenRecords struct {
	base *registry.Worker
	ev   registry.Evidence
	recs []timedRecord
}

// timedRecord is a pushed record not yet stored.
type timedRecord struct {
	rec judge.Record
	at  time.Time
}

// DefaultFlushInterval bounds how long a coalesced record waits for its
// commit when the tracker flushes on its own (without Options.Flush).
const DefaultFlushInterval = 50 * time.Millisecond

// Options configure a Tracker.
type Options struct {
	Rules judge.LivenessConfig
	// Now is the clock (nil: time.Now).
	Now func() time.Time
	// Coalesce: a pushed record that leaves the verdict as it is is stored
	// by the next flush (Run, every DefaultFlushInterval) instead of in a
	// transaction of its own; one that changes it commits at once. Run
	// must then be running.
	Coalesce bool
	// Flush, when set with Coalesce, is another writer's flush that stores
	// the pending records (the ingester's, which stores them on the same
	// record as the loads: ingest.Options.Rider). Run calls it before every
	// sweep, every judge.SweepInterval, instead of flushing on its own.
	Flush func()
}

// New returns a tracker; metrics register on m.
func New(reg *registry.Registry, opts Options, log *slog.Logger, m prometheus.Registerer) *Tracker {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	t := &Tracker{
		reg: reg, rules: opts.Rules.Rules(), log: log, now: opts.Now, vetoed: map[string]string{},
		coalesce: opts.Coalesce, flush: opts.Flush, cells: newCells(),
		stalled: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "smg_worker_stalled",
			Help: "1 while the worker is excluded from routing by liveness, labeled with the reason (unreachable or wedged).",
		}, []string{"worker", "reason"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "smg_worker_stall_transitions_total",
			Help: "Times the worker was vetoed by liveness, by reason.",
		}, []string{"worker", "reason"}),
	}
	t.held = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "smg_liveness_held_for_read_lag_workers",
		Help: "Workers whose stale or engine-silence veto the last liveness sweep held off because the control plane is behind reading their agent's stream (the silence it has not read is not counted, up to --worker-stale-secs more).",
	})
	m.MustRegister(t.stalled, t.transitions, t.held)
	return t
}

// Run sweeps every judge.SweepInterval, and with Coalesce flushes pending
// records every DefaultFlushInterval (with Options.Flush, before every
// sweep), until ctx ends.
func (t *Tracker) Run(ctx context.Context) {
	tick := time.NewTicker(judge.SweepInterval)
	defer tick.Stop()
	var flush <-chan time.Time
	if t.coalesce && t.flush == nil {
		ft := time.NewTicker(DefaultFlushInterval)
		defer ft.Stop()
		flush = ft.C
	}
	for {
		select {
		case <-ctx.Done():
			t.Flush()
			return
		case <-tick.C:
			t.Sweep(t.now())
		case <-flush:
			t.Flush()
		}
	}
}

// Flush stores every pending record, in one transaction (Options.Flush's
// when set).
func (t *Tracker) Flush() {
	if t.flush != nil {
		t.flush()
		return
	}
	t.judgeAll(t.PendingIDs(nil), func(int, *registry.Worker) {})
}

// takePending appends id's pending records to into and removes them.
func (t *Tracker) takePending(id string, into []timedRecord) []timedRecord {
	if !t.coalesce {
		return into
	}
	if c := t.cells.get(id); c != nil {
		return c.takeInto(into)
	}
	return into
}

// predicted returns w's liveness evidence moved by its pending records
// (w is the stored record), and whether it has any.
func (t *Tracker) predicted(w *registry.Worker) (judge.Liveness, bool) {
	var c *cell
	if t.coalesce {
		c = t.cells.get(w.ID)
	}
	if c == nil {
		return w.Evidence.Live, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	p := &c.p
	if len(p.recs) == 0 {
		return w.Evidence.Live, false
	}
	if p.base == w {
		return p.w.Evidence.Live, true // the prediction's work, done already
	}
	ev := w.Evidence
	for _, r := range p.recs {
		t.applyPushed(&ev, r)
	}
	return ev.Live, true
}

// PendingIDs implements ingest.Rider: it appends the workers with records
// pending to ids, taking no lock that a pusher takes.
func (t *Tracker) PendingIDs(ids []string) []string {
	for _, c := range t.cells.list() {
		if c.has.Load() {
			ids = append(ids, c.id)
		}
	}
	return ids
}

// Take implements ingest.Rider: the ingester's flush stores the pending
// records of ids on the same record as the worker's load, in its
// transaction (so they go in order before any later transaction's).
func (t *Tracker) Take(ids []string) (apply func(w, c *registry.Worker) bool, stored func(*registry.Txn, *registry.Worker, *registry.Worker)) {
	for i := range t.takes { // the previous transaction's, done with
		if recs := t.takes[i].recs; cap(recs) <= maxKept && len(t.spare) < maxTaken {
			t.spare = append(t.spare, recs[:0])
		}
		t.takes[i] = takenRecords{}
	}
	if t.taken == nil || len(t.taken) > maxTaken {
		t.taken = make(map[string]int, len(ids))
		t.takes = nil
	}
	taken := t.taken
	clear(taken)
	t.takes = t.takes[:0]
	if t.coalesce {
		for _, id := range ids {
			c := t.cells.get(id)
			if c == nil {
				continue
			}
			var buf []timedRecord
			if n := len(t.spare); n > 0 {
				buf, t.spare[n-1] = t.spare[n-1], nil
				t.spare = t.spare[:n-1]
			}
			if tk, ok := c.take(buf); ok {
				taken[id] = len(t.takes)
				t.takes = append(t.takes, tk)
			} else if buf != nil {
				t.spare = append(t.spare, buf)
			}
		}
	}
	takes := t.takes
	apply = func(w, c *registry.Worker) bool {
		i, ok := taken[c.ID]
		if !ok || !c.Ready() {
			return false // the rules judge Ready workers only
		}
		tk := &takes[i]
		if tk.base == w {
			// tk.ev is w's evidence moved by every record already (the
			// prediction's work): the records touch these two fields.
			c.Evidence.Live, c.Evidence.PushedAt = tk.ev.Live, tk.ev.PushedAt
		} else {
			for _, r := range tk.recs {
				t.applyPushed(&c.Evidence, r)
			}
		}
		return true
	}
	stored = func(_ *registry.Txn, w, c *registry.Worker) {
		if c.Liveness != w.Liveness { // rare: the records were predicted to leave it
			t.report(t.committed(w, c, nil), nil)
		}
	}
	return apply, stored
}

// applyPushed moves ev by one pushed record.
func (t *Tracker) applyPushed(ev *registry.Evidence, r timedRecord) {
	if r.rec.Pushed {
		ev.PushedAt = r.at
	}
	ev.Live.Record(r.at, r.rec, &t.rules)
}

// Sweep re-judges every Ready worker at now, in one transaction, and clears
// the metrics of vetoed workers that left Ready or were removed (the
// registry dropped their evidence and veto as they went). Pending records,
// older than the sweep, go first: Options.Flush stores them with the loads,
// and those that came since are judged with the stored evidence, stored
// only when the verdict moves (else they wait for the next flush: a fleet
// reporting 20 times a second has records pending for most workers by the
// time the flush is done, and storing them would write each twice). Each
// worker is judged with how far its agent's stream is read.
func (t *Tracker) Sweep(now time.Time) {
	var changes []change
	recs := make([]timedRecord, 0, 8) // made outside the transaction
	if t.flush != nil {
		t.flush()
	}
	reads := t.readStates(now)
	held := 0
	_, err := t.reg.Update(func(txn *registry.Txn) error {
		changes, held = changes[:0], 0
		for _, w := range txn.Workers() {
			if !w.Ready() {
				continue
			}
			// A copy of the liveness evidence only, unless it moves.
			live, pending := t.predicted(w)
			ch := live.Sweep(now, reads[live.HeardStream()], &t.rules)
			if ch.Held {
				held++
			}
			if !ch.Changed() && (!pending || sameStatus(&live, &w.Evidence.Live)) {
				continue
			}
			c := w.Clone()
			if !pending {
				c.Evidence.Live = live
				changes = t.commit(txn, w, c, changes)
				continue
			}
			// The records go first, stored with the verdict they move
			// (with any that pended since the prediction).
			recs = t.takePending(w.ID, recs[:0])
			for _, r := range recs {
				t.applyPushed(&c.Evidence, r)
			}
			c.Evidence.Live.Sweep(now, reads[c.Evidence.Live.HeardStream()], &t.rules)
			changes = t.commit(txn, w, c, changes)
		}
		return nil
	})
	if err == nil {
		t.held.Set(float64(held))
	}
	t.report(changes, err)
	t.prune()
	snap := t.reg.Snapshot()
	t.mu.Lock()
	var gone []change
	for id, url := range t.vetoed {
		if w := snap.Get(id); w == nil || w.Spec.GetUrl() != url || w.Liveness == smgv1.Veto_VETO_UNSPECIFIED {
			t.setGauges(url, smgv1.Veto_VETO_UNSPECIFIED)
			delete(t.vetoed, id)
			gone = append(gone, change{id: id, url: url, to: smgv1.Veto_VETO_UNSPECIFIED, dropped: true})
		}
	}
	t.mu.Unlock()
	t.report(gone, nil)
}

// prune drops the cells of workers removed or out of Ready, with their
// records.
func (t *Tracker) prune() {
	t.cells.prune(func(id string) bool { return t.pendable(id) != nil })
}

// sameStatus reports whether a and b hold the same verdict for the same
// cause (what routers and the admin API see of them).
func sameStatus(a, b *judge.Liveness) bool {
	va, ca := a.Status()
	vb, cb := b.Status()
	return va == vb && ca == cb
}

// change is a committed liveness veto change, to log.
type change struct {
	id, url  string
	from, to smgv1.Veto
	cause    string
	dropped  bool // left Ready or removed
}

// judgeAll moves the evidence of each Ready worker in ids with fn and
// commits, in one transaction; the registry decides the verdicts. The
// workers' pending records, older than fn's evidence, go first.
func (t *Tracker) judgeAll(ids []string, fn func(i int, w *registry.Worker)) {
	if len(ids) == 0 {
		return // an empty router report: no transaction (1,000 routers send 4,000 a second)
	}
	var changes []change
	recs := make([]timedRecord, 0, 8) // made outside the transaction
	_, err := t.reg.Update(func(txn *registry.Txn) error {
		changes = changes[:0]
		for i, id := range ids {
			w := txn.Get(id)
			if w == nil {
				continue
			}
			// Taken inside the transaction, as every taker does: the
			// registry runs one at a time, so a worker's records are
			// stored in the order they were pushed, whoever takes them.
			recs = t.takePending(id, recs[:0])
			if !w.Ready() {
				continue // the rules judge Ready workers only
			}
			c := w.Clone()
			for _, r := range recs {
				t.applyPushed(&c.Evidence, r)
			}
			fn(i, c)
			changes = t.commit(txn, w, c, changes)
		}
		return nil
	})
	t.report(changes, err)
}

// with moves one worker's evidence.
func (t *Tracker) with(workerID string, fn func(ev *registry.Evidence)) {
	t.judgeAll([]string{workerID}, func(_ int, w *registry.Worker) { fn(&w.Evidence) })
}

// commit inserts c (w moved on) and, when the veto changed, updates the
// metrics at once, so they follow the commit order.
func (t *Tracker) commit(txn *registry.Txn, w, c *registry.Worker, changes []change) []change {
	txn.Insert(c)
	return t.committed(w, c, changes)
}

// committed updates the metrics after the insert of c (w moved on) when the
// veto changed, and returns the change to log.
func (t *Tracker) committed(w, c *registry.Worker, changes []change) []change {
	if c.Liveness == w.Liveness {
		return changes
	}
	url := c.Spec.GetUrl()
	t.mu.Lock()
	t.setGauges(url, c.Liveness)
	if c.Liveness != smgv1.Veto_VETO_UNSPECIFIED {
		t.transitions.WithLabelValues(url, verdictLabel(c.Liveness)).Inc()
		t.vetoed[c.ID] = url
	} else {
		delete(t.vetoed, c.ID)
	}
	t.mu.Unlock()
	_, cause := c.Evidence.Live.Status()
	return append(changes, change{id: c.ID, url: url, from: w.Liveness, to: c.Liveness, cause: cause.String()})
}

func (t *Tracker) setGauges(url string, veto smgv1.Veto) {
	for _, v := range []smgv1.Veto{smgv1.Veto_VETO_UNREACHABLE, smgv1.Veto_VETO_WEDGED} {
		val := 0.0
		if veto == v {
			val = 1
		}
		t.stalled.WithLabelValues(url, verdictLabel(v)).Set(val)
	}
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

// report logs committed changes; a failed commit is logged too.
func (t *Tracker) report(changes []change, err error) {
	if err != nil {
		t.log.Error("Liveness evidence not stored", "error", err)
		return
	}
	for _, ch := range changes {
		switch {
		case ch.to != smgv1.Veto_VETO_UNSPECIFIED:
			t.log.Warn("Worker vetoed by liveness", "worker_id", ch.id, "url", ch.url, "reason", verdictLabel(ch.to), "cause", ch.cause)
		case ch.dropped:
			t.log.Info("Worker re-admitted by liveness", "worker_id", ch.id, "url", ch.url, "cause", "left Ready or removed")
		default:
			t.log.Info("Worker re-admitted by liveness", "worker_id", ch.id, "url", ch.url, "cause", ch.cause)
		}
	}
}

// Contact records contact that carries no load (an answered poll without a
// usable report, a passing probe, a heartbeat for the engine).
func (t *Tracker) Contact(workerID string, now time.Time) {
	t.with(workerID, func(ev *registry.Evidence) { ev.Live.Contact(now, &t.rules) })
}

// Failure records a failure on one of the worker's channels.
func (t *Tracker) Failure(workerID string, kind judge.FailureKind, now time.Time) {
	t.with(workerID, func(ev *registry.Evidence) { ev.Live.Failure(now, kind, &t.rules) })
}

// Record ingests a load report's liveness side (pushed by an agent, or an
// answered poll).
func (t *Tracker) Record(workerID string, rec judge.Record, now time.Time) {
	if t.coalesce && t.pend(workerID, rec, now) {
		return
	}
	t.with(workerID, func(ev *registry.Evidence) { t.applyPushed(ev, timedRecord{rec, now}) })
}

// Pushed is one record of a batch (RecordAll).
type Pushed struct {
	WorkerID string
	Rec      judge.Record
}

// RecordAll is Record of each record in order, all received at now (one
// agent message). A record that must commit does so in its place, before
// the next is tried.
func (t *Tracker) RecordAll(recs []Pushed, now time.Time) {
	for i := range recs {
		t.Record(recs[i].WorkerID, recs[i].Rec, now)
	}
}

// pend keeps a pushed record for the next flush when, applied after the
// worker's pending ones, it leaves the stored verdict as it is (a
// prediction: the registry decides again at the flush). It reports false
// when the record must commit at once. It locks the worker's cell alone.
func (t *Tracker) pend(workerID string, rec judge.Record, now time.Time) bool {
	if !rec.Pushed {
		return false
	}
	for {
		c := t.cells.get(workerID)
		if c == nil {
			if t.pendable(workerID) == nil {
				return false // no cell for an unknown or unready worker
			}
			c = t.cells.add(workerID)
		}
		c.mu.Lock()
		if c.gone { // pruned since we found it
			c.mu.Unlock()
			continue
		}
		// The stored record read under the cell's lock, as the sweep's
		// prune asks it.
		ok := t.pendLocked(c, t.pendable(workerID), rec, now)
		c.mu.Unlock()
		return ok
	}
}

// pendable returns the stored record of workerID if it is Ready.
func (t *Tracker) pendable(workerID string) *registry.Worker {
	if w := t.reg.Get(workerID); w != nil && w.Ready() {
		return w
	}
	return nil
}

// pendLocked is pend with c.mu held, w the worker's stored record as
// pendable returned it (nil: the record must commit).
func (t *Tracker) pendLocked(c *cell, w *registry.Worker, rec judge.Record, now time.Time) bool {
	if w == nil {
		return false
	}
	p := &c.p
	if p.base != w {
		// p.w is the stored record with the pending records applied: made
		// again when that changed (a flush or any commit of the worker),
		// and moved in place by each record that pends (a copy per record
		// costs more than the rule).
		p.w = *w
		for _, r := range p.recs {
			t.applyPushed(&p.w.Evidence, r)
		}
		p.base = w
	}
	r := timedRecord{rec, now}
	t.applyPushed(&p.w.Evidence, r)
	if !registry.Stands(w, &p.w) {
		p.base = nil // p.w holds a record p.recs does not: made again if p stays
		return false
	}
	p.recs = append(p.recs, r)
	c.has.Store(true)
	return true
}

// maxTaken bounds the room Take keeps for the next flush's chunk.
const maxTaken = 4096

// RecentlyPushed tells the poller to skip a worker whose agent delivered a
// record within the interval (the poll takes over when records stop).
func (t *Tracker) RecentlyPushed(workerID string, within time.Duration, now time.Time) bool {
	w := t.reg.Get(workerID)
	return w != nil && !w.Evidence.PushedAt.IsZero() && now.Sub(w.Evidence.PushedAt) < within
}

// StopPushed forgets when the worker's agent last pushed (its stream ended),
// so the poller takes over at once.
func (t *Tracker) StopPushed(workerID string) {
	t.with(workerID, func(ev *registry.Evidence) { ev.PushedAt = time.Time{} })
}

// PollAnswered implements monitor.Observer.
func (t *Tracker) PollAnswered(workerID string, now time.Time) { t.Contact(workerID, now) }

// PollReport implements monitor.Observer: an answered poll is contact and
// shows the waiting queue, and whether the engine runs anything.
func (t *Tracker) PollReport(workerID string, waiting, running int64, now time.Time) {
	t.Record(workerID, judge.Record{Waiting: waiting, Idle: running == 0}, now)
}

// PollTransportFailure implements monitor.Observer: an HTTP worker's failed
// poll never arms the unreachable veto; a gRPC worker's (its load poll or
// its KV event stream) does, with the stall rule.
func (t *Tracker) PollTransportFailure(workerID string, _ error, now time.Time) {
	kind := judge.HTTPPollFailed
	if w := t.reg.Get(workerID); w != nil && enginegrpc.IsGRPC(w.Spec.GetUrl()) {
		kind = judge.ConnectionFailure
	}
	t.Failure(workerID, kind, now)
}

// PushedRecord implements monitor.Observer: a load record a gRPC worker's
// KV event stream carried.
func (t *Tracker) PushedRecord(workerID string, rec judge.Record, now time.Time) {
	rec.Pushed = true
	t.Record(workerID, rec, now)
}

// HealthPassed implements health.ContactSink.
func (t *Tracker) HealthPassed(workerID string, now time.Time) { t.Contact(workerID, now) }

// RouterObservations implements watch.ObservationSink: piles and progress
// are summed over routers. One transaction covers the whole report.
func (t *Tracker) RouterObservations(routerID string, rep *smgv1.RouterReport, now time.Time) {
	obs := rep.GetWorkers()
	ids := make([]string, len(obs))
	for i, o := range obs {
		ids[i] = o.GetWorkerId()
	}
	t.judgeAll(ids, func(i int, w *registry.Worker) {
		ev, o := &w.Evidence, obs[i]
		var lastProgress time.Time
		if o.GetLastProgress() != nil {
			lastProgress = o.GetLastProgress().AsTime()
		}
		if o.GetContact() {
			ev.Live.Contact(now, &t.rules)
		}
		if o.GetConnectionFailures() > 0 {
			at := now
			if o.GetLastFailure() != nil {
				at = o.GetLastFailure().AsTime()
			}
			ev.Live.Failure(at, routerFailureKind(w), &t.rules)
		}
		ev.Live.SetPrefillRate(o.GetPrefillTokensPerSec())
		routers := make(map[string]registry.RouterView, len(ev.Routers)+1)
		maps.Copy(routers, ev.Routers)
		routers[routerID] = registry.RouterView{Streams: int64(o.GetStreamsInFlight()), LastProgress: lastProgress, PrefillTokens: o.GetPromptTokensInFlight()}
		ev.Routers = routers
		ev.Live.Routers(now, sum(routers), &t.rules)
	})
}

// routerFailureKind is what a router's failed upstream connection to w is to
// the rules. A router's request to a gRPC worker rides the worker's channel;
// one to an HTTP worker is neither of its channels (the load poll, the KV
// event stream): the spec leaves HTTP workers to health checks and the
// circuit breaker.
func routerFailureKind(w *registry.Worker) judge.FailureKind {
	if w.Spec.GetConnectionMode() == "grpc" || strings.HasPrefix(w.Spec.GetUrl(), "grpc") {
		return judge.ConnectionFailure
	}
	return judge.HTTPRequestFailed
}

// RouterGone implements watch.ObservationSink: the router's piles no longer count.
func (t *Tracker) RouterGone(routerID string) {
	now := t.now()
	var ids []string
	for _, w := range t.reg.Snapshot().Workers() {
		if _, ok := w.Evidence.Routers[routerID]; ok {
			ids = append(ids, w.ID)
		}
	}
	t.judgeAll(ids, func(_ int, w *registry.Worker) {
		ev := &w.Evidence
		if _, ok := ev.Routers[routerID]; !ok {
			return
		}
		routers := maps.Clone(ev.Routers)
		delete(routers, routerID)
		ev.Routers = routers
		ev.Live.Routers(now, sum(routers), &t.rules)
	})
}

// sum adds up the routers' piles and takes the latest progress.
func sum(routers map[string]registry.RouterView) judge.RouterObservation {
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
