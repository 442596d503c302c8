// Package monitor is the control plane's load monitor (the spec's "Polling"):
// workers are polled in groups of the same model, worker type and connection
// mode, every --load-monitor-interval seconds or at the smallest
// load_monitor_interval_secs override among the group's workers (floored to
// 1 s). Only Ready workers are polled; each answer, or the lack of one, is
// handed to the evidence inbox, which runs the overload check. Each worker is
// polled at its own phase in the interval (controlplane/spread), so the polls
// of many workers are spread over it.
//
// It owns the poll schedule and the engine readers' calls; what a poll means
// is the evidence inbox's and the registry's business.
package monitor

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"maps"
	"net/http"
	"sync"
	"time"

	"github.com/smg-project/smg/controlplane/evidence"
	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	"github.com/smg-project/smg/controlplane/spread"
	"github.com/smg-project/smg/internal/engine"
	"github.com/smg-project/smg/internal/enginegrpc"
	"github.com/smg-project/smg/internal/loadpb"
	"github.com/smg-project/smg/internal/readbudget"
)

// Monitor polls worker groups.
type Monitor struct {
	reg      *registry.Registry
	ingest   *evidence.Inbox
	client   *http.Client
	log      *slog.Logger
	opts     Options
	seed     string        // opts.Seed for polls
	coverage chan struct{} // CoverageChanged: reconcile the KV event streams
	kv       kvStreams

	mu      sync.Mutex
	readers map[string]*reader
	runCtx  context.Context // set by Run; PollNow polls under it
	stopped bool            // Run is returning: no new polls
	polls   sync.WaitGroup  // polls in flight; Run waits for them
}

// Options configure a Monitor.
type Options struct {
	// Interval is the default polling period (--load-monitor-interval).
	Interval time.Duration
	Budget   *readbudget.Budget // bounds the memory of the polls in flight (nil: none)
	// RecentlyPushed (nil: poll always) tells whether an agent delivered the
	// worker's records within the interval, making this tick's poll needless.
	RecentlyPushed func(workerID string, within time.Duration, now time.Time) bool
	Now            func() time.Time // nil: time.Now
	// Seed is mixed into each worker's poll phase so that two control
	// planes polling the same engines do not poll them in step.
	Seed string
	// Burst is the budget of first polls started at once (nil:
	// spread.DefaultBurstSize a second); a worker beyond it waits for its
	// phase.
	Burst *spread.Burst
	// GRPC (nil: gRPC workers are not polled) polls grpc:// and grpcs://
	// workers with GetLoads, and streams their KV events.
	GRPC *enginegrpc.Pool
	// Covered tells whether a connected agent is assigned the engine url:
	// that agent streams its KV events, the monitor does not (nil: the
	// monitor streams none). Call CoverageChanged when its answers may change.
	Covered func(url string) bool
}

type reader struct {
	url      string
	apiKey   string
	r        LoadReader
	inFlight bool
}

// LoadReader reads one worker's load: engine.Reader over HTTP, the
// worker's gRPC client (GetLoads) for grpc:// and grpcs:// workers.
type LoadReader interface {
	Read(ctx context.Context) (engine.Report, error)
}

// GroupKey identifies a polling group.
type GroupKey struct{ Model, Type, Mode string }

// New returns a monitor polling every opts.Interval unless a spec overrides it.
func New(reg *registry.Registry, in *evidence.Inbox, client *http.Client, opts Options, log *slog.Logger) *Monitor {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Burst == nil {
		opts.Burst = spread.NewBurst(spread.DefaultBurstSize, spread.DefaultBurstPer)
	}
	return &Monitor{reg: reg, ingest: in, client: client, log: log, opts: opts, seed: opts.Seed + "\x00poll",
		coverage: make(chan struct{}, 1), readers: map[string]*reader{}, kv: kvStreams{m: map[string]*kvStream{}}}
}

func groupOf(w *registry.Worker) GroupKey {
	return GroupKey{Model: w.Model, Type: w.Type, Mode: cmp.Or(w.Spec.GetConnectionMode(), "http")}
}

// Groups returns the polling interval of each group in snap.
func (m *Monitor) Groups(workers []*registry.Worker) map[GroupKey]time.Duration {
	out := map[GroupKey]time.Duration{}
	for _, w := range workers {
		k := groupOf(w)
		iv := out[k]
		if w.Spec.LoadMonitorIntervalSecs != nil {
			o := max(time.Duration(w.Spec.GetLoadMonitorIntervalSecs())*time.Second, time.Second)
			if iv == 0 || o < iv {
				iv = o
			}
		}
		out[k] = iv
	}
	for k, iv := range out {
		if iv == 0 {
			out[k] = m.opts.Interval
		}
	}
	return out
}

