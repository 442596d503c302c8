package admission

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Waiter is a request waiting for a room in one pool.
type Waiter struct {
	Need   int64 // rooms it takes
	Tokens int64 // tokens it takes (--worker-token-budget; 0: none)
	Class  Class // its place in the queue: highest class first
	// Try selects a worker with room and takes the room, keeping what it
	// found for its caller. It runs under the waitlist's lock; false means
	// "nothing yet, keep waiting". A selection that found no worker at all
	// returns true too: the caller answers it.
	Try func() bool
	// Yield marks a waiter whose Try may fail while a room is free (its
	// TTFT objective is met only on a worker that is full): it lets the
	// waiters behind it try that room instead of holding the line, and
	// joining with no time to wait it still takes a room the waiters left.
	Yield bool
	// Left, when set, makes the waiter wait only while its room is all but
	// sure to come in time (a TTFT objective's wait): it re-reads how much
	// longer the waiter may wait (<= 0: no longer; it runs under the
	// waitlist's lock), and the waiter is refused (RoomShed) as soon as
	// that is gone or its room is no longer sure within it (SureWait at its
	// place in the queue), re-evaluated on every grant pass (a room handed
	// to a waiter, one freed that it cannot use) and when the pace of
	// grants slows, rather than at the end of its wait.
	Left func() time.Duration

	ready  chan struct{} // closed once done or gave up
	done   bool
	gaveUp bool      // refused while waiting: its room is no longer sure in time
	since  time.Time // when it joined the queue
	end    time.Time // when its wait ends at the latest
}

// BypassFor is how long a waiter whose tokens fit no worker lets smaller
// waiters behind it pass (under --worker-token-budget): a short request
// need not wait behind a long one the budget cannot take yet, and the long
// one is not starved, since once it has waited this long nobody passes it.
const BypassFor = time.Second

// maxBypassTries bounds the waiters tried past a head that does not fit, per
// grant pass, so a long queue costs a release a few selections at most.
const maxBypassTries = 8

// RoomResult says how waiting for a room ended.
type RoomResult uint8

const (
	RoomAtOnce    RoomResult = iota // room at once
	RoomWaited                      // admitted after waiting
	RoomShed                        // full, and no room within the wait
	RoomTooWide                     // needs more rooms than the whole window (the caller's rule)
	RoomCancelled                   // the client left while waiting
	RoomQueueFull                   // the queue refused the waiter
)

// roomQueue orders the waiters of one pool (classQueue: highest class first,
// first come first served within a class). Every method runs under the
// waitlist's lock.
type roomQueue interface {
	// push adds w; false refuses it (the queue is full: answer at once).
	push(w *Waiter) bool
	// head is the waiter a freed room goes to next (nil: none).
	head() *Waiter
	remove(w *Waiter)
	len() int
	each(func(*Waiter))
}

// Waitlist holds the requests waiting for a room in one pool (one model's
// regular workers, or its decode workers). It outlives snapshots: a waiter
// re-selects against the newest view each time it is tried. A released room,
// a grown share and a waiter leaving each try the head again (Poke), so
// dispatch is driven by those events, never by polling.
type Waitlist struct {
	mu    sync.Mutex
	queue roomQueue
	n     atomic.Int64 // waiters, read lock-free on the release path
	// refused counts rooms asked for by requests that got no room (shed at
	// once or at the end of their wait) since the last report: demand the
	// control plane must see even when nobody is left waiting.
	refused       [NumClasses]atomic.Int64
	refusedTokens [NumClasses]atomic.Int64
	// grants are the times of the latest rooms handed to waiters (a ring,
	// newest at grantAt[(grantNext-1)%grantRing]), for ExpectedWait.
	grants    [grantRing]time.Time
	grantNext int
	// Now is the clock grants are timed on (nil: time.Now); set it before
	// the first use.
	Now func() time.Time
}

func (wl *Waitlist) now() time.Time {
	if wl.Now != nil {
		return wl.Now()
	}
	return time.Now()
}

// ExpectedWait reads the pace of the latest grants to waiters: grantRing of
// them, none older than grantWindow.
const (
	grantRing   = 16
	grantWindow = 10 * time.Second
	grantMin    = 4 // fewer recent grants say nothing of the pace
)

