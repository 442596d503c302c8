// Package evidence is the one path by which what the control plane learns
// of a worker reaches the registry: load reports and no-reports, liveness
// records, contact and transport failures (agents, polls, health probes),
// and routers' piles, progress and failures. The registry decides every
// verdict from the evidence it stores, in the same transaction
// (docs/verdicts.md).
//
// Each worker has one cell: with Options.Coalesce, an observation that
// leaves the worker's verdicts as they are (asked of the registry's own
// rule, registry.Stands, on a scratch copy of the stored record moved by
// everything pending) waits in it, the latest load and pushed record
// winning; one that moves a verdict is stored at once, with everything
// pending before it. Run flushes every cell, then sweeps (the time-based
// rules), every judge.SweepInterval.
//
// Lock order: a registry transaction, then a cell, whose lock is a leaf
// (TestACellsLockIsALeaf); what a cell holds is taken out only inside a
// transaction, so evidence is stored in the order it came.
//
// It owns the cells, the flush and sweep, the routers' sums and the agent
// streams' read states; the rules are judge's and every verdict is the
// registry's. Nothing here runs per request.
package evidence

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/loadpb"
	"github.com/smg-project/smg/internal/shardmap"
)

// ErrUnknownWorker is returned for a report about a worker not registered.
var ErrUnknownWorker = errors.New("unknown worker")

// Options configure an Inbox.
type Options struct {
	Rules judge.LivenessConfig
	// Now is the clock (nil: time.Now).
	Now func() time.Time
	// Coalesce: an observation that leaves the verdicts as they are waits
	// for the next flush (Run must run).
	Coalesce bool
	// Observe, when set, hears every non-empty load report of a registered
	// worker before coalescing (the window allocator learns from each). It
	// must not keep load.
	Observe func(workerID string, load *smgv1.EngineLoad)
}

// Inbox takes every observation of every worker into the registry.
type Inbox struct {
	reg   *registry.Registry
	rules judge.Rules
	log   *slog.Logger
	opts  Options

	cells *shardmap.Map[*Slot] // by worker id; a flush drops those of workers gone or not Ready

	stalled     *prometheus.GaugeVec
	transitions *prometheus.CounterVec
	held        prometheus.Gauge

	streams streams

	mu     sync.Mutex
	vetoed map[string]string // id → URL of the workers the metrics show vetoed, in commit order

	// jumps bounds the jumps sent at once (a burst of AheadJumpsPerSec).
	jumps *rate.Limiter

	fmu sync.Mutex // one flush (or rebuild) at a time
	// order is every cell by id (fmu held); added the cells made since the
	// last flush (amu held), merged in by the next: no sort at each flush.
	order []*Slot
	amu   sync.Mutex
	added []*Slot
	ids   []*Slot // the running flush's workers (fmu held)
	// records are fresh records for the flush to clone into (fmu held),
	// made, as the cells' spare loads, outside every lock: in the
	// collector's mark phase an allocation pays assists, which would hold
	// up the registry's transaction or a cell.
	records []*registry.Worker

	// For tests: inFlush runs inside each flush transaction after its
	// cells are taken, betweenChunks between two of them.
	inFlush, betweenChunks func()
}

// New returns an Inbox writing to reg; metrics register on m.
func New(reg *registry.Registry, opts Options, log *slog.Logger, m prometheus.Registerer) *Inbox {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	in := &Inbox{
		reg: reg, rules: opts.Rules.Rules(), log: log, opts: opts, cells: shardmap.New[*Slot](), vetoed: map[string]string{},
		streams: streams{open: map[uint64]*Stream{}}, jumps: rate.NewLimiter(AheadJumpsPerSec, AheadJumpsPerSec),
		stalled: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "smg_worker_stalled",
			Help: "1 while the worker is excluded from routing by liveness, labeled with the reason (unreachable or wedged).",
		}, []string{"worker", "reason"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "smg_worker_stall_transitions_total",
			Help: "Times the worker was vetoed by liveness, by reason.",
		}, []string{"worker", "reason"}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "smg_liveness_held_for_read_lag_workers",
			Help: "Workers whose stale or engine-silence veto the last liveness sweep held off because the control plane is behind reading their agent's stream (the silence it has not read is not counted, up to --worker-stale-secs more).",
		}),
	}
	m.MustRegister(in.stalled, in.transitions, in.held)
	return in
}

// Run sweeps every judge.SweepInterval (each sweep flushes first) until
// ctx ends, then flushes once more.
func (in *Inbox) Run(ctx context.Context) {
	t := time.NewTicker(judge.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			in.Flush()
			return
		case <-t.C:
			in.Sweep(in.opts.Now())
		}
	}
}

// Slot is a worker's cell, its id and the handle of the registration it was
// made for (outside the cell: its lock guards nothing of the registry's). An
// agent stream keeps its workers' slots and hands one with each record
// (Observed.Slot): no lookup by id.
type Slot struct {
	cell
	id string
	h  *registry.Handle
}

