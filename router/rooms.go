package router

import (
	"context"
	"github.com/prometheus/client_golang/prometheus"
	"net/http"
	"time"

	"github.com/smg-project/smg/router/admission"
)

// Window modes (--pd-window-mode, --worker-admission-window-mode).
const (
	// PDWindowShared gates each worker within the share of its running
	// window that the control plane grants this router, so the window is
	// bounded fleet-wide whatever the number of routers.
	PDWindowShared = "shared"
	// PDWindowPerRouter counts against the whole window in every router alone
	// (the spec's per-gateway counting): N routers may put N windows in flight.
	PDWindowPerRouter = "per-router"
)

// windowRooms is the window a worker is gated on in this router (0: none):
// a decode worker's running window when PD is routed, a regular worker's
// admission rooms when --worker-admission-window is on.
func (r *Router) windowRooms(w *Worker) (rooms int64, mode string) {
	switch {
	case w.Type == TypeDecode:
		return w.MaxRunning, r.opts.PDWindowMode
	case w.Type == TypePrefill || !r.opts.WorkerAdmissionWindow:
		return 0, ""
	}
	return w.AdmissionRooms, r.opts.WorkerAdmissionWindowMode
}

// WindowDemand is this router's use of one worker's window, reported to the
// control plane so that shares move toward the routers that wait.
type WindowDemand struct {
	WorkerID string
	InFlight int64 // rooms held by dispatched requests
	Waiting  int64 // rooms asked for by requests waiting for this worker's pool, or refused since the last report
	// WaitingByClass splits Waiting by priority class (index 0 the highest);
	// the allocator serves higher classes first.
	WaitingByClass [admission.NumClasses]int64
	// Queued is the part of Waiting held in this router now (not refused):
	// the allocator never probes a learned window up while it is above 0.
	Queued int64
	// Under --worker-token-budget, the same in tokens: held by dispatched
	// requests, and asked for by waiting or refused ones (by class).
	TokensInFlight       int64
	TokensWaiting        int64
	TokensWaitingByClass [admission.NumClasses]int64
}

// tokenBudget is the token budget a worker is gated on in this router (0:
// none): a regular worker's, under --worker-token-budget.
func (r *Router) tokenBudget(w *Worker) int64 {
	if !r.opts.WorkerTokenBudget || w.Type == TypeDecode || w.Type == TypePrefill {
		return 0
	}
	return w.TokenBudget
}

// gating reports whether requests take rooms (or tokens) in gates: under
// --worker-admission-window or --worker-token-budget.
func (r *Router) gating() bool { return r.opts.WorkerAdmissionWindow || r.opts.WorkerTokenBudget }

// gated reports whether w has a window or a token budget in this router.
func (r *Router) gated(w *Worker) bool {
	rooms, _ := r.windowRooms(w)
	return rooms > 0 || r.tokenBudget(w) > 0
}

