package windows

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/shardmap"
)

// Defaults for Options.
const (
	DefaultInterval = 250 * time.Millisecond
	DefaultWarmup   = time.Second
	// DefaultHeldWarmup is the warm-up once a router reports rooms it still
	// holds from a previous control plane: long enough for the other
	// routers to reach the new leader and report theirs (the e2e failover
	// test saw up to about 3.5 s).
	DefaultHeldWarmup = 5 * time.Second
)

// Options configure an Allocator.
type Options struct {
	// Interval is how often shares are recomputed (default 250ms).
	Interval time.Duration
	// StaleAfter is how long a disconnected router keeps its share before it
	// returns to the others (--worker-stale-secs; 0: at once).
	StaleAfter time.Duration
	// Warmup is how long after Run starts no share grows, so that routers
	// still holding rooms from a previous control plane report them first
	// (zero: none; the control plane sets DefaultWarmup).
	Warmup time.Duration
	// HeldWarmup replaces Warmup once a router's first report in a run
	// shows rooms in flight: one not heard from yet may hold rooms too (0:
	// no extension; the control plane sets DefaultHeldWarmup).
	HeldWarmup time.Duration
	// Now is the clock (nil: time.Now).
	Now func() time.Time
	// Admission gives every regular worker a running window
	// (--worker-admission-window): the spec's max_running_requests, else
	// the engine's reported window, else a learned one.
	Admission bool
	// Queue is how many requests may wait in an engine beyond its window
	// (--worker-admission-queue): shares split window + Queue.
	Queue int64
	// TokenBudget gives every regular worker a token budget
	// (--worker-token-budget), split like the running window.
	TokenBudget bool
}

// Allocator keeps window shares (PD decode windows and, with Admission,
// every worker's running window) in the registry. It implements
// watch.DemandSink.
type Allocator struct {
	reg     *registry.Registry
	opts    Options
	log     *slog.Logger
	started time.Time
	held    bool // a router's first report in this run showed rooms in flight
	writes  prometheus.Counter

	mu      sync.Mutex
	routers map[string]*routerState
	seen    map[string]bool // plan's scratch, kept so a plan over 10,000 workers does not grow a map 4 times a second
	// grants: by dimension, worker id, router id.
	grants [numDims]map[string]map[string]*grant
	// learners: learned running windows by worker id (learn.go), fed by
	// ObserveLoad without the allocator's lock.
	learners *shardmap.Map[*learner]
	kick     chan struct{}         // a round now: a learned window went down
	kv       map[string]*kvLearner // learned KV capacities by worker id (budget.go)
	kvCapped prometheus.Counter
}

type routerState struct {
	applied uint64
	demand  map[string]*smgv1.DecodeDemand // by worker id, from the latest report
	gone    bool
	goneAt  time.Time
}

// grant is one router's standing on one worker beyond its share in the
// registry: what it may still hold, and the decrease it has yet to apply.
type grant struct {
	share   int64  // the share last written (the registry's copy may be lost to a re-registration)
	held    int64  // rooms the router may occupy beyond its share
	pending uint64 // revision of an unacknowledged decrease (0: none)
}

// New returns an Allocator over reg; metrics register on m (may be nil).
func New(reg *registry.Registry, opts Options, log *slog.Logger, m prometheus.Registerer) *Allocator {
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a := &Allocator{
		reg: reg, opts: opts, log: log, started: opts.Now(),
		routers:  make(map[string]*routerState),
		seen:     make(map[string]bool),
		grants:   [numDims]map[string]map[string]*grant{make(map[string]map[string]*grant), make(map[string]map[string]*grant)},
		learners: shardmap.New[*learner](),
		kick:     make(chan struct{}, 1),
		writes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "smg_pd_window_share_updates_total",
			Help: "Registry writes that changed window shares (PD decode windows and admission windows).",
		}),
		kv: make(map[string]*kvLearner),
		kvCapped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "smg_worker_token_budget_learn_capped_total",
			Help: "Samples of a learned KV capacity cut to the growth bound (twice the capacity learned) or to 2^26 tokens: an engine whose KV usage does not fit the tokens routers hold there.",
		}),
	}
	if m != nil {
		_ = m.Register(a.writes)
		if opts.TokenBudget {
			_ = m.Register(a.kvCapped)
		}
	}
	return a
}

