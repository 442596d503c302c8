// Package ingest stores load reports in the registry, which decides the
// overload verdict against the worker's own thresholds in the transaction
// that stores the report (the spec's "Polling" and "When a Worker Does Not
// Report"; see docs/verdicts.md). Nothing here runs per request.
//
// With coalescing on (Options.Coalesce), a report that leaves the verdict as it is
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
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// ErrUnknownWorker is returned for a report about a worker not registered.
var ErrUnknownWorker = errors.New("unknown worker")

// Ingester stores reports; the registry decides the overload verdict from
// them in the transaction that stores them.
type Ingester struct {
	reg  *registry.Registry
	log  *slog.Logger
	opts Options

	mu      sync.Mutex                   // orders reports, flushes and no-reports
	pending map[string]*smgv1.EngineLoad // by worker id, latest wins
	// flushing is what the running Flush took from pending and has not
	// stored yet; a newer report or no-report of a worker drops its entry.
	flushing map[string]*smgv1.EngineLoad
	// refresh holds workers whose engine answered its poll with the load
	// already stored (Refresh); bumping has the running Flush's share.
	refresh, bumping map[string]struct{}
	// inflight is what the running flush transaction stores, by worker
	// id: the transaction runs without mu, so reports go on meanwhile,
	// and a report, no-report or rebuild that commits at once marks the
	// entry superseded (under mu, before it commits: the transaction,
	// holding the registry's lock, reads the mark before that commit).
	inflight map[string]*chunkLoad

	fmu   sync.Mutex  // one Flush at a time
	chunk []chunkLoad // the running flush's transaction (fmu held)
	ids   []string    // the running flush's workers (fmu held)
	// records are fresh records for the next flush transaction to clone
	// into (fmu held), and fresh is loads for reports to copy into (mu
	// held): both made by the flush outside every lock, none ever stored
	// before it is used. A flush runs during the collector's mark phases,
	// which charge allocations to whoever makes them, as assists: made
	// inside the registry's transaction, they would hold up a flip waiting
	// for it; made by a report under mu, every agent stream behind it.
	records []*registry.Worker
	fresh   []*smgv1.EngineLoad
	made    []*smgv1.EngineLoad // fresh loads on their way to fresh (fmu held)

	// betweenChunks, for tests, runs between a flush's transactions.
	betweenChunks func()
}

// chunkSize is how many workers one flush transaction stores: a report
// that flips a verdict waits for at most one chunk (a few milliseconds),
// not for a flush of the whole fleet.
const chunkSize = 1024

// Options configure an Ingester.
type Options struct {
	// Coalesce: a report that leaves the verdict as it is waits for Flush
	// (Run must then flush); otherwise every report commits at once.
	Coalesce bool
	// Rider, when set, has evidence of its own pending (the liveness
	// tracker's coalesced records) that Flush stores in the same
	// transaction and on the same record as the worker's load, so a flush
	// clones and writes each worker once.
	Rider Rider
}

// Rider is evidence pending elsewhere that a flush stores with the loads.
type Rider interface {
	// PendingIDs appends the workers with evidence pending now to ids.
	PendingIDs(ids []string) []string
	// Take moves out the pending evidence of ids; Flush calls it inside
	// the transaction that stores it. apply moves c (a clone of w about to
	// be inserted) by c.ID's evidence and reports whether it changed c;
	// stored follows the insert of c, which replaced w.
	Take(ids []string) (apply func(w, c *registry.Worker) bool, stored func(t *registry.Txn, w, c *registry.Worker))
}

// New returns an Ingester writing to reg.
func New(reg *registry.Registry, opts Options, log *slog.Logger) *Ingester {
	return &Ingester{reg: reg, opts: opts, log: log, pending: map[string]*smgv1.EngineLoad{}, flushing: map[string]*smgv1.EngineLoad{},
		refresh: map[string]struct{}{}, bumping: map[string]struct{}{}, inflight: map[string]*chunkLoad{}}
}

// DefaultFlushInterval bounds how long a load-only update waits for its
// commit: the liveness sweep's interval, before which the control plane
// flushes. Routers receive loads on their own grid (--watch-load-interval,
// 1 s by default) and a flip commits at once, so the flush only has to be
// within that grid: a worker reporting 20 times a second is written once
// per 5 reports.
const DefaultFlushInterval = judge.SweepInterval

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

