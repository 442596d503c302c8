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
//
// No lock is shared by every worker's reports: each worker's pending state
// is a cell, found without a lock and guarded by its own mutex, which only
// that worker's reports and the flush contend for. A hundred agent streams
// taking one process-wide lock per message made a convoy whenever one holder
// was held up (a collector's assist, a preempted flush, a flip waiting for
// the registry's lock): Go's mutex then hands the lock over in FIFO order
// through every waiting stream.
//
// It owns the pending loads and their flush; the overload rule is
// judge.Check, applied by the registry, never here.
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
	"github.com/smg-project/smg/internal/shardmap"
)

// ErrUnknownWorker is returned for a report about a worker not registered.
var ErrUnknownWorker = errors.New("unknown worker")

// Ingester stores reports; the registry decides the overload verdict from
// them in the transaction that stores them.
type Ingester struct {
	reg  *registry.Registry
	log  *slog.Logger
	opts Options

	// cells is each registered worker's pending state by id, made at its
	// first report and dropped by a flush once the registry no longer has
	// the worker.
	cells *shardmap.Map[*cell]

	rmu sync.Mutex // one Rebuild at a time (it holds every cell at once)

	fmu   sync.Mutex  // one Flush at a time
	chunk []chunkLoad // the running flush's transaction (fmu held)
	ids   []string    // the running flush's workers (fmu held)
	flips []flip      // the running chunk's verdict changes (fmu held)
	// records are fresh records for the next flush transaction to clone
	// into, and made is fresh loads for the cells' spares (fmu held):
	// both made by the flush outside every lock, none ever stored before
	// it is used. A flush runs during the collector's mark phases, which
	// charge allocations to whoever makes them, as assists: made inside
	// the registry's transaction, they would hold up a flip waiting for
	// it; made by a report under its cell's lock, the flush behind it.
	records []*registry.Worker
	made    []*smgv1.EngineLoad

	// betweenChunks, for tests, runs between a flush's transactions.
	betweenChunks func()
}

// cell returns id's cell, or nil.
func (in *Ingester) cell(id string) *cell {
	c, _ := in.cells.Load(id)
	return c
}

// cell is one worker's pending state. Its lock orders the worker's
// reports, no-reports and refreshes, and is held by a report that flips
// the verdict while it commits: no other worker's report waits for it.
type cell struct {
	mu      sync.Mutex
	pending *smgv1.EngineLoad // the latest report to store at the next flush; nil: none
	// spare is a load no one holds, made by the flush, for the next
	// report to copy into (nil: none; one is made then).
	spare   *smgv1.EngineLoad
	refresh bool // Refresh: move the load revision at the next flush
	// inflight is this worker's entry in the running flush transaction,
	// which runs without the cell's lock: reports go on meanwhile, and one
	// that commits at once marks it superseded (supersede).
	inflight *chunkLoad
	// dead: a flush dropped the cell from cells (its worker left the
	// registry); whoever locks it after looks the worker up again.
	dead bool
}

// supersede marks what the running flush transaction holds of the cell's
// worker as replaced by something newer that commits now (c.mu held, before
// that commit: the transaction, holding the registry's lock, reads the mark
// before the commit can run).
func (c *cell) supersede() {
	if c.inflight != nil {
		c.inflight.superseded.Store(true)
	}
}