// RouterDemand records one report from a router (watch.DemandSink).
func (a *Allocator) RouterDemand(routerID string, applied uint64, demand []*smgv1.DecodeDemand, _ time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	rs := a.routers[routerID]
	if rs == nil {
		rs = &routerState{}
		a.routers[routerID] = rs
		if !a.held && slices.ContainsFunc(demand, func(d *smgv1.DecodeDemand) bool { return d.GetInFlight() > 0 }) {
			a.held = true
			a.log.Info("A router holds rooms from a previous control plane; shares grow after the longer warm-up", "router", routerID, "warmup", a.opts.HeldWarmup)
		}
	}
	rs.gone, rs.applied = false, max(rs.applied, applied)
	rs.demand = make(map[string]*smgv1.DecodeDemand, len(demand))
	for _, d := range demand {
		rs.demand[d.GetWorkerId()] = d
	}
	// A report sent after the router applied a decrease bounds what it holds.
	for dim, grants := range a.grants {
		for wid, byRouter := range grants {
			g := byRouter[routerID]
			if g == nil || (g.pending != 0 && rs.applied < g.pending) {
				continue
			}
			g.pending = 0
			g.held, _, _ = demandOf(dim, rs.demand[wid]) // the share is added back in step
		}
	}
}

// Dimensions a window is counted in, each with its own grants and
// acknowledgements.
const (
	dimRooms = iota
	dimTokens
	numDims
)

// demandOf reads a router's demand on a worker in dimension dim.
func demandOf(dim int, d *smgv1.DecodeDemand) (inFlight, waiting int64, byClass []int64) {
	if dim == dimTokens {
		return d.GetTokensInFlight(), d.GetTokensWaiting(), d.GetTokensWaitingByClass()
	}
	return d.GetInFlight(), d.GetWaiting(), d.GetWaitingByClass()
}

// RouterDisconnected starts the stale bound of a router (watch.DemandSink).
func (a *Allocator) RouterDisconnected(routerID string, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if rs := a.routers[routerID]; rs != nil {
		rs.gone, rs.goneAt = true, now
	}
}

// Run recomputes shares every Interval until ctx ends (a replica: while it
// leads). Each run starts clean, with its own warm-up, as a new leader does.
func (a *Allocator) Run(ctx context.Context) {
	a.mu.Lock()
	a.started = a.opts.Now()
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.held = false
		clear(a.routers)
		a.forget(nil)
		a.mu.Unlock()
	}()
	t := time.NewTicker(a.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-a.kick:
		}
		if err := a.Step(); err != nil {
			a.log.Warn("Window allocation failed", "err", err)
		}
	}
}

// Step runs one allocation round: expire routers gone past the stale bound,
// plan the next shares and commit the ones that changed. The plan runs
// outside the registry's write lock (over 10,000 workers it would hold up
// every flip for milliseconds); a worker registered again meanwhile is left
// to the next round.
func (a *Allocator) Step() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.opts.Now()
	a.expire(now)
	updates, decreased := a.plan(a.reg.Snapshot().Workers(), now)
	if len(updates) == 0 {
		return nil
	}
	wrote := false
	rev, err := a.reg.Update(func(t *registry.Txn) error {
		for id, u := range updates {
			if cur := t.Get(id); cur != nil && cur.Registered == *u.from {
				c := cur.Clone()
				c.Shares = u.shares
				t.Insert(c)
				wrote = true
			}
		}
		return nil
	})
	if err != nil || !wrote {
		return err
	}
	a.writes.Inc()
	for dim, dec := range decreased {
		for wid, routers := range dec {
			for _, id := range routers {
				if g := a.grants[dim][wid][id]; g != nil {
					g.pending = rev // acknowledged once the router reports having applied rev
				}
			}
		}
	}
	return nil
}

// update is the next shares of one worker, planned from the registration
// of from.
type update struct {
	from   *registry.Registered
	shares registry.Shares
}

// expire forgets routers disconnected past the stale bound.
func (a *Allocator) expire(now time.Time) {
	for id, rs := range a.routers {
		if rs.gone && now.Sub(rs.goneAt) >= a.opts.StaleAfter {
			delete(a.routers, id)
			for _, grants := range a.grants {
				for _, byRouter := range grants {
					delete(byRouter, id)
				}
			}
		}
	}
}