// Slot returns a Ready worker's slot, or nil.
func (in *Inbox) Slot(id string) *Slot {
	if w := in.reg.Get(id); w != nil && w.Ready() {
		return in.cellOf(id, w)
	}
	return nil
}

// Worker returns the current record of the slot's worker (nil once
// removed, or for no slot), and whether the inbox still keeps the slot.
func (s *Slot) Worker() (*registry.Worker, bool) {
	if s == nil {
		return nil, false
	}
	return s.h.Get(), !s.dead.Load()
}

// cell returns id's cell, or nil.
func (in *Inbox) cell(id string) *Slot {
	c, _ := in.cells.Load(id)
	return c
}

// cellOf returns id's cell, made when w (its record) is not nil: a
// hostile agent's made-up ids make none.
func (in *Inbox) cellOf(id string, w *registry.Worker) *Slot {
	if c := in.cell(id); c != nil || w == nil {
		return c
	}
	h := in.reg.Handle(id)
	if h == nil {
		h = &registry.Handle{} // removed meanwhile: it reads nil, a flush drops the cell
	}
	c, loaded := in.cells.LoadOrStore(id, &Slot{id: id, h: h})
	if !loaded {
		in.amu.Lock()
		in.added = append(in.added, c)
		in.amu.Unlock()
	}
	return c
}

// pend pends load and rec (cell.pend) in w's cell (c; nil: looked up),
// and stores them at once unless they stand and Coalesce lets them wait.
func (in *Inbox) pend(id string, w *registry.Worker, c *Slot, load *smgv1.EngineLoad, copied bool, rec *timedRecord) error {
	var waiting int64
	var usage float64
	if load != nil {
		if in.opts.Observe != nil {
			in.opts.Observe(id, load)
		}
		waiting, usage = loadpb.Signals(load.GetRanks())
	}
	for {
		if c == nil {
			c = in.cellOf(id, w)
		}
		stands, dead := c.pend(w, load, copied, waiting, usage, rec, &in.rules)
		switch {
		case dead:
			c = nil
			continue // dropped by a flush meanwhile: look again
		case stands && in.opts.Coalesce:
			return nil // stored by the next flush
		}
		return in.commit([]string{id}, nil)
	}
}

// chunkSize is how many workers one flush transaction stores: a verdict
// change waits for one chunk at most, not for the whole fleet.
const chunkSize = 1024

// Flush stores everything pending, in transactions of chunkSize workers in
// id order, each worker cloned and inserted once.
func (in *Inbox) Flush() {
	in.fmu.Lock()
	defer in.fmu.Unlock()
	in.amu.Lock()
	added := in.added
	in.added = nil
	in.amu.Unlock()
	if len(added) > 0 { // a fleet's first reports are the only long sort
		in.order = append(in.order, added...)
		slices.SortFunc(in.order, func(a, b *Slot) int { return strings.Compare(a.id, b.id) })
	}
	// In id order, the registry leaves a chunk copies are its own, not
	// copied again by every chunk.
	ids := in.ids[:0]
	for _, c := range in.order {
		if c.pending() {
			ids = append(ids, c)
		} else {
			in.dropIdle(c)
		}
	}
	for start := 0; start < len(ids); start += chunkSize {
		if start > 0 && in.betweenChunks != nil {
			in.betweenChunks()
		}
		in.flushChunk(ids[start:min(start+chunkSize, len(ids))])
	}
	clear(ids)
	in.ids = ids[:0]
	in.order = slices.DeleteFunc(in.order, func(c *Slot) bool { return c.dead.Load() })
}

// flushChunk stores the pending evidence of ids in one transaction, and
// hands the cells whose load it took a spare for their next.
func (in *Inbox) flushChunk(ids []*Slot) {
	for len(in.records) < len(ids) {
		in.records = append(in.records, new(registry.Worker))
	}
	used, loads := 0, 0
	var ch changes
	_, err := in.reg.Update(func(t *registry.Txn) error {
		used, loads, ch = 0, 0, changes{}
		for _, cl := range ids {
			w := t.Get(cl.id)
			if w == nil {
				cl.drop() // its worker left the registry
				continue
			}
			c := w.CloneInto(in.records[used])
			moved, wantsSpare := cl.takeOnto(w, c, &in.rules)
			if wantsSpare {
				loads++
			}
			if moved {
				t.Insert(c)
				used++
				in.committed(w, c, &ch)
			}
		}
		if in.inFlush != nil {
			in.inFlush()
		}
		return nil
	})
	// The records stored are the registry's now; the loads stored are
	// replaced by spares.
	n := copy(in.records, in.records[used:])
	clear(in.records[n:])
	in.records = in.records[:n]
	var spare *smgv1.EngineLoad
	for _, c := range ids {
		if loads == 0 {
			break
		}
		if spare == nil {
			spare = newLoad()
		}
		if c.giveSpare(spare) {
			spare, loads = nil, loads-1
		}
	}
	in.done(ch, err)
	for _, c := range ids {
		in.dropIdle(c)
	}
}

