package admission

// poolSlots is one model's part of the scheduler's capacity: the slots of
// the windows of the workers that serve it (in a router, this router's
// shares of them). A request for the model holds one of them beside its
// slot in the whole capacity, so one model's idle rooms never admit
// another model's requests, and a model's backlog waits in the scheduler
// (by class and tenant) instead of holding slots another model could use.
type poolSlots struct {
	capacity int64 // Unlimited: no limit of its own
	inflight int64
	waiting  [NumClasses]int64 // queued requests of the pool, by class
}

// MaxPools bounds the pools SetPoolCapacities keeps (models served); the
// rest share the whole capacity only.
const MaxPools = 4096

// SetPoolCapacities installs each pool's capacity (model -> slots, or
// Unlimited) and admits whoever now fits. A pool it does not list has no
// limit of its own: its requests count against the whole capacity only
// (requests naming no model, or a model no worker serves).
func (s *Scheduler) SetPoolCapacities(caps map[string]int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := false
	for name, p := range s.pools {
		if _, ok := caps[name]; !ok {
			p.capacity = Unlimited // detached: what still holds it counts nowhere
			delete(s.pools, name)
			changed = true
		}
	}
	for name, n := range caps {
		if n < Unlimited {
			n = 0
		}
		p := s.pools[name]
		if p == nil {
			if len(s.pools) >= MaxPools {
				continue
			}
			if s.pools == nil {
				s.pools = make(map[string]*poolSlots, len(caps))
			}
			p = &poolSlots{}
			s.pools[name] = p
		} else if p.capacity == n {
			continue
		}
		p.capacity, changed = n, true
	}
	if changed {
		s.dispatchLocked()
		s.publishLocked()
	}
}

// poolLocked is pool name's slots (the shared, unlimited pool for a name
// with no capacity of its own).
func (s *Scheduler) poolLocked(name string) *poolSlots {
	if p, ok := s.pools[name]; ok {
		return p
	}
	return &s.anyPool
}

// room reports whether the pool has a slot of its own free.
func (p *poolSlots) room() bool { return p.capacity == Unlimited || p.inflight < p.capacity }

// PoolCapacities returns a copy of the pools' capacities in force.
func (s *Scheduler) PoolCapacities() map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int64, len(s.pools))
	for name, p := range s.pools {
		out[name] = p.capacity
	}
	return out
}

// PoolWaiting returns the requests queued per pool with a capacity of its
// own and by class ("": every other request, which any pool may serve).
func (s *Scheduler) PoolWaiting() map[string][NumClasses]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string][NumClasses]int64, len(s.pools)+1)
	for name, p := range s.pools {
		if p.waiting != ([NumClasses]int64{}) {
			out[name] = p.waiting
		}
	}
	if s.anyPool.waiting != ([NumClasses]int64{}) {
		out[""] = s.anyPool.waiting
	}
	return out
}