// plan computes every worker's next window records and, by dimension, the
// routers whose share decreased (awaiting an acknowledgement).
func (a *Allocator) plan(workers []*registry.Worker, now time.Time) (map[string]update, [numDims]map[string][]string) {
	ids := slices.Sorted(maps.Keys(a.routers))
	warmup := a.opts.Warmup
	if a.held {
		warmup = max(warmup, a.opts.HeldWarmup)
	}
	warm := now.Sub(a.started) >= warmup
	updates := make(map[string]update)
	decreased := [numDims]map[string][]string{{}, {}}
	seen := a.seen
	clear(seen)
	for _, w := range workers {
		seen[w.ID] = true
		var next registry.Shares
		if w.External() {
			// A provider has no running window, only its spill-over budget.
			next.WindowShare = spillShares(w, ids, warm)
			delete(a.grants[dimRooms], w.ID)
			delete(a.grants[dimTokens], w.ID)
		} else {
			window, adm := a.windowOf(w, now)
			tokens, budget := a.budgetOf(w)
			next = registry.Shares{Admission: adm, Budget: budget,
				WindowShare: a.planDim(dimRooms, w, window, ids, warm, decreased[dimRooms]),
				TokenShare:  a.planDim(dimTokens, w, tokens, ids, warm, decreased[dimTokens])}
		}
		if !next.Equal(&w.Shares) {
			updates[w.ID] = update{from: &w.Registered, shares: next}
		}
	}
	a.forget(seen)
	return updates, decreased
}

// forget drops what is kept of the workers not in seen.
func (a *Allocator) forget(seen map[string]bool) {
	for _, grants := range a.grants {
		maps.DeleteFunc(grants, func(id string, _ map[string]*grant) bool { return !seen[id] })
	}
	maps.DeleteFunc(a.kv, func(id string, _ *kvLearner) bool { return !seen[id] })
	a.learners.Range(func(id string, l *learner) bool {
		if !seen[id] {
			a.learners.CompareAndDelete(id, l)
		}
		return true
	})
}

// planDim splits w's window in dimension dim (rooms or tokens) over the
// routers (nil with no window or no router), noting the routers whose share
// decreased in dec.
func (a *Allocator) planDim(dim int, w *registry.Worker, window int64, ids []string, warm bool, dec map[string][]string) map[string]int64 {
	if window <= 0 {
		delete(a.grants[dim], w.ID)
		return nil
	}
	if len(ids) == 0 {
		return nil
	}
	byRouter := a.grants[dim][w.ID]
	if byRouter == nil {
		byRouter = make(map[string]*grant)
		a.grants[dim][w.ID] = byRouter
	}
	in := make([]RouterInput, 0, len(ids))
	for _, id := range ids {
		rs := a.routers[id]
		inFlight, waiting, byClass := demandOf(dim, rs.demand[w.ID])
		g := byRouter[id]
		if g == nil {
			// First heard of in this term: what it reports in flight is a
			// share a previous control plane granted. It is adopted as its
			// share, so those rooms go to no other router.
			g = &grant{share: inFlight, held: inFlight}
			byRouter[id] = g
		}
		ri := RouterInput{ID: id, Share: g.share, Held: max(g.share, g.held)}
		if !rs.gone {
			ri.Demand, ri.Waiting = inFlight+waiting, waiting
			ri.WaitingByClass = byClass
			if ri.Waiting > 0 {
				// A router that still waits (or refuses) uses its whole
				// share: rooms that freed a moment before its report are
				// not spare, and moving them would idle them for an
				// acknowledgement's round trip.
				ri.Demand = max(ri.Demand, g.share+ri.Waiting)
			}
		}
		in = append(in, ri)
	}
	var next []int64
	if warm {
		next = Plan(window, in)
	} else {
		next = make([]int64, len(in))
		for i, r := range in {
			next[i] = min(r.Share, window) // no growth while warming up
		}
	}
	shares := make(map[string]int64, len(in))
	var decreased []string
	for i, r := range in {
		if a.routers[r.ID].gone {
			next[i] = r.Share // a disconnected router keeps its share until the stale bound
		}
		shares[r.ID] = next[i]
		g := byRouter[r.ID]
		g.share = next[i]
		switch {
		case next[i] > r.Share:
			g.held = max(g.held, next[i])
		case next[i] < r.Share:
			g.held = max(g.held, r.Share)
			decreased = append(decreased, r.ID)
		}
	}
	if len(decreased) > 0 {
		dec[w.ID] = decreased
	}
	return shares
}

// SpillParts is a whole spill-over budget in the parts routers are granted.
const SpillParts = 1_000_000

