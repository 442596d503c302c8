package router

import (
	"sync/atomic"
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

// unlimited is a gate limit that never blocks: no running window known.
const unlimited = -1

// gate is one worker's running window as this router holds it: the rooms
// it may fill (its share, the whole window, or unlimited) and the rooms its
// dispatched requests hold. It is the one gate type for PD decode windows and
// the running windows of regular workers. Taking and giving back a room is
// lock-free; requests that find no room wait in their pool's waitlist, which
// a release pokes.
type gate struct {
	limit    atomic.Int64 // unlimited or rooms
	inFlight atomic.Int64 // rooms held by dispatched requests
	window   atomic.Int64 // the worker's whole window (0: none), for the wider-than-the-window rule
}

// set installs a new limit and whole window (a snapshot arrived).
func (g *gate) set(limit, window int64) {
	g.window.Store(window)
	g.limit.Store(limit)
}

// hasRoom reports whether need rooms fit now.
func (g *gate) hasRoom(need int64) bool {
	l := g.limit.Load()
	return l == unlimited || g.inFlight.Load()+need <= l
}

// tryAcquire takes need rooms if they fit.
func (g *gate) tryAcquire(need int64) bool {
	for {
		l := g.limit.Load()
		cur := g.inFlight.Load()
		if l != unlimited && cur+need > l {
			return false
		}
		if g.inFlight.CompareAndSwap(cur, cur+need) {
			return true
		}
	}
}

// tooWide reports whether need rooms exceed the worker's whole window: such a
// request can never be admitted there.
func (g *gate) tooWide(need int64) bool {
	w := g.window.Load()
	return w > 0 && need > w
}

// gateLimit is the number of rooms this router may hold on a worker whose
// whole window (plus queue allowance) is rooms, given its share.
func gateLimit(rooms, share int64, mode string) int64 {
	if rooms <= 0 {
		return unlimited // no window: never gated
	}
	if mode == PDWindowPerRouter || share == 0 {
		// Per-gateway counting: a control plane that allocates no shares
		// leaves every router counting against the whole window.
		return rooms
	}
	if share < 0 {
		return 0 // the control plane granted this router no room (yet)
	}
	return min(share, rooms)
}

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
	WaitingByClass [NumClasses]int64
	// Queued is the part of Waiting held in this router now (not refused):
	// the allocator never probes a learned window up while it is above 0.
	Queued int64
}

// windowDemand lists every worker with a window, idle ones too: a report of
// zero lets the control plane take a share back. A pool's waiting demand is
// spread over the gated workers of the pool (rounded up): any of them can
// serve it.
func (r *Router) windowDemand(v *view) []WindowDemand {
	var out []WindowDemand
	type pw struct {
		n       int64
		waiting [NumClasses]int64
		queued  int64
	}
	pools := map[*waitlist]*pw{}
	for i := range v.size() {
		if rooms, _ := r.windowRooms(v.worker(i)); rooms <= 0 {
			continue
		}
		for _, wl := range v.states[i].waitlists() {
			p := pools[wl]
			if p == nil {
				p = &pw{queued: wl.n.Load(), waiting: wl.takeDemand()}
				pools[wl] = p
			}
			p.n++
		}
	}
	// Requests queued in the priority scheduler wait for a room on any
	// regular windowed worker: their demand is spread over those workers too,
	// by class, so the allocator grows this router's shares for them.
	var sched [NumClasses]int64
	var regular int64
	if r.sched != nil && r.schedFromFleet {
		for c, d := range r.sched.Demand() {
			sched[c] = d.Waiting
		}
		for i := range v.size() {
			if rooms, _ := r.windowRooms(v.worker(i)); rooms > 0 && v.worker(i).Type != TypeDecode {
				regular++
			}
		}
	}
	for i := range v.size() {
		w := v.worker(i)
		if rooms, _ := r.windowRooms(w); rooms <= 0 {
			continue
		}
		st := v.states[i]
		d := WindowDemand{WorkerID: w.ID, InFlight: st.gate.inFlight.Load()}
		if regular > 0 && w.Type != TypeDecode {
			for c, n := range sched {
				share := (n + regular - 1) / regular
				d.WaitingByClass[c] += share
				d.Waiting += share
				d.Queued += share
			}
		}
		for _, wl := range st.waitlists() {
			p := pools[wl]
			for c, n := range p.waiting {
				share := (n + p.n - 1) / p.n
				d.WaitingByClass[c] += share
				d.Waiting += share
			}
			d.Queued += (p.queued + p.n - 1) / p.n
		}
		out = append(out, d)
	}
	return out
}