// ExpectedWait is how long a request joining the queue now should expect
// to wait for its room: the mean time between the latest grants to waiters
// (or the time since the last grant, when longer: the pace has slowed),
// once for each waiter before it and once for itself. ok is false while too
// few rooms were handed to waiters lately to tell (a pool seldom full).
func (wl *Waitlist) ExpectedWait() (d time.Duration, ok bool) {
	wl.mu.Lock()
	defer wl.mu.Unlock()
	gap, ok := wl.paceLocked(wl.now())
	return gap * time.Duration(wl.queue.len()+1), ok
}

// SureWait is the wait within which a request joining the queue now gets
// its room 99 times in 100 when rooms go to waiters at the pace of
// ExpectedWait, one at a time at random (a Poisson stream): the wait for
// the k-th room (k-1 waiters before it) is then k mean gaps give or take
// √k, and k + 3.5√k gaps bound it (within a few per cent of the Gamma
// distribution's 99th percentile for every k). A request told to wait
// only within this is seldom refused at the end of its wait.
func (wl *Waitlist) SureWait() (d time.Duration, ok bool) {
	wl.mu.Lock()
	defer wl.mu.Unlock()
	gap, ok := wl.paceLocked(wl.now())
	return time.Duration(float64(gap) * sureGaps(wl.queue.len()+1)), ok
}

// sureGaps is the number of mean gaps within which the k-th room comes 99
// times in 100 (see SureWait).
func sureGaps(k int) float64 { return float64(k) + 3.5*math.Sqrt(float64(k)) }

// newestGrant is the time of the latest grant to a waiter (zero: none).
func (wl *Waitlist) newestGrant() time.Time { return wl.grants[(wl.grantNext+grantRing-1)%grantRing] }

// paceLocked is the gap between grants to waiters at now.
func (wl *Waitlist) paceLocked(now time.Time) (gap time.Duration, ok bool) {
	newest := wl.newestGrant()
	oldest, k := newest, 0
	for i := range grantRing {
		t := wl.grants[(wl.grantNext+grantRing-1-i)%grantRing]
		if t.IsZero() || now.Sub(t) > grantWindow {
			break
		}
		oldest, k = t, k+1
	}
	if k < grantMin {
		return 0, false
	}
	return max(newest.Sub(oldest)/time.Duration(k-1), now.Sub(newest)), true
}

// NewWaitlist makes an empty waitlist.
func NewWaitlist() *Waitlist { return &Waitlist{queue: &classQueue{}} }

// Waiters is the number of requests waiting (lock-free).
func (wl *Waitlist) Waiters() int64 { return wl.n.Load() }

// Acquire takes a room through w.Try, waiting up to wait behind earlier
// waiters. While anyone waits, a newcomer queues behind them even when a room
// is free (first come, first served).
func (wl *Waitlist) Acquire(ctx context.Context, w *Waiter, wait time.Duration) RoomResult {
	if wl.n.Load() == 0 && w.Try() {
		return RoomAtOnce
	}
	res, next, joined := wl.join(w, wait)
	if !joined {
		return res
	}
	// The wait's end is timed on the timer's clock; Now times the pace.
	until := time.Now().Add(wait)
	t := time.NewTimer(min(next, wait))
	defer t.Stop()
	for {
		select {
		case <-w.ready:
			if w.gaveUp {
				return RoomShed // refused and counted by reevaluateLocked
			}
			return RoomWaited
		case <-t.C:
			next, again := wl.recheck(w, until)
			if !again {
				return wl.leave(w, RoomShed)
			}
			if next > 0 {
				t.Reset(next)
			}
		case <-ctx.Done():
			return wl.leave(w, RoomCancelled)
		}
	}
}

// Every locked section below releases the lock by defer: the callbacks it
// runs (Try, Left: worker selection) belong to other packages, and a panic
// in one, recovered by the HTTP server, must not leave the pool locked with
// every later request of that model hanging on it.