// windowDemand lists every worker with a window or a token budget (or,
// under --worker-token-budget, one to learn), idle ones too: a report of zero lets the control plane take a share back. A
// pool's waiting demand is spread over the gated workers of the pool
// (rounded up): any of them can serve it.
func (r *Router) windowDemand(v *view) []WindowDemand {
	var out []WindowDemand
	type pw struct {
		n       int64
		waiting [admission.NumClasses]int64
		tokens  [admission.NumClasses]int64
		queued  int64
	}
	pools := map[*admission.Waitlist]*pw{}
	for i := range v.size() {
		if !r.gated(v.worker(i)) {
			continue
		}
		for _, wl := range v.states[i].waitlists() {
			p := pools[wl]
			if p == nil {
				p = &pw{queued: wl.Waiters()}
				p.waiting, p.tokens = wl.TakeDemand()
				pools[wl] = p
			}
			p.n++
		}
	}
	// Requests queued in the priority scheduler wait for a room on a
	// regular windowed worker of their model (any, for those of no pool of
	// their own): their demand is spread over those workers, by class, so
	// the allocator grows this router's shares for them.
	var sched map[string][admission.NumClasses]int64
	var headroom int64
	regular := map[string]int64{}
	if r.sched != nil && r.schedFromFleet {
		sched = r.sched.PoolWaiting()
		// The free slots kept for under-share tenants (fair shares) are
		// rooms this router needs as much as its queue (none of them waits,
		// so they are not queued).
		headroom = r.sched.Headroom()
		for i := range v.size() {
			if w := v.worker(i); w.Type != TypeDecode {
				if rooms, _ := r.windowRooms(w); rooms > 0 {
					regular[""]++
					if w.Model != "" {
						regular[w.Model]++
					}
				}
			}
		}
	}
	spread := func(d *WindowDemand, waiting [admission.NumClasses]int64, over int64) {
		for c, n := range waiting {
			share := (n + over - 1) / over
			d.WaitingByClass[c] += share
			d.Waiting += share
			d.Queued += share
		}
	}
	for i := range v.size() {
		w := v.worker(i)
		// Under --worker-token-budget a worker without a budget yet is
		// reported too: the tokens held there teach the control plane its
		// KV capacity when its engine reports none.
		if !r.gated(w) && !(r.opts.WorkerTokenBudget && w.Type != TypeDecode && w.Type != TypePrefill) {
			continue
		}
		st := v.states[i]
		d := WindowDemand{WorkerID: w.ID, InFlight: st.gate.InFlight(), TokensInFlight: st.gate.Tokens()}
		if rooms, _ := r.windowRooms(w); len(sched) > 0 && rooms > 0 && w.Type != TypeDecode {
			if w.Model != "" {
				spread(&d, sched[w.Model], regular[w.Model])
			}
			spread(&d, sched[""], regular[""])
		}
		if rooms, _ := r.windowRooms(w); headroom > 0 && regular[""] > 0 && rooms > 0 && w.Type != TypeDecode {
			share := (headroom + regular[""] - 1) / regular[""]
			d.WaitingByClass[admission.Default] += share
			d.Waiting += share
		}
		for _, wl := range st.waitlists() {
			p := pools[wl]
			if p == nil {
				continue // not gated: counted in no pool
			}
			for c, n := range p.waiting {
				share := (n + p.n - 1) / p.n
				d.WaitingByClass[c] += share
				d.Waiting += share
			}
			for c, n := range p.tokens {
				share := (n + p.n - 1) / p.n
				d.TokensWaitingByClass[c] += share
				d.TokensWaiting += share
			}
			d.Queued += (p.queued + p.n - 1) / p.n
		}
		out = append(out, d)
	}
	return out
}

// roomGrant is where a waiter's request goes: worker i of view v (i < 0: no
// worker, see out).
type roomGrant struct {
	v   *view
	i   int32
	out outcome
}

// acquireRoomAfter takes q.need rooms on the worker the policy chose (i, out)
// when it has room and nobody waits before it; otherwise the request waits in
// its pool's waitlist (acquireRoom).
func (r *Router) acquireRoomAfter(ctx context.Context, v *view, p *pool, i int32, out outcome, model string, decode bool,
	q *request, wait time.Duration) (roomGrant, admission.RoomResult) {
	if i < 0 && out != full {
		return roomGrant{v: v, i: -1, out: out}, admission.RoomAtOnce // nothing to wait for: answer as the spec
	}
	if out != full && p.wl.Waiters() == 0 &&
		v.states[i].gate.TryAcquire(q.need, q.tokens) {
		return roomGrant{v: v, i: i, out: out}, admission.RoomAtOnce
	}
	return r.acquireRoom(ctx, p.wl, model, decode, q, wait)
}

// tooWideEverywhere reports whether need rooms exceed the whole window of
// every windowed worker of the pool (and at least one has a window): such a
// request is shed at once instead of waiting for nothing.
func (r *Router) tooWideEverywhere(v *view, p *pool, need int64) bool {
	if need <= 1 {
		return false
	}
	wide := false
	for _, i := range p.idx {
		g := &v.states[i].gate
		if !g.TooWide(need) {
			return false
		}
		wide = true
	}
	return wide
}

// writeWindowShed answers a request that found no room in time: the spec's
// shed answer (503 worker_overload_protection_shed, Retry-After), whatever
// --worker-overload-shed says, as the PD window does.
func (r *Router) writeWindowShed(w http.ResponseWriter, model, stage string, c prometheus.Counter) int {
	c.Inc()
	r.metrics.shed.WithLabelValues(stage).Inc()
	writeError(w, http.StatusServiceUnavailable, CodeShed,
		"All workers"+forModel(model)+" are overloaded", r.retryAfterShed())
	return http.StatusServiceUnavailable
}

