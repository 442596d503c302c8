package admission

import (
	"context"
	"math"
	"time"
)

// Pooled headroom. An under-share tenant's headroom is split over the
// routers it sends through (headroomLocked), so a burst on one router finds
// its part there spent while another router keeps its own part free. With
// peer routers, such a request asks a peer for a room instead of waiting
// here for a completion: the peer admits it in its own scheduler, by the
// same fair-share rules (Lend), so the headroom is used wherever it is kept.

// AdmitOrBorrow is AdmitFor, except that a request that finds no free slot
// here, of a tenant that holds less than its weighted share (fleet-wide
// with the relay) while another tenant is active, first calls borrow (with
// no lock held): true when a peer lent it a room. The ticket then
// holds no slot here (the lender counts it) and still charges the tenant's
// counter here; Release ends it. Without fair shares, or when borrow is
// false, the request waits as with AdmitFor.
func (s *Scheduler) AdmitOrBorrow(ctx context.Context, c Class, tenant, pool string, borrow func() bool) (*Ticket, Result) {
	return s.admit(ctx, c, tenant, pool, borrow)
}

// Borrowed reports whether the ticket is a peer router's room.
func (t *Ticket) Borrowed() bool { return t != nil && t.borrowed }

// mayBorrowLocked: fair shares on, another tenant active, and ts holds less
// than its weighted share, or less than its burst while under its weighted
// share on average: the headroom the others keep for it is its own.
func (s *Scheduler) mayBorrowLocked(ts *tenantState, now time.Time) bool {
	if ts == nil || s.cfg.FairShareWait {
		return false
	}
	d, mine, weighted, ok := s.besideOthersLocked(ts, now)
	if !ok {
		return false
	}
	if float64(mine) < weighted {
		return true
	}
	// Under it on average: a burst borrows up to its burst.
	return d.Mean < weighted && float64(mine) < math.Ceil(d.Mean+headroomSD*math.Sqrt(d.Mean))
}

// askOnArrival asks borrow for a peer's room with no lock held (arrive
// counted the tenant waiting meanwhile). On a loan it returns a borrowed
// ticket; else, if a slot freed meanwhile (and nobody of the class waits
// for it), a ticket for it; else the request queues. A borrow that panics
// leaves the tenant counted out again, the lock free, and the panic going on.
func (s *Scheduler) askOnArrival(c Class, a arrival, arrived time.Time, borrow func() bool) arrival {
	answered := false
	defer func() {
		if !answered {
			s.stopAsking(a.ts)
		}
	}()
	ok := borrow()
	answered = true
	return s.answered(c, a, arrived, ok)
}

func (s *Scheduler) stopAsking(ts *tenantState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ts.waiting--
	s.fair.settle(ts)
	s.publishLocked()
}

// answered goes on with the arrival a after the peers' answer ok.
func (s *Scheduler) answered(c Class, a arrival, arrived time.Time, ok bool) arrival {
	s.mu.Lock()
	defer s.mu.Unlock()
	a.ts.waiting--
	a.ask = false
	switch {
	case ok:
		s.fair.settle(a.ts) // it holds nothing here
		a.ticket = &Ticket{s: s, class: c, tenant: a.ts, pool: a.p, admitted: s.cfg.Now(), borrowed: true, preempted: make(chan struct{})}
	case a.p.waiting[c] == 0 && s.fitsLocked(c, a.p):
		a.ticket = s.admitLocked(c, a.ts, a.p)
	default:
		s.queueLocked(c, &a, arrived)
		return a
	}
	s.publishLocked()
	return a
}

// BorrowEvery is how often a waiter that may borrow asks the peers again:
// a room frees somewhere in the fleet several times as often as here.
const BorrowEvery = 10 * time.Millisecond

// reborrow asks the peers again for waiter w, while its tenant is still
// under its weighted share: on a loan, w leaves the queue with a borrowed
// ticket. The dispatch passes w over while it asks, with no lock held. One
// waiter asks at a time, so a long queue of small tenants does not multiply
// the asks. A borrow that panics takes w off the queue (nobody would take
// a slot granted to it) and the panic goes on.
func (s *Scheduler) reborrow(w *waiter, borrow func() bool) *Ticket {
	if !s.startAsking(w) {
		return nil
	}
	answered := false
	defer func() {
		if !answered {
			s.reasked(w, false, true)
		}
	}()
	ok := borrow()
	answered = true
	return s.reasked(w, ok, false)
}

// startAsking marks w asking, when it may ask the peers now.
func (s *Scheduler) startAsking(w *waiter) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reasking || w.ticket != nil || w.refused || !s.mayBorrowLocked(w.tenant, s.cfg.Now()) {
		return false
	}
	w.asking, s.reasking = true, true
	return true
}

// reasked ends w's ask: with a loan (ok) w leaves the queue with a borrowed
// ticket; abandoned (the ask panicked), it leaves with none; else it waits
// on, and the dispatch may give it a slot it was passed over for.
func (s *Scheduler) reasked(w *waiter, ok, abandoned bool) *Ticket {
	s.mu.Lock()
	defer s.mu.Unlock()
	w.asking, s.reasking = false, false
	if abandoned || !ok {
		if abandoned {
			s.dequeueLocked(w)
		}
		s.dispatchLocked()
		s.publishLocked()
		return nil
	}
	s.dequeueLocked(w)
	s.publishLocked()
	return &Ticket{s: s, class: w.class, tenant: w.tenant, pool: w.pool, admitted: s.cfg.Now(), borrowed: true, preempted: make(chan struct{})}
}

// Lend admits, at once or not at all, a peer router's request of tenant in
// class c for a room of pool here: refused (OverFairShare) by the fair-share
// rules as an arrival here would be, and QueueFull when no slot is free
// after this router's own waiters had theirs. The ticket is marked started
// (a lent room is never preempted: the peer is using it); Release gives the
// slot back.
func (s *Scheduler) Lend(c Class, tenant, pool string) (*Ticket, Result) {
	now := s.cfg.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.poolLocked(pool)
	s.dispatchLocked() // this router's own waiters go first
	var ts *tenantState
	if s.fair != nil {
		ts = s.fair.state(tenant)
		if !s.cfg.FairShareWait && s.overShareLocked(ts, now) {
			s.fair.settle(ts)
			return nil, OverFairShare
		}
	}
	if p.waiting[c] > 0 || !s.fitsLocked(c, p) {
		if ts != nil {
			s.fair.settle(ts)
		}
		return nil, QueueFull
	}
	t := s.admitLocked(c, ts, p)
	t.lent = true
	t.state.Store(ticketStarted)
	s.publishLocked()
	return t, Admitted
}
