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
	"sync/atomic"
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
	coverage chan struct{} // CoverageChanged wakes Run
	covered  atomic.Bool   // CoverageChanged: reconcile the KV event streams

	mu      sync.Mutex
	readers map[string]*reader
	streams map[string]*kvStream // by worker id: one per Ready gRPC worker no agent covers
	runCtx  context.Context      // set by Run; PollNow polls under it
	polls   sync.WaitGroup       // polls and KV streams running; Run waits for them
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
		coverage: make(chan struct{}, 1), readers: map[string]*reader{}, streams: map[string]*kvStream{}}
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

// Run polls until ctx ends, reconciling the schedule whenever membership
// changes.
func (m *Monitor) Run(ctx context.Context) {
	m.mu.Lock()
	m.runCtx = ctx
	m.mu.Unlock()
	defer func() {
		m.mu.Lock() // after ctx ended: no poll or stream starts after this (pollAsync)
		clear(m.streams)
		m.mu.Unlock()
		m.polls.Wait() // every poll and stream started has ended
	}()
	var s schedule
	spread.Loop(ctx, m.reg.MembershipChanged, m.coverage, func(reconcile bool) time.Duration { return m.pollDue(ctx, &s, reconcile) })
}

// CoverageChanged tells the monitor that Options.Covered may answer
// differently: the KV event streams are handed over to or taken back from
// the agents at once, so each gRPC worker has exactly one.
func (m *Monitor) CoverageChanged() {
	m.covered.Store(true)
	select {
	case m.coverage <- struct{}{}:
	default:
	}
}

// schedule is Run's: each polled worker's slot, kept by Run's goroutine.
type schedule = spread.Schedule[slot]

// slot is where a worker is polled: its group, the group's interval and
// its phase in it. A worker whose group or interval changes starts afresh.
type slot struct {
	key      GroupKey
	interval time.Duration
	phase    spread.Phase
}

// pollDue polls the workers that are due, after taking in membership
// changes if reconcile, and returns how long until the next is.
func (m *Monitor) pollDue(ctx context.Context, s *schedule, reconcile bool) time.Duration {
	snap := m.reg.Snapshot()
	now := m.opts.Now()
	if reconcile {
		m.pruneReaders(snap.Workers())
		m.reconcile(s, snap.Workers(), now)
	}
	if m.covered.Swap(false) || reconcile {
		m.reconcileStreams(ctx, snap.Workers())
	}
	for sl := s.PopDue(now); sl != nil; sl = s.PopDue(now) {
		w := snap.Get(sl.ID)
		if w == nil || !polled(w) || groupOf(w) != sl.State.key {
			continue // left unscheduled: the reconcile this change brings forgets it or starts it afresh
		}
		s.At(sl, sl.State.phase.Next(now))
		if !m.pushed(sl.ID, sl.State.interval, now) {
			m.pollAsync(ctx, w)
		}
	}
	return s.Wait(now, max(m.opts.Interval, spread.Resolution))
}

// reconcile schedules the first poll of each Ready worker new to its group
// (or whose group's interval changed) and forgets those that left Ready
// (polled again as new when they come back). A worker is polled at once
// while the burst budget lasts, and from then on every interval after that
// first poll; beyond the budget (a restart, a leader taking over, a bulk
// registration) it is first polled at its hashed phase, within one interval,
// so the polls of N workers spread over the interval and stay spread.
func (m *Monitor) reconcile(s *schedule, workers []*registry.Worker, now time.Time) {
	groups := m.Groups(workers)
	for _, w := range workers {
		if !polled(w) {
			continue
		}
		k := groupOf(w)
		if sl := s.Keep(w.ID); sl == nil || sl.Next().IsZero() || sl.State.key != k || sl.State.interval != groups[k] {
			st, at := slot{key: k, interval: groups[k], phase: spread.PhaseAt(now, groups[k])}, now
			if !m.opts.Burst.Take(now) {
				st.phase = spread.PhaseOf(m.seed, w.ID, groups[k])
				at = st.phase.Next(now)
			}
			s.At(s.Add(w.ID, st), at)
		}
	}
	s.Sweep()
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

// pollAsync polls one worker unless its previous poll is still running or
// ctx (its Run's) ended.
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
	if rd.inFlight || ctx.Err() != nil {
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
		} else if errors.Is(err, engine.ErrNoReport) || errors.As(err, new(*engine.StatusError)) || enginegrpc.Answered(err) {
			m.ingest.Contact(workerID, now) // an answer without a usable report is still contact
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
