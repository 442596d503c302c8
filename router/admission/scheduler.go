package admission

import (
	"container/list"
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Unlimited is a capacity or a gate limit that never blocks (no window known).
const Unlimited = -1

// Ticket is one request's slot in the Scheduler. A nil ticket (the
// Limiter's) is never preempted.
type Ticket struct {
	s        *Scheduler
	class    Class
	tenant   *tenantState  // with fair shares on
	pool     *poolSlots    // the model's slots it also holds
	admitted time.Time     // when it took its slot
	elem     *list.Element // in s.running[class] while it holds the slot; guarded by s.mu
	borrowed bool          // a peer router's room: holds no slot here
	packed   bool          // its tenant wanted more than its weighted share (pack_over_share)
	lent     bool          // this router's room lent to a peer (Lend)
	// state decides, with one compare-and-swap, "first byte sent" against
	// "chosen as victim".
	state     atomic.Int32
	preempted chan struct{} // closed when chosen as a victim
	onPreempt func()        // set before the ticket is shared; run once when preempted
}

const (
	ticketRunning   int32 = iota // admitted, nothing sent yet: may be preempted
	ticketStarted                // the first byte went out: never preempted
	ticketPreempted              // chosen as a victim: its slot is already back
	ticketReleased
)

// Class is the class the ticket was admitted in.
func (t *Ticket) Class() Class {
	if t == nil {
		return Default
	}
	return t.class
}

// Start marks the first response byte as about to be sent. It returns false
// when the request was preempted first: the caller must then send nothing
// but the preemption answer.
func (t *Ticket) Start() bool {
	if t == nil {
		return true
	}
	if t.state.CompareAndSwap(ticketRunning, ticketStarted) {
		return true
	}
	return t.state.Load() == ticketStarted
}

// Charge advances the virtual token counter of the ticket's tenant by tokens
// served to the request, of weight PromptTokenWeight or OutputTokenWeight
// (nothing without fair shares).
func (t *Ticket) Charge(tokens int64, weight float64) {
	if t == nil || t.tenant == nil || tokens <= 0 {
		return
	}
	s := t.s
	s.charge(t.tenant, float64(tokens)*weight)
	if s.m != nil {
		s.m.tokens.WithLabelValues(s.m.tenants.label(t.tenant.name)).Add(float64(tokens) * weight)
	}
}

func (s *Scheduler) charge(ts *tenantState, cost float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fair.charge(ts, cost)
}

// Fair reports whether the ticket's tenant has a virtual token counter to
// charge (fair shares on).
func (t *Ticket) Fair() bool { return t != nil && t.tenant != nil }

// Packed reports whether the request goes to workers in the fleet's fixed
// order rather than by the policy: with pack_over_share, its tenant wanted
// more than its weighted share on average, beside another active tenant,
// when it took its slot.
func (t *Ticket) Packed() bool { return t != nil && t.packed }

// Preempted is closed when the request is chosen as a victim.
func (t *Ticket) Preempted() <-chan struct{} { return t.preempted }

// OnPreempt registers f to run (once, inside the scheduler's lock, so it must
// only cancel) if the ticket is chosen as a victim: the router cancels the
// upstream request with it. Call it before sending anything upstream.
func (t *Ticket) OnPreempt(f func()) {
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	if t.state.Load() == ticketPreempted {
		f()
		return
	}
	t.onPreempt = f
}

// Release returns the slot (the answer ended, or the client left). Safe to
// call more than once and after a preemption.
func (t *Ticket) Release() {
	for {
		st := t.state.Load()
		if st == ticketPreempted || st == ticketReleased {
			return
		}
		if t.state.CompareAndSwap(st, ticketReleased) {
			break
		}
	}
	s := t.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if t.borrowed {
		held := s.cfg.Now().Sub(t.admitted)
		t.tenant.use.held(held)
		s.answers.held(held)
		return
	}
	s.running[t.class].Remove(t.elem)
	s.dropLocked(t)
	s.completions.Add(1)
	now := s.cfg.Now()
	// A lent room's holding time is the borrower's to count (its borrowed
	// ticket does): a loan the borrower closed at once, having taken
	// another peer's, held it for an instant and would drag every holding
	// time here down.
	if !t.lent {
		s.demand[t.class].held(now.Sub(t.admitted))
		s.answers.held(now.Sub(t.admitted))
		if t.tenant != nil {
			t.tenant.use.held(now.Sub(t.admitted))
		}
	}
	s.refreshReservedLocked(now)
	s.dispatchLocked()
	s.publishLocked()
}

type waiter struct {
	class    Class
	tenant   *tenantState // with fair shares on
	pool     *poolSlots
	enqueued time.Time
	elem     *list.Element
	ready    chan struct{}
	ticket   *Ticket // set when admitted from the queue
	refused  bool    // set when refused from the queue: over its fair share
	asking   bool    // asking the peers for a room: the dispatch passes it over
}

// Scheduler is the priority door (--priority-scheduler-enabled). It keeps
// SMG's client contract (the x-smg-priority header, four classes, the tenant
// clamp, per-class queues with their own size and timeout, reservations,
// starvation promotion, preemption before the first response byte) and admits
// against a capacity its caller keeps live: in a router, the sum of the window
// shares the control plane grants it, so the slots it hands out hold
// fleet-wide. It owns the queues and reservations; it knows no worker.
type Scheduler struct {
	cfg SchedulerConfig
	m   *SchedulerMetrics

	mu       sync.Mutex
	capacity int64             // Unlimited, or slots (may drop below total on a shrink)
	static   [NumClasses]int64 // the configured reservations, scaled to the capacity
	reserved [NumClasses]int64 // in force: static, or the class's demand with reserve_demand
	demand   [NumClasses]classDemand
	started  time.Time // when demand began to be counted
	inflight [NumClasses]int64
	total    int64
	queues   [NumClasses]*list.List // of *waiter, oldest first
	running  [NumClasses]*list.List // of *Ticket, in admission order
	fair     *vtc                   // per-tenant virtual token counters (nil: fair shares off)
	pools    map[string]*poolSlots  // per-model capacity (SetPoolCapacities)
	anyPool  poolSlots              // requests of a pool with no capacity of its own
	fleet    fleetTenants           // the other routers' tenants, for fair shares fleet-wide
	reasking bool                   // a waiter is asking the peers again (reborrow)
	answers  classDemand            // every answer's slot-holding time (its hold only): a tenant's prior

	completions atomic.Uint64 // answers ended, for the completion rate
}

// New builds a scheduler with cfg (validated by the caller) and an initial
// capacity (Unlimited or >= 0). m may be nil in tests that read no metrics.
func NewScheduler(cfg SchedulerConfig, capacity int64, m *SchedulerMetrics) *Scheduler {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Scheduler{cfg: cfg, m: m, started: cfg.Now(), anyPool: poolSlots{capacity: Unlimited}}
	if cfg.FairShare {
		s.fair = newVTC(cfg.Weight)
	}
	for _, c := range Classes {
		s.queues[c] = list.New()
		s.running[c] = list.New()
	}
	if m != nil {
		m.tenants.init(cfg.TenantMetricTopN, cfg.TenantMaxClass)
		for _, c := range Classes {
			m.sizeLimit.WithLabelValues(c.String()).Set(float64(cfg.Classes[c].QueueSize))
		}
	}
	s.setCapacityLocked(capacity) // not shared yet: no lock needed
	return s
}

// SchedulerConfig returns the configuration in force.
func (s *Scheduler) Config() *SchedulerConfig { return &s.cfg }

// SchedulerMetrics returns the metrics the scheduler reports to (may be nil).
func (s *Scheduler) Metrics() *SchedulerMetrics { return s.m }

// SetCapacity installs a new capacity (the router's shares changed) and
// admits whoever now fits. A shrink preempts nobody: admissions stop until
// the requests in flight fall under it.
func (s *Scheduler) SetCapacity(capacity int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if capacity == s.capacity {
		return
	}
	s.setCapacityLocked(capacity)
	s.dispatchLocked()
	s.publishLocked()
}

// setCapacityLocked scales the reservations down proportionally when their
// sum does not fit, instead of locking every lower class out.
func (s *Scheduler) setCapacityLocked(capacity int64) {
	s.capacity = capacity
	for _, c := range Classes {
		s.static[c] = s.cfg.Classes[c].Reserved
	}
	s.static = scaleToFit(s.static, capacity)
	s.refreshReservedLocked(s.cfg.Now())
}

// refreshReservedLocked sets the reservations in force: the configured ones,
// raised to the observed demand of every class with reserve_demand, scaled
// down proportionally when they no longer fit the capacity.
func (s *Scheduler) refreshReservedLocked(now time.Time) {
	if !s.cfg.ReservesDemand() {
		s.reserved = s.static
		return
	}
	r := s.static
	for _, c := range Classes {
		if s.cfg.Classes[c].ReserveDemand {
			r[c] = max(r[c], s.demand[c].slots(now, s.started))
		}
	}
	s.reserved = scaleToFit(r, s.capacity)
}

// scaleToFit scales reservations down proportionally when their sum exceeds
// the capacity.
func scaleToFit(r [NumClasses]int64, capacity int64) [NumClasses]int64 {
	var sum int64
	for _, n := range r {
		sum += n
	}
	if capacity == Unlimited || sum <= capacity {
		return r
	}
	for c := range r {
		r[c] = r[c] * capacity / sum
	}
	return r
}

// heldBackLocked is the higher classes' unused reservation, which class c
// may not take.
func (s *Scheduler) heldBackLocked(c Class) int64 {
	var n int64
	for h := System; h < c; h++ {
		n += max(0, s.reserved[h]-s.inflight[h])
	}
	return n
}

// fitsLocked: a slot is free for class c, respecting higher reservations,
// and one of pool p's own.
func (s *Scheduler) fitsLocked(c Class, p *poolSlots) bool {
	return p.room() && (s.capacity == Unlimited || s.total+1+s.heldBackLocked(c) <= s.capacity)
}

// Admit asks for a slot in class c, waiting in c's queue if none is free
// (Door: the caller's tenant is unknown, "anonymous" to fair shares).
func (s *Scheduler) Admit(ctx context.Context, c Class) (*Ticket, Result) {
	return s.AdmitTenant(ctx, c, "anonymous")
}

// AdmitTenant asks for a slot in class c for tenant, waiting in c's queue if
// none is free. With fair shares on, a tenant that holds its fair share of
// the capacity while another tenant is active is refused at once
// (OverFairShare): its own demand is what is missing.
func (s *Scheduler) AdmitTenant(ctx context.Context, c Class, tenant string) (*Ticket, Result) {
	return s.AdmitFor(ctx, c, tenant, "")
}

// AdmitFor is AdmitTenant for a request of pool (its model): it also needs
// one of the pool's own slots (SetPoolCapacities). Waiters of a pool that
// is full do not hold back those of another pool behind them.
func (s *Scheduler) AdmitFor(ctx context.Context, c Class, tenant, pool string) (*Ticket, Result) {
	return s.admit(ctx, c, tenant, pool, nil)
}

func (s *Scheduler) admit(ctx context.Context, c Class, tenant, pool string, borrow func() bool) (*Ticket, Result) {
	arrived := s.cfg.Now()
	a := s.arrive(c, tenant, pool, arrived, borrow != nil)
	waited := time.Duration(0)
	if a.ask {
		a = s.askOnArrival(c, a, arrived, borrow)
		waited = s.cfg.Now().Sub(arrived)
	}
	switch {
	case a.ticket != nil:
		s.observeAdmitted(c, waited)
		return a.ticket, Admitted
	case a.res == OverFairShare:
		return nil, s.refused(c, a.ts)
	case a.res == QueueFull:
		s.count(c, OutcomeQueueFull)
		return nil, QueueFull
	}
	return s.wait(ctx, a.w, arrived, borrow)
}

// arrival is what a request found on arrival: a ticket, a refusal (res), a
// place in the queue (w), or, with ask, a turn to ask the peers first (its
// tenant counted waiting meanwhile).
type arrival struct {
	ticket *Ticket
	res    Result
	w      *waiter
	ask    bool
	ts     *tenantState // with fair shares on
	p      *poolSlots
}

func (s *Scheduler) arrive(c Class, tenant, pool string, now time.Time, mayBorrow bool) (a arrival) {
	cc := &s.cfg.Classes[c]
	s.mu.Lock()
	defer s.mu.Unlock()
	a.p = s.poolLocked(pool)
	if cc.ReserveDemand {
		s.demand[c].arrive(now)
	}
	s.refreshReservedLocked(now) // a demand reservation decays between arrivals of its class
	if s.fair != nil {
		a.ts = s.fair.state(tenant)
		a.ts.use.arrive(now)
		if !s.cfg.FairShareWait && s.overShareLocked(a.ts, now) {
			s.fair.settle(a.ts)
			a.res = OverFairShare
			return a
		}
	}
	// Waiters of class c left queued after a dispatch are held by their
	// own pool or by the whole capacity; a newcomer of another pool passes
	// the former (it fits only if the whole capacity has room).
	if a.p.waiting[c] == 0 && (s.fitsLocked(c, a.p) || cc.CanPreempt && s.preemptForLocked(c, a.p)) {
		a.ticket = s.admitLocked(c, a.ts, a.p)
		s.publishLocked()
		return a
	}
	if mayBorrow && s.mayBorrowLocked(a.ts, now) {
		a.ts.waiting++ // busy while it asks: the tenant stays active here
		a.ask = true
		return a
	}
	s.queueLocked(c, &a, now)
	return a
}

// queueLocked puts the arrival a in c's queue, or refuses it (QueueFull).
func (s *Scheduler) queueLocked(c Class, a *arrival, arrived time.Time) {
	if s.queues[c].Len() >= s.cfg.Classes[c].QueueSize {
		if a.ts != nil {
			s.fair.settle(a.ts)
		}
		a.res = QueueFull
		return
	}
	w := &waiter{class: c, tenant: a.ts, pool: a.p, enqueued: arrived, ready: make(chan struct{})}
	if a.ts != nil {
		a.ts.waiting++
	}
	a.p.waiting[c]++
	w.elem = s.queues[c].PushBack(w)
	if a.ts != nil {
		// The queue may hold only waiters a free slot cannot go to (over
		// their share): the lowest counter among the others goes now.
		s.dispatchLocked()
	}
	s.publishLocked()
	a.w = w
}

// wait holds w in its queue until a slot, a refusal, a peer's loan, its
// class's timeout or the client's leaving.
func (s *Scheduler) wait(ctx context.Context, w *waiter, arrived time.Time, borrow func() bool) (*Ticket, Result) {
	c := w.class
	cc := &s.cfg.Classes[c]
	timeout := time.NewTimer(cc.QueueTimeout)
	defer timeout.Stop()
	// The starvation timer only re-runs the dispatch when the head may have
	// turned starving while nothing else happened (slots free but reserved).
	starving := time.NewTimer(cc.StarvationThreshold)
	defer starving.Stop()
	var reask <-chan time.Time // a waiter that may borrow asks the peers again
	if borrow != nil && w.tenant != nil {
		tick := time.NewTicker(BorrowEvery)
		defer tick.Stop()
		reask = tick.C
	}
	var res Result
	for res == Admitted {
		select {
		case <-reask:
			if t := s.reborrow(w, borrow); t != nil {
				s.observeAdmitted(c, s.cfg.Now().Sub(arrived))
				return t, Admitted
			}
		case <-w.ready:
			if w.ticket == nil {
				return nil, s.refused(c, w.tenant)
			}
			s.observeAdmitted(c, s.cfg.Now().Sub(arrived))
			return w.ticket, Admitted
		case <-starving.C:
			s.redispatch()
		case <-timeout.C:
			res = QueueTimeout
		case <-ctx.Done():
			res = Cancelled
		}
	}
	switch t, refused := s.leave(w); {
	case t != nil: // admitted while giving up: take it
		s.observeAdmitted(c, s.cfg.Now().Sub(arrived))
		return t, Admitted
	case refused: // refused while giving up
		return nil, s.refused(c, w.tenant)
	}
	if res == QueueTimeout {
		s.count(c, OutcomeQueueTimeout)
	} else {
		s.count(c, OutcomeClientCancelled)
	}
	return nil, res
}

// redispatch runs the dispatch (a head may have turned starving).
func (s *Scheduler) redispatch() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dispatchLocked()
	s.publishLocked()
}