// waitEnded answers a request whose wait for a room ended early: nothing
// when the client left, router_shutting_down when the router is stopping,
// and the shed answer when the request's own deadline passed first, so a
// waiting request never ends without an explicit answer.
func (r *Router) waitEnded(w http.ResponseWriter, in *http.Request, model, stage string, c prometheus.Counter) int {
	switch {
	case clientLeft(in):
		return statusClientClosed
	case r.stopping():
		writeError(w, http.StatusServiceUnavailable, CodeShuttingDown, "The router is shutting down; retry on another router", 1)
		return http.StatusServiceUnavailable
	}
	return r.writeWindowShed(w, model, stage, c)
}

// waitlistKey names the pool a waitlist serves.
type waitlistKey struct {
	decode bool
	model  string // "" : the pool of requests that name no model
}

// waitlistFor returns the persistent waitlist of a pool, creating it. Caller
// holds applyMu, or wlMu alone.
func (r *Router) waitlistFor(k waitlistKey) *admission.Waitlist {
	r.wlMu.Lock()
	defer r.wlMu.Unlock()
	wl := r.waitlists[k]
	if wl == nil {
		wl = admission.NewWaitlist()
		wl.Now = r.clock
		r.waitlists[k] = wl
	}
	return wl
}

// pokeAll tries every waitlist's head: limits changed.
func (r *Router) pokeAll() {
	r.wlMu.Lock()
	wls := make([]*admission.Waitlist, 0, len(r.waitlists))
	for _, wl := range r.waitlists {
		wls = append(wls, wl)
	}
	r.wlMu.Unlock()
	for _, wl := range wls {
		wl.Poke()
	}
}

// releaseRoom gives need rooms and tokens tokens of st back and hands them
// to its pools' waiters: the event that dispatches a waiting request.
func (r *Router) releaseRoom(st *workerState, need, tokens int64) {
	st.gate.Release(need, tokens)
	for _, wl := range st.waitlists() {
		wl.Poke()
	}
}

// acquireRoom is the wait path: it finds a worker with room in the pool
// (model, decode) whose waitlist is wl for q and takes q.need rooms there,
// waiting up to wait in the pool's waitlist when every eligible worker is
// full. The returned grant holds the room (release it with releaseRoom) when
// its out is chosen or a fallback. Under the priority scheduler q.class
// orders the wait.
func (r *Router) acquireRoom(ctx context.Context, wl *admission.Waitlist, model string, decode bool, q *request, wait time.Duration) (roomGrant, admission.RoomResult) {
	var g roomGrant
	w := &admission.Waiter{Need: q.need, Tokens: q.tokens, Class: q.class, Yield: q.ttftBy != 0}
	w.Try = func() (ok bool) {
		g, ok = r.tryRoom(model, decode, q)
		return ok
	}
	if q.ttftBy != 0 && !decode { // PD requests are not gated by objectives
		w.Left = func() time.Duration { return r.objectiveLeft(model, q) }
	}
	res := wl.Acquire(ctx, w, wait)
	return g, res
}

// tryRoom runs selection on the newest view with room required and takes the
// chosen worker's rooms. A lost race for the last room retries a few times,
// then waits.
func (r *Router) tryRoom(model string, decode bool, q *request) (roomGrant, bool) {
	v := r.view.Load()
	if v == nil {
		return roomGrant{i: -1, out: noneAvailable}, true
	}
	p := v.poolOf(model, decode)
	if p == nil {
		return roomGrant{v: v, i: -1, out: noneAvailable}, true
	}
	q.now = r.now()
	for range 3 {
		i, out := r.sel.choose(v, p, q, r.opts.WorkerOverloadShed)
		switch {
		case out == full:
			return roomGrant{}, false
		case i < 0:
			return roomGrant{v: v, i: -1, out: out}, true
		case v.states[i].gate.TryAcquire(q.need, q.tokens):
			return roomGrant{v: v, i: i, out: out}, true
		}
	}
	return roomGrant{}, false
}

// poolOf is the regular pool, or the decode pool, that serves model.
func (v *view) poolOf(model string, decode bool) *pool {
	if decode {
		if pp := v.pdPoolFor(model); pp != nil {
			return pp.decode
		}
		return nil
	}
	if model == "" {
		return v.all
	}
	return v.pools[model]
}