// takeSpare returns a load no one holds, to copy a report into (c.mu held).
func (c *cell) takeSpare() *smgv1.EngineLoad {
	if l := c.spare; l != nil {
		c.spare = nil
		return l
	}
	return newLoad() // the worker's first report, or its first after a flip
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
	// Observe, when set, hears every non-empty report of a registered
	// worker as it arrives, before coalescing (the window allocator learns
	// engines' windows from each one). It runs under the worker's lock and
	// must not keep load.
	Observe func(workerID string, load *smgv1.EngineLoad)
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
	return &Ingester{reg: reg, opts: opts, log: log, cells: shardmap.New[*cell]()}
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

// lock returns workerID's cell, locked. Only a registered worker gets one:
// a hostile agent's made-up ids make nothing.
func (in *Ingester) lock(workerID string) (*cell, error) {
	for {
		c := in.cell(workerID)
		if c == nil {
			if in.reg.Get(workerID) == nil {
				return nil, ErrUnknownWorker
			}
			c, _ = in.cells.LoadOrStore(workerID, &cell{})
		}
		c.mu.Lock()
		if !c.dead {
			return c, nil
		}
		c.mu.Unlock() // dropped meanwhile: look again
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
	ids := in.ids[:0]
	in.cells.Range(func(id string, c *cell) bool {
		c.mu.Lock()
		switch {
		case c.pending != nil || c.refresh:
			ids = append(ids, id)
		case in.reg.Get(id) == nil:
			// Its worker left the registry: drop the cell (a report that
			// holds it already looks again).
			c.dead = true
			in.cells.CompareAndDelete(id, c)
		}
		c.mu.Unlock()
		return true
	})
	if in.opts.Rider != nil {
		ids = in.opts.Rider.PendingIDs(ids)
	}
	// In key order, each transaction writes one stretch of the id index's
	// radix tree: the inner nodes a chunk copies are its own, not copied
	// again by every chunk as map order would have it.
	slices.Sort(ids)
	ids = slices.Compact(ids) // a worker with a load and the Rider's evidence
	for start := 0; start < len(ids); start += chunkSize {
		if start > 0 && in.betweenChunks != nil {
			in.betweenChunks()
		}
		in.storeChunk(ids[start:min(start+chunkSize, len(ids))])
	}
	clear(ids)
	in.ids = ids[:0]
}

// chunkLoad is what a flush transaction stores for one worker besides the
// Rider's evidence.
type chunkLoad struct {
	id   string
	c    *cell             // nil: the Rider's evidence alone
	load *smgv1.EngineLoad // nil: none
	bump bool              // Refresh: move the load revision
	// superseded: a newer report, no-report or rebuild commits (set under
	// the cell's lock before it does, read by the transaction): neither
	// is stored.
	superseded atomic.Bool
}

// storeChunk stores the pending load and the Rider's evidence of ids in one
// transaction. It holds a cell's lock only to take its load and to let go
// of it, never while the transaction runs: the worker's reports go on
// (pending, or waiting for the registry when they flip a verdict) instead
// of stopping behind it.
func (in *Ingester) storeChunk(ids []string) {
	if cap(in.chunk) < len(ids) {
		in.chunk = make([]chunkLoad, chunkSize)
	}
	ents := in.chunk[:len(ids)]
	spares := 0 // cells whose load the flush takes and that hold no spare
	for i, id := range ids {
		e := &ents[i]
		e.id, e.c, e.load, e.bump = id, nil, nil, false
		e.superseded.Store(false)
		c := in.cell(id)
		if c == nil {
			continue
		}
		c.mu.Lock()
		e.c = c
		e.load, c.pending = c.pending, nil
		e.bump, c.refresh = c.refresh, false
		c.inflight = e
		if e.load != nil && c.spare == nil {
			spares++
		}
		c.mu.Unlock()
	}
	for len(in.records) < len(ents) {
		in.records = append(in.records, new(registry.Worker))
	}
	used := 0 // records stored
	_, err := in.reg.Update(func(t *registry.Txn) error {
		in.flips = in.flips[:0]
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
				in.flips = append(in.flips, f)
			}
		}
		return nil
	})
	// The records stored are the registry's now; the loads stored are
	// replaced by as many spares for the reports to come (a worker's next
	// pending load).
	n := copy(in.records, in.records[used:])
	clear(in.records[n:])
	in.records = in.records[:n]
	for range spares {
		in.made = append(in.made, newLoad())
	}
	for i := range ents {
		e := &ents[i]
		if c := e.c; c != nil {
			c.mu.Lock()
			c.inflight = nil
			if e.load != nil && c.spare == nil && len(in.made) > 0 {
				c.spare = in.made[len(in.made)-1]
				in.made = in.made[:len(in.made)-1]
			}
			c.mu.Unlock()
		}
		e.c, e.load = nil, nil
	}
	clear(in.made)
	in.made = in.made[:0]
	in.done(err, "flush", "")
	// A report that came while the transaction ran was judged against
	// the record before it; where the transaction flipped the verdict
	// (the world moved since its load was judged), a newer pending load
	// may flip it back: it commits now, as it would have at once.
	for _, f := range in.flips {
		in.logFlip(f)
		in.judgeAgain(f.workerID)
	}
}

// judgeAgain commits id's pending load at once if it no longer leaves the
// stored verdict as it is.
func (in *Ingester) judgeAgain(id string) {
	c := in.cell(id)
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.pending
	if p == nil {
		return
	}
	if w := in.reg.Get(id); w != nil && stands(w, int64(p.GetWaitingRequests()), p.GetTokenUsage()) {
		return
	}
	c.pending, c.refresh = nil, false
	if f, err := in.commit(id, p); err == nil {
		in.logFlip(f)
	}
}