// leave takes w off its queue as it gives up, unless it was admitted (its
// ticket) or refused meanwhile.
func (s *Scheduler) leave(w *waiter) (t *Ticket, refused bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w.ticket != nil || w.refused {
		return w.ticket, w.refused
	}
	s.dequeueLocked(w)
	s.dispatchLocked() // a new head may be starving already
	s.publishLocked()
	return nil, false
}

// dequeueLocked takes w off its queue, uncounting it.
func (s *Scheduler) dequeueLocked(w *waiter) {
	s.queues[w.class].Remove(w.elem)
	w.pool.waiting[w.class]--
	if w.tenant != nil {
		w.tenant.waiting--
		s.fair.settle(w.tenant)
	}
}

func (s *Scheduler) admitLocked(c Class, ts *tenantState, p *poolSlots) *Ticket {
	now := s.cfg.Now()
	t := &Ticket{s: s, class: c, tenant: ts, pool: p, admitted: now, preempted: make(chan struct{}), packed: s.packedLocked(ts, now)}
	if t.packed && s.m != nil {
		s.m.CountPacked(ts.name)
	}
	t.elem = s.running[c].PushBack(t)
	p.inflight++
	s.inflight[c]++
	s.total++
	if ts != nil {
		ts.inflight++
	}
	return t
}

