package router

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Priority classes, highest first (the scheduler's x-smg-priority values).
// With no scheduler every request is ClassDefault: one FIFO class.
const (
	ClassSystem = iota
	ClassInteractive
	ClassDefault
	ClassBulk
	NumClasses
)

// roomWaiter is a request waiting for a room in one pool.
type roomWaiter struct {
	need  int64
	class int
	since time.Time
	// try selects a worker with room and takes the room. It runs under the
	// waitlist's lock; ok=false means "nothing yet, keep waiting". A done
	// selection that found no worker at all (out is noneAvailable or
	// shedAll) ends the wait too.
	try func() (g roomGrant, ok bool)

	ready chan struct{} // closed once got is set
	got   roomGrant
	done  bool
}

// roomGrant is where a waiter's request goes: worker i of view v (i < 0: no
// worker, see out).
type roomGrant struct {
	v   *view
	i   int32
	out outcome
}

// roomQueue orders the waiters of one pool (classQueue: highest class first,
// first come first served within a class). Every method runs under the
// waitlist's lock.
type roomQueue interface {
	// push adds w; false refuses it (the queue is full: answer at once).
	push(w *roomWaiter) bool
	// head is the waiter a freed room goes to next (nil: none).
	head() *roomWaiter
	remove(w *roomWaiter)
	len() int
	each(func(*roomWaiter))
}

// waitlist holds the requests waiting for a room in one pool (one model's
// regular workers, or its decode workers). It outlives snapshots: a waiter
// re-selects against the newest view each time it is tried. A released room,
// a grown share and a waiter leaving each try the head again, so dispatch is
// driven by those events, never by polling.
type waitlist struct {
	mu    sync.Mutex
	queue roomQueue
	n     atomic.Int64 // waiters, read lock-free on the release path
	// refused counts rooms asked for by requests that got no room (shed at
	// once or at the end of their wait) since the last report: demand the
	// control plane must see even when nobody is left waiting.
	refused [NumClasses]atomic.Int64
}

func newWaitlist() *waitlist { return &waitlist{queue: &classQueue{}} }

// acquire takes a room through w.try, waiting up to wait behind earlier
// waiters. While anyone waits, a newcomer queues behind them even when a room
// is free (first come, first served).
func (wl *waitlist) acquire(ctx context.Context, w *roomWaiter, wait time.Duration) (roomGrant, gateResult) {
	if wl.n.Load() == 0 {
		if g, ok := w.try(); ok {
			return g, gateAdmitted
		}
	}
	wl.mu.Lock()
	if wl.queue.len() == 0 {
		if g, ok := w.try(); ok {
			wl.mu.Unlock()
			return g, gateAdmitted
		}
	}
	if wait <= 0 {
		wl.mu.Unlock()
		wl.refused[w.class].Add(w.need)
		return roomGrant{}, gateShed
	}
	w.ready = make(chan struct{})
	if !wl.queue.push(w) {
		wl.mu.Unlock()
		return roomGrant{}, gateQueueFull
	}
	wl.n.Add(1)
	wl.grantLocked() // a room may have freed since the try above
	wl.mu.Unlock()

	t := time.NewTimer(wait)
	defer t.Stop()
	var res gateResult
	select {
	case <-w.ready:
		return w.got, gateWaited
	case <-t.C:
		res = gateShed
	case <-ctx.Done():
		res = gateCanceled
	}
	wl.mu.Lock()
	defer wl.mu.Unlock()
	if w.done { // granted while the timer fired: take it
		return w.got, gateWaited
	}
	wl.queue.remove(w)
	wl.n.Add(-1)
	wl.grantLocked() // the leaver may have been the head blocking others
	if res == gateShed {
		wl.refused[w.class].Add(w.need)
	}
	return roomGrant{}, res
}

// poke hands freed rooms to waiters.
func (wl *waitlist) poke() {
	if wl.n.Load() == 0 {
		return
	}
	wl.mu.Lock()
	wl.grantLocked()
	wl.mu.Unlock()
}

// grantLocked serves waiters from the head while the head finds a room.
func (wl *waitlist) grantLocked() {
	for {
		h := wl.queue.head()
		if h == nil {
			return
		}
		g, ok := h.try()
		if !ok {
			return
		}
		wl.queue.remove(h)
		wl.n.Add(-1)
		h.got, h.done = g, true
		close(h.ready)
	}
}

// takeDemand is the demand a report carries: rooms asked for by waiters
// now plus those refused since the previous report (reset), by class.
func (wl *waitlist) takeDemand() [NumClasses]int64 {
	out := wl.waitingByClass()
	for c := range out {
		out[c] += wl.refused[c].Swap(0)
	}
	return out
}

// waitingByClass sums the rooms asked for by waiters, by class.
func (wl *waitlist) waitingByClass() (out [NumClasses]int64) {
	if wl.n.Load() == 0 {
		return out
	}
	wl.mu.Lock()
	defer wl.mu.Unlock()
	wl.queue.each(func(w *roomWaiter) { out[w.class] += w.need })
	return out
}

// classQueue is one first-come-first-served queue per priority class; its
// head is the oldest waiter of the highest class waiting, so a freed room
// goes to an interactive request before a bulk one that came earlier. Without
// the scheduler every waiter is ClassDefault: one FIFO. No size limit (the
// wait bound, and the scheduler's queues, limit it).
type classQueue struct{ q [NumClasses][]*roomWaiter }

func (c *classQueue) push(w *roomWaiter) bool {
	k := min(max(w.class, 0), NumClasses-1)
	c.q[k] = append(c.q[k], w)
	return true
}

func (c *classQueue) len() int {
	n := 0
	for _, q := range c.q {
		n += len(q)
	}
	return n
}

func (c *classQueue) head() *roomWaiter {
	for _, q := range c.q {
		if len(q) > 0 {
			return q[0]
		}
	}
	return nil
}

func (c *classQueue) remove(w *roomWaiter) {
	k := min(max(w.class, 0), NumClasses-1)
	q := c.q[k]
	for i, x := range q {
		if x == w {
			copy(q[i:], q[i+1:])
			q[len(q)-1] = nil
			c.q[k] = q[:len(q)-1]
			return
		}
	}
}

func (c *classQueue) each(fn func(*roomWaiter)) {
	for _, q := range c.q {
		for _, w := range q {
			fn(w)
		}
	}
}

// gateResult says how waiting for a room ended.
type gateResult uint8

const (
	gateAdmitted  gateResult = iota // room at once
	gateWaited                      // admitted after waiting
	gateShed                        // full, and no room within the wait
	gateTooWide                     // needs more rooms than the whole window
	gateCanceled                    // the client left while waiting
	gateQueueFull                   // the queue refused the waiter
)

// waitlistKey names the pool a waitlist serves.
type waitlistKey struct {
	decode bool
	model  string // "" : the pool of requests that name no model
}

// waitlistFor returns the persistent waitlist of a pool, creating it. Caller
// holds applyMu, or wlMu alone.
func (r *Router) waitlistFor(k waitlistKey) *waitlist {
	r.wlMu.Lock()
	defer r.wlMu.Unlock()
	wl := r.waitlists[k]
	if wl == nil {
		wl = newWaitlist()
		r.waitlists[k] = wl
	}
	return wl
}

// pokeAll tries every waitlist's head: limits changed.
func (r *Router) pokeAll() {
	r.wlMu.Lock()
	wls := make([]*waitlist, 0, len(r.waitlists))
	for _, wl := range r.waitlists {
		wls = append(wls, wl)
	}
	r.wlMu.Unlock()
	for _, wl := range wls {
		wl.poke()
	}
}

// releaseRoom gives need rooms of st back and hands them to its pools'
// waiters: the event that dispatches a waiting request.
func (r *Router) releaseRoom(st *workerState, need int64) {
	st.gate.inFlight.Add(-need)
	for _, wl := range st.waitlists() {
		wl.poke()
	}
}

// acquireRoom is the wait path: it finds a worker with room in the pool
// (model, decode) whose waitlist is wl for q and takes q.need rooms there, waiting up to wait in
// the pool's waitlist when every eligible worker is full. The returned grant
// holds the room (release it with releaseRoom) when its out is chosen or a
// fallback. The priority scheduler builds on this: it sets q.class and
// supplies the waitlist's queue order.
func (r *Router) acquireRoom(ctx context.Context, wl *waitlist, model string, decode bool, q *request, wait time.Duration) (roomGrant, gateResult) {
	w := &roomWaiter{need: q.need, class: q.class, since: r.clock()}
	w.try = func() (roomGrant, bool) { return r.tryRoom(model, decode, q) }
	return wl.acquire(ctx, w, wait)
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
		case v.states[i].gate.tryAcquire(q.need):
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