// Flush commits every pending load, with the Rider's pending evidence:
// each worker is cloned and inserted once, in transactions of chunkSize
// workers, so that a report that flips a verdict never waits for more than
// one of them. A load that a newer report or no-report replaced while the
// flush ran is not stored. The registry decides each verdict again from
// what it stores, so a verdict that the world moved under (thresholds,
// health) is right at the flush.
func (in *Ingester) Flush() {
	in.fmu.Lock()
	defer in.fmu.Unlock()
	in.mu.Lock()
	in.flushing, in.pending = in.pending, in.flushing // flushing is empty between flushes
	in.bumping, in.refresh = in.refresh, in.bumping   // so is bumping
	ids := in.ids[:0]
	for id := range in.flushing {
		ids = append(ids, id)
	}
	for id := range in.bumping {
		if _, dup := in.flushing[id]; !dup {
			ids = append(ids, id)
		}
	}
	if in.opts.Rider != nil {
		n := len(ids)
		ids = in.opts.Rider.PendingIDs(ids)
		rest := slices.DeleteFunc(ids[n:], func(id string) bool {
			_, dup := in.flushing[id]
			_, bump := in.bumping[id]
			return dup || bump
		})
		ids = ids[:n+len(rest)]
	}
	in.mu.Unlock()
	// In key order, each transaction writes one stretch of the id index's
	// radix tree: the inner nodes a chunk copies are its own, not copied
	// again by every chunk as map order would have it.
	slices.Sort(ids)
	for start := 0; start < len(ids); start += chunkSize {
		if start > 0 && in.betweenChunks != nil {
			in.betweenChunks()
		}
		in.storeChunk(ids[start:min(start+chunkSize, len(ids))])
	}
	in.mu.Lock()
	clear(in.flushing)
	clear(in.bumping)
	in.mu.Unlock()
	clear(ids)
	in.ids = ids[:0]
}

// chunkLoad is what a flush transaction stores for one worker besides the
// Rider's evidence.
type chunkLoad struct {
	id   string
	load *smgv1.EngineLoad // nil: none
	bump bool              // Refresh: move the load revision
	// superseded: a newer report, no-report or rebuild commits (set under
	// mu before it does, read by the transaction): neither is stored.
	superseded atomic.Bool
}

// supersede marks what the running flush transaction holds of id as
// replaced by something newer (mu held).
func (in *Ingester) supersede(id string) {
	delete(in.flushing, id)
	if e := in.inflight[id]; e != nil {
		e.superseded.Store(true)
	}
}

// storeChunk stores the pending load and the Rider's evidence of ids in one
// transaction. It holds mu only to take the loads and to let go of them, not
// while the transaction runs: a fleet's reports go on (pending, or waiting
// for the registry when they flip a verdict) instead of stopping behind it.
func (in *Ingester) storeChunk(ids []string) {
	if cap(in.chunk) < len(ids) {
		in.chunk = make([]chunkLoad, chunkSize)
	}
	ents := in.chunk[:len(ids)]
	in.mu.Lock()
	for i, id := range ids {
		e := &ents[i]
		e.id, e.load = id, in.flushing[id]
		_, e.bump = in.bumping[id]
		e.superseded.Store(false)
		delete(in.flushing, id)
		delete(in.bumping, id)
		in.inflight[id] = e
	}
	room := maxFresh - len(in.fresh) // only reports take from it meanwhile
	in.mu.Unlock()
	for len(in.records) < len(ents) {
		in.records = append(in.records, new(registry.Worker))
	}
	used := 0 // records stored
	var flips []flip
	_, err := in.reg.Update(func(t *registry.Txn) error {
		flips = flips[:0]
		used = 0
		apply := func(_, _ *registry.Worker) bool { return false }
		stored := func(*registry.Txn, *registry.Worker, *registry.Worker) {}
		if in.opts.Rider != nil {
			apply, stored = in.opts.Rider.Take(ids)
		}
		for i := range ents {
			e := &ents[i]
			w := t.Get(e.id)
			if w == nil {
				continue
			}
			c := w.CloneInto(in.records[used])
			newer := e.superseded.Load()
			hasLoad := e.load != nil && !newer
			bump := e.bump && !newer && !hasLoad && refreshable(w)
			switch {
			case hasLoad:
				setLoad(c, e.load)
			case bump:
				c.LoadRevision++
			}
			if !apply(w, c) && !hasLoad && !bump {
				continue
			}
			t.Insert(c)
			used++
			stored(t, w, c)
			if f := flipOf(w, c); f.flipped {
				flips = append(flips, f)
			}
		}
		return nil
	})
	// The records stored are the registry's now; the loads stored are
	// replaced by as many fresh ones for the reports to come (a worker's
	// next pending load).
	loads := 0
	for i := range ents {
		if ents[i].load != nil {
			loads++
		}
	}
	n := copy(in.records, in.records[used:])
	clear(in.records[n:])
	in.records = in.records[:n]
	for range min(loads, room) {
		in.made = append(in.made, newLoad())
	}
	in.mu.Lock()
	in.fresh = append(in.fresh, in.made...)
	clear(in.made)
	in.made = in.made[:0]
	for i := range ents {
		delete(in.inflight, ents[i].id)
		ents[i].load = nil
	}
	// A report that came while the transaction ran was judged against
	// the record before it; where the transaction flipped the verdict
	// (the world moved since its load was judged), a newer pending load
	// may flip it back: it commits now, as it would have at once.
	var again []flip
	for _, f := range flips {
		if p := in.pending[f.workerID]; p != nil && !in.stands(f.workerID, p) {
			delete(in.pending, f.workerID)
			if g, err := in.commit(f.workerID, p); err == nil {
				again = append(again, g)
			}
		}
	}
	in.mu.Unlock()
	in.done(err, "flush", "")
	for _, f := range append(flips, again...) {
		in.logFlip(f)
	}
}