// dropLocked uncounts an admitted request that gave its slot back or was
// preempted (the caller took it off s.running).
func (s *Scheduler) dropLocked(t *Ticket) {
	t.pool.inflight--
	s.inflight[t.class]--
	s.total--
	if t.tenant != nil {
		t.tenant.inflight--
		s.fair.settle(t.tenant)
	}
}

// nextLocked is the waiter of class c a free slot goes to: the oldest whose
// pool has a slot of its own, or with fair shares on the oldest of the
// tenant with the lowest counter among those. Unless over-share tenants wait
// (refuse_over_share: false), a waiter whose tenant is over its fair share
// when a slot is free for it is refused now, as it would have been on
// arrival: the slot stays for the others.
func (s *Scheduler) nextLocked(c Class) *waiter {
	now := s.cfg.Now()
	var over, fine []*tenantState // checked this call: the answer holds until a grant
	var best *waiter
	for e := s.queues[c].Front(); e != nil; {
		w := e.Value.(*waiter)
		e = e.Next()
		if !w.pool.room() || w.asking {
			continue
		}
		if s.fair == nil {
			return w
		}
		if !s.cfg.FairShareWait && s.fitsLocked(c, w.pool) && !slices.Contains(fine, w.tenant) {
			if !slices.Contains(over, w.tenant) {
				if !s.overShareLocked(w.tenant, now) {
					fine = append(fine, w.tenant)
				} else {
					over = append(over, w.tenant)
				}
			}
			if slices.Contains(over, w.tenant) {
				s.refuseLocked(w)
				continue
			}
		}
		if best == nil || w.tenant.counter < best.tenant.counter {
			best = w
		}
	}
	return best
}