// dropIdle drops c if it is empty and its worker left the registry or Ready.
func (in *Inbox) dropIdle(c *Slot) {
	if w := c.h.Get(); (w == nil || !w.Ready()) && c.kill() {
		in.cells.CompareAndDelete(c.id, c)
	}
}

// commit stores, in one transaction, everything pending for each worker
// of ids, then moves each Ready one with fn (nil: none), given a clone of
// the i-th's record.
func (in *Inbox) commit(ids []string, fn func(i int, c *registry.Worker)) error {
	if len(ids) == 0 {
		return nil // an empty router report (thousands a second): no transaction
	}
	var ch changes
	_, err := in.reg.Update(func(t *registry.Txn) error {
		ch = changes{}
		for i, id := range ids {
			w := t.Get(id)
			if w == nil {
				if len(ids) == 1 {
					return ErrUnknownWorker
				}
				continue
			}
			c := w.Clone()
			moved := false
			if cl := in.cell(id); cl != nil {
				moved, _ = cl.takeOnto(w, c, &in.rules)
			}
			if fn != nil && c.Ready() { // the rules judge Ready workers only
				fn(i, c)
				moved = true
			}
			if moved {
				t.Insert(c)
				in.committed(w, c, &ch)
			}
		}
		return nil
	})
	in.done(ch, err)
	return err
}

// changes are the records a transaction stored whose verdicts or engine
// start moved, beside the ones they replaced, to log after it.
type changes [][2]*registry.Worker

// committed notes the insert of c (w moved on): a liveness veto change
// updates the metrics at once, so they follow the commit order.
func (in *Inbox) committed(w, c *registry.Worker, ch *changes) {
	if c.Liveness != w.Liveness {
		in.mu.Lock()
		in.setVetoLocked(c.ID, c.Spec.GetUrl(), c.Liveness)
		in.mu.Unlock()
	}
	if w.Overloaded != c.Overloaded || c.Liveness != w.Liveness || !c.Evidence.RestartAt.Equal(w.Evidence.RestartAt) ||
		c.Evidence.StartIgnored > 0 && w.Evidence.StartIgnored == 0 {
		*ch = append(*ch, [2]*registry.Worker{w, c})
	}
}

// done logs a transaction's changes (or its failure, but for an unknown
// worker: callers are told), then judges again what came meanwhile for the
// workers whose verdicts moved (judged against the record before).
func (in *Inbox) done(ch changes, err error) {
	if err != nil {
		if !errors.Is(err, ErrUnknownWorker) {
			in.log.Error("Evidence not stored", "error", err)
		}
		return
	}
	for _, m := range ch {
		in.logChange(m[0], m[1])
	}
	for _, m := range ch {
		if w, c := m[0], m[1]; w.Overloaded != c.Overloaded || w.Liveness != c.Liveness {
			in.judgeAgain(c.ID)
		}
	}
}

// logChange logs what moved from w to c: the overload verdict, the
// liveness veto, a believed restart, a first untrusted start time (later
// ones are only counted: a lying engine must not flood the log).
func (in *Inbox) logChange(w, c *registry.Worker) {
	id, url, ev := c.ID, c.Spec.GetUrl(), &c.Evidence
	switch {
	case w.Overloaded == c.Overloaded:
	case ev.NoReport:
		in.log.Info("Worker sent no load report: overload veto cleared (fail open)", "worker_id", id, "model", c.Model)
	case c.Overloaded:
		in.log.Info("Worker overloaded: excluded from routing", "worker_id", id, "model", c.Model, "reason", registry.OverloadFigures(c).String())
	default:
		in.log.Info("Worker under every threshold: back in routing", "worker_id", id, "model", c.Model, "reason", registry.OverloadFigures(c).String())
	}
	if c.Liveness != w.Liveness {
		_, cause := ev.Live.Status()
		in.logVeto(id, url, c.Liveness, cause.String())
	}
	if !ev.RestartAt.Equal(w.Evidence.RestartAt) {
		in.log.Info("Engine restarted: contact ends its failure spell", "worker_id", id, "url", url,
			"old_start_time", w.Evidence.StartTime, "new_start_time", ev.StartTime)
	}
	if ev.StartIgnored > 0 && w.Evidence.StartIgnored == 0 {
		in.log.Warn("Engine start time not trusted: not a restart", "worker_id", id, "url", url,
			"start_time", ev.StartTime, "reported_start_time", c.Load.GetProcessStartTimeSeconds())
	}
}

// judgeAgain stores id's pending evidence now if it no longer leaves the
// stored verdicts as they are.
func (in *Inbox) judgeAgain(id string) {
	c, w := in.cell(id), in.reg.Get(id)
	if c == nil || w == nil || c.stands(w, &in.rules) {
		return
	}
	_ = in.commit([]string{id}, nil)
}