// Run polls until ctx ends, reconciling groups whenever the registry changes.
func (m *Monitor) Run(ctx context.Context) {
	type runner struct {
		interval time.Duration
		cancel   context.CancelFunc
		kick     chan struct{}
	}
	m.mu.Lock()
	m.runCtx = ctx
	m.mu.Unlock()
	runners := map[GroupKey]*runner{}
	var wg sync.WaitGroup
	defer func() {
		for _, r := range runners {
			r.cancel()
		}
		wg.Wait()
		m.stopStreams()
		m.mu.Lock()
		m.stopped = true
		m.mu.Unlock()
		m.polls.Wait() // every poll started has ended
	}()
	for {
		changed := m.reg.MembershipChanged() // not on load reports: membership only
		workers := m.reg.Snapshot().Workers()
		m.pruneReaders(workers)
		m.reconcileStreams(ctx, workers)
		groups := m.Groups(workers)
		for k, r := range runners {
			if iv, ok := groups[k]; !ok || iv != r.interval {
				r.cancel()
				delete(runners, k)
			}
		}
		for k, iv := range groups {
			r, ok := runners[k]
			if !ok {
				rctx, cancel := context.WithCancel(ctx)
				r = &runner{interval: iv, cancel: cancel, kick: make(chan struct{}, 1)}
				runners[k] = r
				wg.Go(func() { m.runGroup(rctx, k, iv, r.kick) })
			}
			select { // a change may have made a worker Ready: poll it now
			case r.kick <- struct{}{}:
			default:
			}
		}
		for again := true; again; {
			select {
			case <-ctx.Done():
				return
			case <-changed:
				again = false
			case <-m.coverage: // an agent took over or left: hand the streams over
				m.reconcileStreams(ctx, m.reg.Snapshot().Workers())
			}
		}
	}
}

// CoverageChanged tells the monitor that Options.Covered may answer
// differently: the KV event streams are handed over to or taken back from
// the agents at once, so each gRPC worker has exactly one.
func (m *Monitor) CoverageChanged() {
	select {
	case m.coverage <- struct{}{}:
	default:
	}
}

// runGroup polls each of the group's Ready workers every interval, at its
// phase: a worker that becomes Ready (or joins the group) is polled at once
// while the burst budget lasts, and from then on every interval after that
// first poll; beyond the budget (a restart, a leader taking over, a bulk
// registration) it is first polled at its hashed phase, within one interval,
// so the polls of N workers spread over the interval and stay spread.
func (m *Monitor) runGroup(ctx context.Context, k GroupKey, interval time.Duration, kick <-chan struct{}) {
	g := &group{key: k, interval: interval, slots: map[string]*slot{}}
	timer := time.NewTimer(interval)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-kick:
			g.reconcile(m, m.reg.Snapshot().Workers(), m.opts.Now())
		}
		start := time.Now()
		timer.Reset(m.pollDue(ctx, g))
		if !spread.Pace(ctx, start) {
			return
		}
	}
}

// group is one polling group's schedule, kept by its runGroup goroutine.
type group struct {
	key      GroupKey
	interval time.Duration
	slots    map[string]*slot // the group's Ready workers
	queue    spread.Queue     // each slot's next poll; entries not matching it are stale
	gen      uint64
}

type slot struct {
	phase spread.Phase
	next  time.Time
	gen   uint64
}

// reconcile schedules the first poll of each Ready worker new to the group
// and forgets those that left it or left Ready (polled again as new when
// they come back).
func (g *group) reconcile(m *Monitor, workers []*registry.Worker, now time.Time) {
	g.gen++
	for _, w := range workers {
		if !polled(w) || groupOf(w) != g.key {
			continue
		}
		s := g.slots[w.ID]
		if s == nil {
			s = &slot{}
			if m.opts.Burst.Take(now) {
				s.phase, s.next = spread.PhaseAt(now, g.interval), now
			} else {
				s.phase = spread.PhaseOf(m.seed, w.ID, g.interval)
				s.next = s.phase.Next(now)
			}
			g.slots[w.ID] = s
			g.queue.Push(s.next, w.ID)
		}
		s.gen = g.gen
	}
	maps.DeleteFunc(g.slots, func(_ string, s *slot) bool { return s.gen != g.gen })
}

// pollDue polls the group's workers that are due and returns how long until
// the next is.
func (m *Monitor) pollDue(ctx context.Context, g *group) time.Duration {
	now := m.opts.Now()
	snap := m.reg.Snapshot()
	for {
		at, id, ok := g.queue.PopDue(now)
		if !ok {
			break
		}
		s := g.slots[id]
		if s == nil || !s.next.Equal(at) {
			continue // stale entry
		}
		w := snap.Get(id)
		if w == nil || !polled(w) || groupOf(w) != g.key {
			delete(g.slots, id) // the reconcile this change brings re-adds it if it comes back
			continue
		}
		s.next = s.phase.Next(now)
		g.queue.Push(s.next, id)
		if m.pushed(id, g.interval, now) {
			continue
		}
		m.pollAsync(ctx, w)
	}
	if at, ok := g.queue.Peek(); ok {
		return min(max(at.Sub(now), spread.Resolution), g.interval)
	}
	return g.interval
}