// oldestLocked is the oldest waiter of class c whose pool has a slot of its
// own (nil: none).
func (s *Scheduler) oldestLocked(c Class) *waiter {
	for e := s.queues[c].Front(); e != nil; e = e.Next() {
		if w := e.Value.(*waiter); w.pool.room() && !w.asking {
			return w
		}
	}
	return nil
}

// refuseLocked takes w off its queue, refused: its tenant is over its share.
func (s *Scheduler) refuseLocked(w *waiter) {
	s.dequeueLocked(w)
	w.refused = true
	close(w.ready)
}

// refused counts a request refused over its tenant's fair share.
func (s *Scheduler) refused(c Class, ts *tenantState) Result {
	s.count(c, OutcomeOverFairShare)
	if s.m != nil {
		s.m.CountOverShare(ts.name)
	}
	return OverFairShare
}

// dispatchLocked hands free slots to waiters: first any head that waited past
// its starvation threshold (lowest class first; it may use a reserved but
// unused slot), then one head per class per pass, highest class first.
func (s *Scheduler) dispatchLocked() {
	now := s.cfg.Now()
	s.refreshReservedLocked(now)
	for progress := true; progress; {
		progress = false
		for c := Bulk; ; c-- {
			if s.capacity == Unlimited || s.total < s.capacity {
				if w := s.oldestLocked(c); w != nil && now.Sub(w.enqueued) >= s.cfg.Classes[c].StarvationThreshold {
					if s.fair != nil && !s.cfg.FairShareWait && s.overShareLocked(w.tenant, now) {
						s.refuseLocked(w) // starving or not, over its share
					} else {
						s.grantLocked(w)
						if s.m != nil {
							s.m.starvation.WithLabelValues(c.String()).Inc()
						}
					}
					progress = true
				}
			}
			if c == System {
				break
			}
		}
		for _, c := range Classes {
			if w := s.nextLocked(c); w != nil && s.fitsLocked(c, w.pool) {
				s.grantLocked(w)
				progress = true
			}
		}
	}
}