// join queues w, unless it takes a room at once or cannot wait (joined
// false: res is the answer). next is how long it waits before it is looked
// at again absent a grant pass.
func (wl *Waitlist) join(w *Waiter, wait time.Duration) (res RoomResult, next time.Duration, joined bool) {
	wl.mu.Lock()
	defer wl.mu.Unlock()
	if wl.queue.len() == 0 && w.Try() {
		return RoomAtOnce, 0, false
	}
	if wait <= 0 {
		if w.Yield {
			// The waiters take what they can first; a room none of them
			// can use is this one's.
			wl.grantLocked()
			if w.Try() {
				return RoomAtOnce, 0, false
			}
		}
		wl.refuse(w)
		return RoomShed, 0, false
	}
	w.ready, w.since = make(chan struct{}), wl.now()
	w.end = w.since.Add(wait)
	if !wl.queue.push(w) {
		return RoomQueueFull, 0, false
	}
	wl.n.Add(1)
	wl.grantLocked() // a room may have freed since the try above
	return RoomAtOnce, wl.recheckAtLocked(w), true
}

// recheck looks at waiter w when its timer fires: again (with how long
// until the next look; 0: it was answered meanwhile, ready is closed), or
// not: its wait is over.
func (wl *Waitlist) recheck(w *Waiter, until time.Time) (next time.Duration, again bool) {
	wl.mu.Lock()
	defer wl.mu.Unlock()
	if w.done || w.gaveUp {
		return 0, true
	}
	// Only a waiter with Left is looked at before its wait ends; one
	// without was timed to the end of its wait (from joining, so a little
	// before until): it is shed now.
	if left := time.Until(until); w.Left != nil && left > 0 && !wl.hopelessLocked(w, wl.placeLocked(w)) {
		return min(wl.recheckAtLocked(w), left), true // the pace slowed less than feared
	}
	return 0, false
}

// leave takes waiter w out of the queue with res, unless a room was
// granted (or a refusal given) as it left.
func (wl *Waitlist) leave(w *Waiter, res RoomResult) RoomResult {
	wl.mu.Lock()
	defer wl.mu.Unlock()
	if w.done { // granted while the timer fired: take it
		return RoomWaited
	}
	if w.gaveUp {
		return RoomShed
	}
	wl.queue.remove(w)
	wl.n.Add(-1)
	wl.grantLocked() // the leaver may have been the head blocking others
	if res == RoomShed {
		wl.refuse(w)
	}
	return res
}

// placeLocked is w's place in the queue (1: the head).
func (wl *Waitlist) placeLocked(w *Waiter) int {
	k, at := 0, 0
	wl.queue.each(func(x *Waiter) {
		k++
		if x == w {
			at = k
		}
	})
	return at
}

// hopelessLocked reports whether w (Left set), k-th in the queue, should
// stop waiting: nothing is left of its wait, or at the pace of grants its
// room is no longer sure within what is left (an unknown pace leaves it).
func (wl *Waitlist) hopelessLocked(w *Waiter, k int) bool {
	now := wl.now()
	left := min(w.end.Sub(now), w.Left())
	if left <= 0 {
		return true
	}
	gap, ok := wl.paceLocked(now)
	return ok && time.Duration(float64(gap)*sureGaps(k)) > left
}

// recheckAtLocked is how long w waits before it is looked at again absent
// any grant pass: the end of its wait, or, with Left and a known pace,
// sooner, when the time since the last grant (the pace's floor) would have
// grown too long for its room to be sure within what is left: with c sure
// gaps, end E and the last grant at g, where c·(t−g) = E−t.
func (wl *Waitlist) recheckAtLocked(w *Waiter) time.Duration {
	now := wl.now()
	end := w.end
	if w.Left == nil {
		return end.Sub(now)
	}
	if l := w.Left(); now.Add(l).Before(end) {
		end = now.Add(l)
	}
	if _, ok := wl.paceLocked(now); ok {
		c := sureGaps(max(wl.placeLocked(w), 1))
		g := wl.newestGrant()
		if t := g.Add(time.Duration((float64(end.Sub(g))) / (1 + c))); t.Before(end) {
			end = t
		}
	}
	return max(end.Sub(now), time.Millisecond)
}

// reevaluateLocked refuses the waiters with Left whose room is no longer
// sure in time (hopelessLocked), at their place in the queue now.
func (wl *Waitlist) reevaluateLocked() {
	var out []*Waiter
	k := 0
	wl.queue.each(func(w *Waiter) {
		k++
		if w.Left != nil && wl.hopelessLocked(w, k) {
			out = append(out, w)
		}
	})
	for _, w := range out {
		wl.queue.remove(w)
		wl.n.Add(-1)
		w.gaveUp = true
		close(w.ready)
		wl.refuse(w)
	}
}

