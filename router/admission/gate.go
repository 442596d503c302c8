package admission

import "sync/atomic"

// Gate is one worker's running window as this router holds it: the rooms it
// may fill (its share, the whole window, or Unlimited) and the rooms its
// dispatched requests hold. It is the one gate type for PD decode windows and
// the running windows of regular workers. Taking and giving back a room is
// lock-free and allocates nothing; requests that find no room wait in their
// pool's Waitlist, which the caller pokes when a room frees.
type Gate struct {
	limit    atomic.Int64 // Unlimited or rooms
	inFlight atomic.Int64 // rooms held by dispatched requests
	window   atomic.Int64 // the worker's whole window (0: none), for the wider-than-the-window rule
}

// Set installs a new limit and whole window (a snapshot arrived).
func (g *Gate) Set(limit, window int64) {
	g.window.Store(window)
	g.limit.Store(limit)
}

// Limit is the rooms this router may fill (Unlimited: never gated).
func (g *Gate) Limit() int64 { return g.limit.Load() }

// Window is the worker's whole window (0: none).
func (g *Gate) Window() int64 { return g.window.Load() }

// InFlight is the rooms this router's dispatched requests hold.
func (g *Gate) InFlight() int64 { return g.inFlight.Load() }

// HasRoom reports whether need rooms fit now.
func (g *Gate) HasRoom(need int64) bool {
	l := g.limit.Load()
	return l == Unlimited || g.inFlight.Load()+need <= l
}

// TryAcquire takes need rooms if they fit.
func (g *Gate) TryAcquire(need int64) bool {
	for {
		l := g.limit.Load()
		cur := g.inFlight.Load()
		if l != Unlimited && cur+need > l {
			return false
		}
		if g.inFlight.CompareAndSwap(cur, cur+need) {
			return true
		}
	}
}

// Release gives need rooms back. The caller then pokes the waitlists of the
// worker's pools, so the rooms go to their waiters.
func (g *Gate) Release(need int64) { g.inFlight.Add(-need) }

// TooWide reports whether need rooms exceed the worker's whole window: such a
// request can never be admitted there.
func (g *Gate) TooWide(need int64) bool {
	w := g.window.Load()
	return w > 0 && need > w
}

// GateLimit is the number of rooms this router may hold on a worker whose
// whole window (plus queue allowance) is rooms, given the share the control
// plane granted it (0: no allocator; < 0: none granted yet). perRouter
// counts against the whole window alone (the spec's per-gateway counting).
func GateLimit(rooms, share int64, perRouter bool) int64 {
	if rooms <= 0 {
		return Unlimited // no window: never gated
	}
	if perRouter || share == 0 {
		// Per-gateway counting: a control plane that allocates no shares
		// leaves every router counting against the whole window.
		return rooms
	}
	if share < 0 {
		return 0 // the control plane granted this router no room (yet)
	}
	return min(share, rooms)
}