func (s *Scheduler) grantLocked(w *waiter) {
	s.queues[w.class].Remove(w.elem)
	w.pool.waiting[w.class]--
	if w.tenant != nil {
		w.tenant.waiting--
	}
	w.ticket = s.admitLocked(w.class, w.tenant, w.pool)
	close(w.ready)
}

// preemptForLocked cancels one strictly lower-class request that has sent no
// byte yet (lowest class first, then the most recently admitted), when that
// frees a slot class c may take in pool p: of p itself when p is full. It
// reports whether a slot was freed.
func (s *Scheduler) preemptForLocked(c Class, p *poolSlots) bool {
	if s.capacity != Unlimited && s.total+s.heldBackLocked(c) > s.capacity {
		return false // one freed slot would not be enough
	}
	full := !p.room()
	if full && p.inflight > p.capacity {
		return false // one freed slot of p would not be enough
	}
	for v := Bulk; v > c; v-- {
		for e := s.running[v].Back(); e != nil; e = e.Prev() {
			t := e.Value.(*Ticket)
			if full && t.pool != p {
				continue // frees none of p's slots
			}
			if !t.state.CompareAndSwap(ticketRunning, ticketPreempted) {
				continue // already sent a byte
			}
			s.running[v].Remove(e)
			s.dropLocked(t)
			close(t.preempted)
			if t.onPreempt != nil {
				t.onPreempt()
			}
			if s.m != nil {
				s.m.preemption.WithLabelValues(v.String(), c.String()).Inc()
				s.m.admitByClass[v][OutcomePreempted].Inc()
			}
			return true
		}
	}
	return false
}

