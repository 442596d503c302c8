package router

import (
	"context"
	"sync"
	"time"
)

// PD window modes (--pd-window-mode).
const (
	// PDWindowShared gates each decode worker within the share of its running
	// window that the control plane grants this router, so the window is
	// bounded fleet-wide whatever the number of routers.
	PDWindowShared = "shared"
	// PDWindowPerRouter counts against the whole window in every router alone
	// (the spec's per-gateway counting): N routers may put N windows in flight.
	PDWindowPerRouter = "per-router"
)

// unlimited is a gate limit that never blocks: no running window reported.
const unlimited = -1

// pdGate is one decode worker's admission window as this router holds it.
// Rooms go first come, first served: while anyone waits, a newcomer queues
// behind them even when a room is free, and a freed room goes to the request
// that has waited longest (the head waits until its whole need fits).
type pdGate struct {
	mu       sync.Mutex
	limit    int64 // rooms this router may hold: its share, the window, or unlimited
	inFlight int64 // rooms held by dispatched requests
	waiting  int64 // rooms asked for by queued requests
	queue    []*pdWaiter
}

type pdWaiter struct {
	need    int64
	ready   chan struct{} // closed when the rooms are granted
	granted bool
}

// gateResult says how an acquire ended.
type gateResult uint8

const (
	gateAdmitted gateResult = iota // room at once
	gateWaited                     // admitted after waiting
	gateShed                       // full, and no room within the wait
	gateTooWide                    // needs more rooms than the whole window
	gateCanceled                   // the client left while waiting
)

// setLimit installs a new limit (a snapshot arrived) and hands freed rooms to
// the queue.
func (g *pdGate) setLimit(limit int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.limit = limit
	g.grantLocked()
}

func (g *pdGate) fits(need int64) bool {
	return g.limit == unlimited || g.inFlight+need <= g.limit
}

// grantLocked admits waiters from the head while the head fits.
func (g *pdGate) grantLocked() {
	for len(g.queue) > 0 && g.fits(g.queue[0].need) {
		w := g.queue[0]
		g.queue[0] = nil
		g.queue = g.queue[1:]
		g.waiting -= w.need
		g.inFlight += w.need
		w.granted = true
		close(w.ready)
	}
}

// acquire takes need rooms, waiting up to wait behind earlier requests.
// window is the worker's whole running window (0: none), for the
// wider-than-the-window rule.
func (g *pdGate) acquire(ctx context.Context, need, window int64, wait time.Duration) gateResult {
	if window > 0 && need > window {
		return gateTooWide
	}
	g.mu.Lock()
	if len(g.queue) == 0 && g.fits(need) {
		g.inFlight += need
		g.mu.Unlock()
		return gateAdmitted
	}
	if wait <= 0 {
		g.mu.Unlock()
		return gateShed
	}
	w := &pdWaiter{need: need, ready: make(chan struct{})}
	g.queue = append(g.queue, w)
	g.waiting += need
	g.mu.Unlock()

	t := time.NewTimer(wait)
	defer t.Stop()
	var res gateResult
	select {
	case <-w.ready:
		return gateWaited
	case <-t.C:
		res = gateShed
	case <-ctx.Done():
		res = gateCanceled
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if w.granted { // granted while the timer fired: take it
		return gateWaited
	}
	for i, q := range g.queue {
		if q == w {
			g.queue = append(g.queue[:i], g.queue[i+1:]...)
			break
		}
	}
	g.waiting -= need
	// The head may have been the one blocking others that now fit.
	g.grantLocked()
	return res
}

// release returns need rooms and hands them to the queue.
func (g *pdGate) release(need int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.inFlight -= need
	g.grantLocked()
}

// demand returns the rooms held and the rooms asked for by waiters.
func (g *pdGate) demand() (inFlight, waiting int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.inFlight, g.waiting
}

// gateLimit is the number of rooms this router may hold on decode worker w.
func gateLimit(w *Worker, mode string) int64 {
	if w.MaxRunning <= 0 {
		return unlimited // no window reported: never gated
	}
	if mode == PDWindowPerRouter || w.WindowShare == 0 {
		// Per-gateway counting: a control plane that allocates no shares
		// leaves every router counting against the whole window.
		return w.MaxRunning
	}
	if w.WindowShare < 0 {
		return 0 // the control plane granted this router no room (yet)
	}
	return min(w.WindowShare, w.MaxRunning)
}

// DecodeDemand is this router's use of one decode worker's running window.
type DecodeDemand struct {
	WorkerID string
	InFlight int64 // rooms held by dispatched requests
	Waiting  int64 // rooms asked for by requests waiting in the gate
}

// pdDemand lists every decode worker with a running window, idle ones too:
// a report of zero lets the control plane take a share back.
func pdDemand(v *view) []DecodeDemand {
	var out []DecodeDemand
	for i := range v.workers {
		if w := &v.workers[i]; w.Type == TypeDecode && w.MaxRunning > 0 {
			in, wait := v.states[i].pd.demand()
			out = append(out, DecodeDemand{WorkerID: w.ID, InFlight: in, Waiting: wait})
		}
	}
	return out
}
