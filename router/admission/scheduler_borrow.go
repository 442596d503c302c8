package admission

import (
	"context"
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
// with the relay) while another tenant is active, first calls borrow (outside
// the scheduler's lock): true when a peer lent it a room. The ticket then
// holds no slot here (the lender counts it) and still charges the tenant's
// counter here; Release ends it. Without fair shares, or when borrow is
// false, the request waits as with AdmitFor.
func (s *Scheduler) AdmitOrBorrow(ctx context.Context, c Class, tenant, pool string, borrow func() bool) (*Ticket, Result) {
	return s.admit(ctx, c, tenant, pool, borrow)
}

// Borrowed reports whether the ticket is a peer router's room.
func (t *Ticket) Borrowed() bool { return t != nil && t.borrowed }

// mayBorrowLocked: fair shares on, another tenant active, and ts holds less
// than its weighted share: the headroom the others keep for it is its own.
func (s *Scheduler) mayBorrowLocked(ts *tenantState, now time.Time) bool {
	if ts == nil || s.cfg.FairShareWait {
		return false
	}
	others, capacity := s.fleetLocked(now)
	if capacity == Unlimited || capacity <= 0 {
		return false
	}
	ds, mine, active := s.demandsLocked(ts, others, now)
	if !active {
		return false
	}
	for _, d := range ds {
		if d.Tenant == ts.name {
			return float64(mine) < float64(capacity)*d.Weight/weightSum(ds)
		}
	}
	return false
}

// borrowLocked asks borrow for a peer's room with the lock released. On a
// loan it returns a borrowed ticket; else, if a slot freed meanwhile (and
// nobody of the class waits for it), a ticket for it; else nil, the lock
// held again and the request to be queued.
func (s *Scheduler) borrowLocked(c Class, ts *tenantState, p *poolSlots, borrow func() bool) *Ticket {
	ts.waiting++ // busy while it asks: the tenant stays active here
	s.mu.Unlock()
	ok := borrow()
	s.mu.Lock()
	ts.waiting--
	if ok {
		s.fair.settle(ts) // it holds nothing here
		return &Ticket{s: s, class: c, tenant: ts, pool: p, admitted: s.cfg.Now(), borrowed: true, preempted: make(chan struct{})}
	}
	if p.waiting[c] == 0 && s.fitsLocked(c, p) {
		return s.admitLocked(c, ts, p)
	}
	return nil
}

// BorrowEvery is how often a waiter that may borrow asks the peers again:
// a room frees somewhere in the fleet several times as often as here.
const BorrowEvery = 10 * time.Millisecond

// reborrow asks the peers again for waiter w, while its tenant is still
// under its weighted share: on a loan, w leaves the queue with a borrowed
// ticket. The dispatch passes w over while it asks. One waiter asks at a
// time, so a long queue of small tenants does not multiply the asks.
func (s *Scheduler) reborrow(w *waiter, borrow func() bool) *Ticket {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reasking || w.ticket != nil || w.refused || !s.mayBorrowLocked(w.tenant, s.cfg.Now()) {
		return nil
	}
	w.asking, s.reasking = true, true
	s.mu.Unlock()
	ok := borrow()
	s.mu.Lock()
	w.asking, s.reasking = false, false
	if !ok {
		s.dispatchLocked() // a slot it was passed over for
		s.publishLocked()
		return nil
	}
	s.queues[w.class].Remove(w.elem)
	w.pool.waiting[w.class]--
	w.tenant.waiting--
	s.fair.settle(w.tenant)
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
	t.state.Store(ticketStarted)
	s.publishLocked()
	return t, Admitted
}