// stands reports whether a load with these signals leaves w's stored
// verdicts as they are (registry.Stands on a scratch copy): a prediction
// only, the registry decides again when it stores the load. A report after
// a no-report commits at once: it ends the fail-open spell.
func stands(w *registry.Worker, waiting int64, usage float64) bool {
	if w.Evidence.NoReport {
		return false
	}
	var load smgv1.EngineLoad
	setSignals(&load, waiting, usage)
	c := *w
	c.Load = &load
	return registry.Stands(w, &c)
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

// ReportCopies is ReportCopy of each report in order (an agent's message
// carries many records). Each takes only its worker's lock. failed, when
// set, hears each report's error (as ReportCopy would return it).
func (in *Ingester) ReportCopies(reps []Reported, failed func(i int, err error)) {
	for i, r := range reps {
		if err := in.report(r.WorkerID, r.Load, true); err != nil && failed != nil {
			failed(i, err)
		}
	}
}

func (in *Ingester) report(workerID string, load *smgv1.EngineLoad, copied bool) error {
	if load == nil || len(load.GetRanks()) == 0 {
		return in.NoReport(workerID)
	}
	c, err := in.lock(workerID)
	if err != nil {
		return err
	}
	defer c.mu.Unlock()
	if in.opts.Observe != nil {
		in.opts.Observe(workerID, load)
	}
	waiting, usage := Signals(load.GetRanks())
	if in.opts.Coalesce {
		// Read under the cell's lock, so a Rebuild (which holds every
		// cell while it commits) is either before or after.
		w := in.reg.Get(workerID)
		if w == nil {
			return ErrUnknownWorker
		}
		if stands(w, waiting, usage) {
			if copied {
				if p := c.pending; p != nil {
					setSignals(CopyLoad(p, load), waiting, usage) // the pending load is ours alone
					return nil
				}
				load = CopyLoad(c.takeSpare(), load)
			}
			setSignals(load, waiting, usage)
			c.pending = load // the verdict stands: commit with the next flush
			return nil
		}
		if p := c.pending; p != nil && copied {
			load = CopyLoad(p, load) // stored below: no longer pending
			copied = false
		}
		c.pending = nil // this report is newer
	}
	// Committed now, holding only this worker's lock while it waits for
	// the registry's. A load that a flush holds is older and must not be
	// stored after it (a pending report leaves it be: it is stored after).
	c.supersede()
	c.refresh = false // the new load moves the load revision
	if copied {
		load = CopyLoad(c.takeSpare(), load)
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
	return flip{flipped: true, over: c.Overloaded, noReport: c.Evidence.NoReport, workerID: c.ID, model: c.Model,
		reason: registry.OverloadFigures(c)}
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
	c, err := in.lock(workerID)
	if err != nil {
		return err
	}
	defer c.mu.Unlock()
	if c.pending != nil {
		return nil // the pending load moves it
	}
	if in.opts.Coalesce {
		c.refresh = true
		return nil
	}
	_, err = in.reg.Update(func(t *registry.Txn) error {
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
	c, err := in.lock(workerID)
	if err != nil {
		return err
	}
	defer c.mu.Unlock()
	// "No report" is newer than any pending load, refresh, or load the
	// running flush holds.
	c.pending, c.refresh = nil, false
	c.supersede()
	var f flip
	_, err = in.reg.Update(func(t *registry.Txn) error {
		var err error
		f, err = markNoReport(t, workerID)
		return err
	})
	in.logFlip(f)
	return err
}

// Rebuild clears the overload veto of every worker: the monitor lost its state
// and holds no fresh signal for any of them. reset gives each worker's
// record without that state (nil: marked "no report", its last load kept
// visible). It holds every cell while it commits, so no report is judged
// against the records before it and stored after it, and it drops what the
// cells held (a load pending from before the rebuild is no one's signal).
func (in *Ingester) Rebuild(why string, reset func(*registry.Worker) *registry.Worker) {
	in.rmu.Lock()
	defer in.rmu.Unlock()
	var held []*cell
	in.cells.Range(func(_ string, c *cell) bool {
		c.mu.Lock()
		c.pending, c.refresh = nil, false
		c.supersede()
		held = append(held, c)
		return true
	})
	defer func() {
		for _, c := range held {
			c.mu.Unlock()
		}
	}()
	n, workers := 0, 0
	_, err := in.reg.Update(func(t *registry.Txn) error {
		n, workers = 0, 0
		for _, w := range t.Workers() {
			workers++
			if w.Overloaded {
				n++
			}
			if reset != nil {
				t.Insert(reset(w))
				continue
			}
			if w.Evidence.NoReport {
				continue
			}
			c := w.Clone()
			c.Evidence.NoReport = true
			t.Insert(c)
		}
		return nil
	})
	in.done(err, "rebuild", "")
	in.log.Warn("Load monitor rebuilt its state: overload vetoes cleared for every worker", "reason", why, "workers", workers, "cleared", n)
}