// refuse counts w's rooms and tokens as refused demand.
func (wl *Waitlist) refuse(w *Waiter) {
	wl.refused[w.Class].Add(w.Need)
	wl.refusedTokens[w.Class].Add(w.Tokens)
}

// Poke hands freed rooms to waiters.
func (wl *Waitlist) Poke() {
	if wl.n.Load() == 0 {
		return
	}
	wl.mu.Lock()
	defer wl.mu.Unlock()
	wl.grantLocked()
}

// grantLocked serves waiters from the head while the head finds a room.
// A head that carries tokens and finds none lets smaller waiters behind it
// pass (bypassLocked) for BypassFor; a yielding head lets any pass.
func (wl *Waitlist) grantLocked() {
	defer wl.reevaluateLocked() // whoever is left: their places and the pace moved
	for {
		h := wl.queue.head()
		if h == nil {
			return
		}
		if !h.Try() {
			if h.Yield || h.Tokens > 0 && wl.now().Sub(h.since) < BypassFor {
				wl.bypassLocked(h)
			}
			return
		}
		wl.grantOne(h)
	}
}

// bypassLocked tries, past head h that found no room, the waiters that
// need fewer tokens than h (one needing as many would not fit either; any
// waiter past a yielding head), up to maxBypassTries of them, and grants
// those that find a room.
func (wl *Waitlist) bypassLocked(h *Waiter) {
	tried := 0
	var granted []*Waiter
	wl.queue.each(func(w *Waiter) {
		if w == h || !h.Yield && w.Tokens >= h.Tokens || tried >= maxBypassTries {
			return
		}
		tried++
		if w.Try() {
			granted = append(granted, w)
		}
	})
	for _, w := range granted {
		wl.grantOne(w)
	}
}

// grantOne hands w its room: out of the queue, and awake.
func (wl *Waitlist) grantOne(w *Waiter) {
	wl.queue.remove(w)
	wl.n.Add(-1)
	w.done = true
	close(w.ready)
	wl.grants[wl.grantNext] = wl.now()
	wl.grantNext = (wl.grantNext + 1) % grantRing
}

// TakeDemand is the demand a report carries: rooms and tokens asked for by
// waiters now plus those refused since the previous report (reset), by class.
func (wl *Waitlist) TakeDemand() (rooms, tokens [NumClasses]int64) {
	if wl.n.Load() > 0 {
		wl.mu.Lock()
		wl.queue.each(func(w *Waiter) {
			rooms[w.Class] += w.Need
			tokens[w.Class] += w.Tokens
		})
		wl.mu.Unlock()
	}
	for c := range rooms {
		rooms[c] += wl.refused[c].Swap(0)
		tokens[c] += wl.refusedTokens[c].Swap(0)
	}
	return rooms, tokens
}

// WaitingByClass sums the rooms asked for by waiters, by class.
func (wl *Waitlist) WaitingByClass() (out [NumClasses]int64) {
	if wl.n.Load() == 0 {
		return out
	}
	wl.mu.Lock()
	defer wl.mu.Unlock()
	wl.queue.each(func(w *Waiter) { out[w.Class] += w.Need })
	return out
}

// classQueue is one first-come-first-served queue per priority class; its
// head is the oldest waiter of the highest class waiting, so a freed room
// goes to an interactive request before a bulk one that came earlier. Without
// the scheduler every waiter is Default: one FIFO. No size limit (the wait
// bound, and the scheduler's queues, limit it).
type classQueue struct{ q [NumClasses][]*Waiter }

func (c *classQueue) push(w *Waiter) bool {
	k := min(w.Class, NumClasses-1)
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

func (c *classQueue) head() *Waiter {
	for _, q := range c.q {
		if len(q) > 0 {
			return q[0]
		}
	}
	return nil
}

func (c *classQueue) remove(w *Waiter) {
	k := min(w.Class, NumClasses-1)
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

func (c *classQueue) each(fn func(*Waiter)) {
	for _, q := range c.q {
		for _, w := range q {
			fn(w)
		}
	}
}