// PollNow polls the given Ready workers at once (their agent went away: the
// poll takes over without waiting for the next tick), as many as the burst
// budget allows; the rest are polled at their phase, within one interval
// (many agents leaving at once must not become one instant's polls).
func (m *Monitor) PollNow(workerIDs ...string) {
	m.mu.Lock()
	ctx := m.runCtx
	m.mu.Unlock()
	if ctx == nil {
		return
	}
	snap := m.reg.Snapshot()
	now := m.opts.Now()
	for _, id := range workerIDs {
		if w := snap.Get(id); w != nil && polled(w) && m.opts.Burst.Take(now) {
			m.pollAsync(ctx, w)
		}
	}
}

// polled reports whether w's load is polled: Ready, and an engine (an
// external provider has no load feed).
func polled(w *registry.Worker) bool { return w.Ready() && !w.External() }

// pollAsync polls one worker unless its previous poll is still running.
func (m *Monitor) pollAsync(ctx context.Context, w *registry.Worker) {
	m.mu.Lock()
	rd := m.readers[w.ID]
	if rd == nil || rd.url != w.Spec.GetUrl() || rd.apiKey != w.Spec.GetApiKey() {
		r, err := m.newReader(w)
		if err != nil {
			m.mu.Unlock()
			m.log.Warn("Worker cannot be polled", "worker_id", w.ID, "url", w.Spec.GetUrl(), "error", err)
			return
		}
		rd = &reader{url: w.Spec.GetUrl(), apiKey: w.Spec.GetApiKey(), r: r}
		m.readers[w.ID] = rd
	}
	if rd.inFlight || m.stopped {
		m.mu.Unlock()
		return
	}
	rd.inFlight = true
	m.polls.Go(func() {
		defer func() {
			m.mu.Lock()
			rd.inFlight = false
			m.mu.Unlock()
		}()
		m.PollOnce(ctx, w.ID, rd.r)
	})
	m.mu.Unlock()
}

// newReader makes the reader of w's wire.
func (m *Monitor) newReader(w *registry.Worker) (LoadReader, error) {
	if enginegrpc.IsGRPC(w.Spec.GetUrl()) {
		if m.opts.GRPC == nil {
			return nil, errors.New("no gRPC client configured")
		}
		return m.opts.GRPC.Get(w.Spec.GetUrl())
	}
	return engine.NewReader(m.client, w.Spec.GetUrl(), engine.WithBudget(m.opts.Budget), engine.WithAPIKey(w.Spec.GetApiKey())), nil
}

// PollOnce reads one worker and ingests the outcome.
func (m *Monitor) PollOnce(ctx context.Context, workerID string, r LoadReader) {
	rep, err := r.Read(ctx)
	if ctx.Err() != nil {
		return
	}
	now := m.opts.Now()
	if err != nil {
		if engine.IsTransportFailure(err) || enginegrpc.IsConnectionFailure(err) {
			m.ingest.PollTransportFailure(workerID, err, now)
		} else if engineAnswered(err) {
			m.ingest.Contact(workerID, now)
		}
		m.log.Debug("Load poll produced no report", "worker_id", workerID, "error", err)
		m.ingested(workerID, m.ingest.NoReport(workerID))
		return
	}
	m.ingest.Record(workerID, judge.Record{Waiting: rep.Waiting(), Idle: rep.Running() == 0}, now)
	m.ingested(workerID, m.ingest.Report(workerID, loadpb.FromReport(rep, now)))
}

// ingested logs a poll outcome the inbox did not store: the worker was
// removed while the poll ran (debug), or the write failed.
func (m *Monitor) ingested(workerID string, err error) {
	switch {
	case err == nil:
	case errors.Is(err, evidence.ErrUnknownWorker):
		m.log.Debug("Load poll of a removed worker ignored", "worker_id", workerID)
	default:
		m.log.Error("Load poll outcome not stored", "worker_id", workerID, "error", err)
	}
}

// engineAnswered tells an answer without a usable report (which is still
// contact) from a timeout or a transport failure.
func engineAnswered(err error) bool {
	var se *engine.StatusError
	return errors.Is(err, engine.ErrNoReport) || errors.As(err, &se) || enginegrpc.Answered(err)
}

// pruneReaders forgets readers of removed workers.
func (m *Monitor) pruneReaders(workers []*registry.Worker) {
	ids, urls := make(map[string]bool, len(workers)), make(map[string]bool, len(workers))
	for _, w := range workers {
		ids[w.ID], urls[w.Spec.GetUrl()] = true, true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	maps.DeleteFunc(m.readers, func(id string, _ *reader) bool { return !ids[id] })
	if m.opts.GRPC != nil {
		m.opts.GRPC.Retain(urls)
	}
}