// spillShares splits an external worker's spill-over budget evenly among
// the routers known, in millionths. While warming up no part grows, so
// routers reconnecting to a new leader are not each granted the whole
// budget before the others report.
func spillShares(w *registry.Worker, ids []string, warm bool) map[string]int64 {
	if !registry.SpillBudget(w) || len(ids) == 0 {
		return nil
	}
	part := int64(SpillParts / len(ids))
	shares := make(map[string]int64, len(ids))
	for _, id := range ids {
		shares[id] = part
		if !warm {
			shares[id] = min(part, w.WindowShare[id])
		}
	}
	return shares
}

// windowOf returns the rooms to split for w and, for an admission window,
// its record: a decode worker's running window; with Admission, a regular
// worker's window from the spec, else the engine, else learned, plus the
// queue allowance.
func (a *Allocator) windowOf(w *registry.Worker, now time.Time) (int64, *registry.Admission) {
	switch {
	case w.Type == "decode":
		return w.MaxRunning(), nil
	case w.Type == "prefill" || !a.opts.Admission:
		return 0, nil
	}
	l := a.learner(w.ID)
	l.mu.Lock()
	l.contactAgain(w.ContactSeq, now)
	if !l.fed && w.Load != nil && w.LoadRevision != l.rev {
		// Nothing feeds this worker's reports (a caller without
		// ObserveLoad): learn from the latest one stored.
		l.rev = w.LoadRevision
		l.observe(observation(w.Load), now)
	}
	adm := &registry.Admission{Queue: a.opts.Queue}
	switch {
	case w.Spec.GetMaxRunningRequests() > 0:
		adm.Window, adm.Source = int64(w.Spec.GetMaxRunningRequests()), "spec"
	case w.Load.GetMaxRunningRequests() > 0:
		adm.Window, adm.Source = int64(w.Load.GetMaxRunningRequests()), "engine"
	default:
		l.probe(now, a.routersWaiting(w.ID))
		if l.limit > 0 {
			adm.Window, adm.Source = l.limit, "learned"
		}
	}
	adm.Learned, adm.LearnedBy = l.limit, l.basis
	if l.limit != l.logged || l.basis != l.loggedBy {
		l.logged, l.loggedBy = l.limit, l.basis
		a.log.Debug("Learned window", "worker_id", w.ID, "window", l.limit, "learned_by", l.basis, "probe_of", l.probeOf, "capped", l.capped,
			"running", l.last.Running, "waiting", l.last.Waiting)
	}
	l.mu.Unlock()
	return adm.Rooms(), adm
}

// learner returns worker id's learner, made on first use.
func (a *Allocator) learner(id string) *learner {
	if l, ok := a.learners.Load(id); ok {
		return l
	}
	l, _ := a.learners.LoadOrStore(id, &learner{})
	return l
}

// routersWaiting reports whether any connected router has requests waiting
// in it for a room on worker id (refused ones do not count: they wait nowhere).
func (a *Allocator) routersWaiting(id string) bool {
	for _, rs := range a.routers {
		if !rs.gone && rs.demand[id].GetQueued() > 0 {
			return true
		}
	}
	return false
}

// ObserveLoad folds one engine report of a registered worker into its
// learned window (the evidence inbox calls it for every report, before
// coalescing); a window that goes down is committed by a round at once.
// It takes only the worker's own lock.
func (a *Allocator) ObserveLoad(workerID string, load *smgv1.EngineLoad) {
	if !a.opts.Admission || load == nil {
		return
	}
	l := a.learner(workerID)
	l.mu.Lock()
	l.fed = true
	lowered := l.observe(observation(load), a.opts.Now())
	l.mu.Unlock()
	if lowered {
		select {
		case a.kick <- struct{}{}:
		default: // a round is already due
		}
	}
}

// observation reads a load report's signals, summed over ranks.
func observation(load *smgv1.EngineLoad) Observation {
	ranks := load.GetRanks()
	if len(ranks) == 0 {
		return Observation{Running: int64(max(0, load.GetRunningRequests())), Waiting: int64(max(0, load.GetWaitingRequests())),
			Usage: usage(load.GetTokenUsage())}
	}
	var o Observation
	for _, r := range ranks {
		o.Running += int64(max(0, r.GetRunningRequests()))
		o.Waiting += int64(max(0, r.GetWaitingRequests()))
		o.Usage += usage(r.GetTokenUsage())
	}
	o.Usage /= float64(len(ranks))
	return o
}

// usage keeps a KV usage in [0, 1] (NaN: 0).
func usage(v float64) float64 {
	if !(v > 0) {
		return 0
	}
	return min(v, 1)
}