// maxFresh bounds the fresh loads kept for reports: a flush's worth.
const maxFresh = 1 << 14

// freshLoad returns a load no one holds, to copy a report into (mu held).
func (in *Ingester) freshLoad() *smgv1.EngineLoad {
	if n := len(in.fresh); n > 0 {
		l := in.fresh[n-1]
		in.fresh[n-1] = nil
		in.fresh = in.fresh[:n-1]
		return l
	}
	return newLoad()
}

// stands reports whether load (its signals set) leaves id's stored verdict
// as it is, a prediction only: the registry decides again when it stores
// it. An unknown worker's does not stand.
func (in *Ingester) stands(id string, load *smgv1.EngineLoad) bool {
	w := in.reg.Get(id)
	if w == nil {
		return false
	}
	over, _ := judge.Check(int64(load.GetWaitingRequests()), load.GetTokenUsage(), w.Thresholds)
	return (over && w.Ready()) == w.Overloaded && !w.Evidence.NoReport
}

// commit stores load (its signals set) for id in a transaction of its own.
func (in *Ingester) commit(id string, load *smgv1.EngineLoad) (flip, error) {
	var f flip
	_, err := in.reg.Update(func(t *registry.Txn) error {
		var err error
		f, err = store(t, id, load)
		return err
	})
	return f, err
}

// Report ingests one load report for a worker and takes ownership of load. A
// nil or empty report is "no report": the veto clears (fail open) and the last
// load stays visible. The signals are computed from the ranks (waiting summed,
// token usage averaged), whatever aggregates the sender filled in. Only Ready
// workers get a veto (the registry's rule).
func (in *Ingester) Report(workerID string, load *smgv1.EngineLoad) error {
	return in.report(workerID, load, false)
}

// ReportCopy is Report of a copy of load, which stays the caller's (an agent
// stream decodes into memory it reuses). The copy reuses the memory of the
// worker's pending load when it has one, so a worker reporting several
// times per flush allocates once per flush, not once per report.
func (in *Ingester) ReportCopy(workerID string, load *smgv1.EngineLoad) error {
	return in.report(workerID, load, true)
}

// Reported is one load report of a batch (ReportCopies).
type Reported struct {
	WorkerID string
	Load     *smgv1.EngineLoad
}

// ReportCopies is ReportCopy of each report in order, under one hold of the
// ingester's lock: an agent's message carries many records, and a lock taken
// per record is one that every agent stream contends for. failed, when set,
// hears each report's error (as ReportCopy would return it).
func (in *Ingester) ReportCopies(reps []Reported, failed func(i int, err error)) {
	in.mu.Lock()
	defer in.mu.Unlock()
	for i, r := range reps {
		if err := in.reportLocked(r.WorkerID, r.Load, true); err != nil && failed != nil {
			failed(i, err)
		}
	}
}

