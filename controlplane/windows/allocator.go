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
)

// Defaults for Options.
const (
	DefaultInterval = 250 * time.Millisecond
	DefaultWarmup   = time.Second
)

// Options configure an Allocator.
type Options struct {
	// Interval is how often shares are recomputed (default 250ms).
	Interval time.Duration
	// StaleAfter is how long a disconnected router keeps its share before it
	// returns to the others (--worker-stale-secs; 0: at once).
	StaleAfter time.Duration
	// Warmup is how long after start no share grows, so that routers that
	// still hold rooms from a previous control plane report them first.
	Warmup time.Duration
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

// Allocator keeps decode window shares in the registry. It implements
// watch.DemandSink.
type Allocator struct {
	reg     *registry.Registry
	opts    Options
	log     *slog.Logger
	started time.Time
	writes  prometheus.Counter

	mu      sync.Mutex
	routers map[string]*routerState
	// grants: worker id -> router id -> what the router may hold.
	grants map[string]map[string]*grant
}

type routerState struct {
	applied  uint64
	demand   map[string]*smgv1.DecodeDemand // by worker id, from the latest report
	gone     bool
	goneAt   time.Time
	reported bool
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
	if opts.Warmup < 0 {
		opts.Warmup = 0
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a := &Allocator{
		reg: reg, opts: opts, log: log, started: opts.Now(),
		routers: make(map[string]*routerState),
		grants:  make(map[string]map[string]*grant),
		writes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "smg_pd_window_share_updates_total",
			Help: "Registry writes that changed PD decode window shares.",
		}),
	}
	if m != nil {
		_ = m.Register(a.writes)
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
	}
	rs.gone, rs.reported, rs.applied = false, true, max(rs.applied, applied)
	rs.demand = make(map[string]*smgv1.DecodeDemand, len(demand))
	for _, d := range demand {
		rs.demand[d.GetWorkerId()] = d
	}
	// A report sent after the router applied a decrease bounds what it holds.
	for wid, byRouter := range a.grants {
		g := byRouter[routerID]
		if g == nil || (g.pending != 0 && rs.applied < g.pending) {
			continue
		}
		g.pending = 0
		g.held = rs.demand[wid].GetInFlight() // the share is added back in step
	}
}

// RouterDisconnected starts the stale bound of a router (watch.DemandSink).
func (a *Allocator) RouterDisconnected(routerID string, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if rs := a.routers[routerID]; rs != nil {
		rs.gone, rs.goneAt = true, now
	}
}

// Run recomputes shares every Interval until ctx ends.
func (a *Allocator) Run(ctx context.Context) {
	t := time.NewTicker(a.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := a.Step(); err != nil {
				a.log.Warn("PD window allocation failed", "err", err)
			}
		}
	}
}

// Step runs one allocation round and writes the shares that changed.
func (a *Allocator) Step() error {
	snap := a.reg.Snapshot()
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.opts.Now()
	for id, rs := range a.routers {
		if rs.gone && now.Sub(rs.goneAt) >= a.opts.StaleAfter {
			delete(a.routers, id) // its share returns to the others
			for _, byRouter := range a.grants {
				delete(byRouter, id)
			}
		}
	}
	ids := slices.Sorted(maps.Keys(a.routers))
	warm := now.Sub(a.started) >= a.opts.Warmup

	updates := make(map[string]map[string]int64) // worker -> new shares (nil: drop)
	decreased := make(map[string][]string)
	seen := make(map[string]bool)
	for _, w := range snap.Workers() {
		if w.Type != "decode" {
			continue
		}
		seen[w.ID] = true
		window := Window(w)
		if window <= 0 {
			if w.WindowShare != nil {
				updates[w.ID] = nil
			}
			delete(a.grants, w.ID)
			continue
		}
		byRouter := a.grants[w.ID]
		if byRouter == nil {
			byRouter = make(map[string]*grant)
			a.grants[w.ID] = byRouter
		}
		in := make([]RouterInput, 0, len(ids))
		for _, id := range ids {
			rs := a.routers[id]
			d := rs.demand[w.ID]
			g := byRouter[id]
			if g == nil {
				g = &grant{held: d.GetInFlight()}
				byRouter[id] = g
			}
			ri := RouterInput{ID: id, Share: g.share, Held: max(g.share, g.held)}
			if !rs.gone {
				ri.Demand, ri.Waiting = d.GetInFlight()+d.GetWaiting(), d.GetWaiting()
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
				decreased[w.ID] = append(decreased[w.ID], r.ID)
			}
		}
		for id := range byRouter {
			if _, ok := a.routers[id]; !ok {
				delete(byRouter, id)
			}
		}
		if !maps.Equal(shares, w.WindowShare) || (w.WindowShare == nil && len(shares) > 0) {
			updates[w.ID] = shares
		}
	}
	for id := range a.grants {
		if !seen[id] {
			delete(a.grants, id)
		}
	}
	if len(updates) == 0 {
		return nil
	}
	rev, err := a.reg.Update(func(t *registry.Txn) error {
		for id, shares := range updates {
			cur := t.Get(id)
			if cur == nil {
				continue
			}
			c := cur.Clone()
			c.WindowShare = shares
			if err := t.Insert(c); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	a.writes.Inc()
	for wid, routers := range decreased {
		for _, id := range routers {
			if g := a.grants[wid][id]; g != nil {
				g.pending = rev
			}
		}
	}
	return nil
}

// Window is a decode worker's running window: the engine's report, else the
// registered one; 0 when neither gives one.
func Window(w *registry.Worker) int64 {
	if n := int64(w.Load.GetMaxRunningRequests()); n > 0 {
		return n
	}
	return int64(w.Spec.GetMaxRunningRequests())
}