func (s *Scheduler) observeAdmitted(c Class, waited time.Duration) {
	if s.m != nil {
		s.m.waitByClass[c].Observe(waited.Seconds())
		s.m.admitByClass[c][OutcomeAdmitted].Inc()
	}
}

func (s *Scheduler) count(c Class, outcome string) {
	if s.m != nil {
		s.m.admitByClass[c][outcome].Inc()
	}
}

// publishLocked refreshes the gauges.
func (s *Scheduler) publishLocked() {
	if s.m == nil {
		return
	}
	util := 0.0
	if s.capacity > 0 {
		util = float64(s.total) / float64(s.capacity)
	} else if s.capacity == 0 && s.total > 0 {
		util = 1
	}
	s.m.utilization.Set(util)
	for _, c := range Classes {
		n := c.String()
		s.m.inflight.WithLabelValues(n).Set(float64(s.inflight[c]))
		depth := s.queues[c].Len()
		s.m.depth.WithLabelValues(n).Set(float64(depth))
		queueP := 1.0
		if qs := s.cfg.Classes[c].QueueSize; qs > 0 {
			queueP = min(1, float64(depth)/float64(qs))
		} else if depth == 0 {
			queueP = 0
		}
		slotP := 0.0
		if s.capacity != Unlimited {
			if usable := s.capacity - s.heldBackLocked(c); usable <= 0 {
				slotP = 1
			} else {
				slotP = min(1, float64(s.total)/float64(usable))
			}
		}
		s.m.pressure.WithLabelValues(n).Set(max(queueP, slotP))
	}
}

// ClassDemand is one class's use of the capacity: slots held and requests
// waiting. Routers report it with their window demand so the allocator can
// serve higher classes first across routers.
type ClassDemand struct {
	InFlight, Waiting int64
}

// Demand returns every class's demand, highest first.
func (s *Scheduler) Demand() [NumClasses]ClassDemand {
	s.mu.Lock()
	defer s.mu.Unlock()
	var d [NumClasses]ClassDemand
	for _, c := range Classes {
		d[c] = ClassDemand{InFlight: s.inflight[c], Waiting: int64(s.queues[c].Len())}
	}
	return d
}

// Waiting is the number of requests queued at or above class c's priority:
// the queue ahead of a newcomer of class c.
func (s *Scheduler) Waiting(c Class) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for h := System; h <= c && h < NumClasses; h++ {
		n += int64(s.queues[h].Len())
	}
	return n
}

// Release gives an admitted request's slot back (Door).
func (s *Scheduler) Release(t *Ticket) { t.Release() }

// Completions is the number of admitted requests that ended (monotonic).
func (s *Scheduler) Completions() uint64 { return s.completions.Load() }