func (in *Ingester) report(workerID string, load *smgv1.EngineLoad, copied bool) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.reportLocked(workerID, load, copied)
}

// reportLocked is report with in.mu held.
func (in *Ingester) reportLocked(workerID string, load *smgv1.EngineLoad, copied bool) error {
	if load == nil || len(load.GetRanks()) == 0 {
		return in.noReportLocked(workerID)
	}
	waiting, usage := Signals(load.GetRanks())
	if in.opts.Coalesce {
		w := in.reg.Get(workerID)
		if w == nil {
			return ErrUnknownWorker
		}
		// A prediction only: the registry decides again at the flush.
		over, _ := judge.Check(waiting, usage, w.Thresholds)
		if (over && w.Ready()) == w.Overloaded && !w.Evidence.NoReport {
			if copied {
				if p := in.pending[workerID]; p != nil {
					setSignals(CopyLoad(p, load), waiting, usage) // the pending load is ours alone
					return nil
				}
				load = CopyLoad(in.freshLoad(), load)
			}
			setSignals(load, waiting, usage)
			in.pending[workerID] = load // the verdict stands: commit with the next flush
			return nil
		}
		if p := in.pending[workerID]; p != nil && copied {
			load = CopyLoad(p, load) // stored below: no longer pending
			copied = false
		}
		delete(in.pending, workerID) // this report is newer
	}
	// Committed now: a load that a flush holds is older and must not be
	// stored after it (a pending report leaves it be: it is stored after).
	in.supersede(workerID)
	if copied {
		load = CopyLoad(in.freshLoad(), load)
	}
	setSignals(load, waiting, usage)
	f, err := in.commit(workerID, load)
	if err != nil {
		return err
	}
	in.logFlip(f)
	return nil
}

// setSignals writes the signals computed from load's ranks over the
// aggregates its sender filled in.
func setSignals(load *smgv1.EngineLoad, waiting int64, usage float64) {
	load.WaitingRequests, load.TokenUsage = int32(min(waiting, math.MaxInt32)), usage
}

// loadBlock is a copied load with room for one rank and its timestamp: one
// allocation for the common load.
type loadBlock struct {
	load  smgv1.EngineLoad
	ranks [1]*smgv1.RankLoad
	rank  smgv1.RankLoad
	at    timestamppb.Timestamp
}

// newLoad returns an empty load with room for one rank and a timestamp, in
// one allocation.
func newLoad() *smgv1.EngineLoad {
	blk := &loadBlock{}
	blk.ranks[0] = &blk.rank
	blk.load.Ranks = blk.ranks[:0]
	blk.load.ReportedAt = &blk.at
	return &blk.load
}

// CopyLoad copies every field of src into dst, reusing dst's ranks and
// timestamp (dst must be the caller's alone), or into a new load when dst
// is nil, and returns it. Unknown fields are not copied.
func CopyLoad(dst, src *smgv1.EngineLoad) *smgv1.EngineLoad {
	if dst == nil {
		dst = newLoad()
	}
	dst.Source = src.GetSource()
	dst.WaitingRequests, dst.RunningRequests = src.GetWaitingRequests(), src.GetRunningRequests()
	dst.TokenUsage, dst.MaxRunningRequests = src.GetTokenUsage(), src.GetMaxRunningRequests()
	if at := src.GetReportedAt(); at != nil {
		if dst.ReportedAt == nil {
			dst.ReportedAt = &timestamppb.Timestamp{}
		}
		dst.ReportedAt.Seconds, dst.ReportedAt.Nanos = at.GetSeconds(), at.GetNanos()
	} else {
		dst.ReportedAt = nil
	}
	ranks := dst.Ranks[:0]
	for i, s := range src.GetRanks() {
		var r *smgv1.RankLoad
		if i < cap(ranks) && ranks[:i+1][i] != nil {
			r = ranks[:i+1][i]
		} else {
			r = &smgv1.RankLoad{}
		}
		r.DpRank, r.WaitingRequests, r.RunningRequests = s.GetDpRank(), s.GetWaitingRequests(), s.GetRunningRequests()
		r.TokenUsage, r.GenThroughput, r.CacheHitRate = s.GetTokenUsage(), s.GetGenThroughput(), s.GetCacheHitRate()
		r.MaxRunningRequests = s.GetMaxRunningRequests()
		ranks = append(ranks, r)
	}
	dst.Ranks = ranks
	return dst
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

// store stores one report in t; the registry decides the verdict.
func store(t *registry.Txn, workerID string, load *smgv1.EngineLoad) (flip, error) {
	w := t.Get(workerID)
	if w == nil {
		return flip{}, ErrUnknownWorker
	}
	c := w.Clone()
	setLoad(c, load)
	t.Insert(c)
	return flipOf(w, c), nil
}

// setLoad stores a report on c, a clone.
func setLoad(c *registry.Worker, load *smgv1.EngineLoad) {
	c.Load = load
	c.LoadRevision++
	c.Evidence.NoReport = false
}

// flipOf describes the overload verdict change from w to c.
func flipOf(w, c *registry.Worker) flip {
	if w.Overloaded == c.Overloaded {
		return flip{}
	}
	f := flip{flipped: true, over: c.Overloaded, noReport: c.Evidence.NoReport, workerID: c.ID, model: c.Model}
	_, f.reason = judge.Check(int64(c.Load.GetWaitingRequests()), c.Load.GetTokenUsage(), c.Thresholds)
	return f
}

// markNoReport is "no report" in t: the overload veto clears (fail open).
func markNoReport(t *registry.Txn, workerID string) (flip, error) {
	w := t.Get(workerID)
	if w == nil {
		return flip{}, ErrUnknownWorker
	}
	if w.Evidence.NoReport {
		return flip{}, nil
	}
	c := w.Clone()
	c.Evidence.NoReport = true
	t.Insert(c)
	return flipOf(w, c), nil
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

// done logs a registry write that failed for a reason other than an unknown
// worker (which callers are told about).
func (in *Ingester) done(err error, what, workerID string) {
	if err != nil && !errors.Is(err, ErrUnknownWorker) {
		in.log.Error("Load report not stored", "what", what, "worker_id", workerID, "error", err)
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

// Refresh records a poll whose engine answered with the load already stored
// (an agent sends a load only when it changes, and says "contact" when it
// did not): the worker's LoadRevision moves, with its load as it is, at the
// next flush (at once without Coalesce), unless a newer load does it first.
// Routers count their dispatches to a worker since its last report
// (least_load, power_of_two, the waiting cap) and start again when the load
// revision moves; without this, an engine whose figures stay the same
// between polls (requests that start and end between them) would collect
// dispatches without end and be routed around.
func (in *Ingester) Refresh(workerID string) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if _, ok := in.pending[workerID]; ok {
		return nil // the pending load moves it
	}
	if in.opts.Coalesce {
		in.refresh[workerID] = struct{}{}
		return nil
	}
	_, err := in.reg.Update(func(t *registry.Txn) error {
		w := t.Get(workerID)
		if w == nil {
			return ErrUnknownWorker
		}
		if refreshable(w) {
			c := w.Clone()
			c.LoadRevision++
			t.Insert(c)
		}
		return nil
	})
	return err
}

// refreshable: w holds a load that its engine's answer may confirm (not a
// no-report, which clears the verdict until a load arrives).
func refreshable(w *registry.Worker) bool { return w.Load != nil && !w.Evidence.NoReport }

// NoReport records a poll that produced no report: the overload veto clears.
func (in *Ingester) NoReport(workerID string) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.noReportLocked(workerID)
}

// noReportLocked is NoReport with in.mu held.
func (in *Ingester) noReportLocked(workerID string) error {
	delete(in.pending, workerID) // "no report" is newer than any pending load
	in.supersede(workerID)
	delete(in.refresh, workerID)
	delete(in.bumping, workerID)
	var f flip
	_, err := in.reg.Update(func(t *registry.Txn) error {
		var err error
		f, err = markNoReport(t, workerID)
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
	clear(in.flushing)
	for _, e := range in.inflight {
		e.superseded.Store(true)
	}
	n := 0
	_, err := in.reg.Update(func(t *registry.Txn) error {
		n = 0
		for _, w := range t.Workers() {
			if w.Evidence.NoReport {
				continue
			}
			if w.Overloaded {
				n++
			}
			c := w.Clone()
			c.Evidence.NoReport = true
			t.Insert(c)
		}
		return nil
	})
	in.done(err, "rebuild", "")
	in.log.Warn("Load monitor rebuilt its state: overload vetoes cleared for every worker", "reason", why, "cleared", n)
}
