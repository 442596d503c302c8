package bench

import (
	"fmt"
	"sync"
)

// How a client spreads requests over several routers (Config.Spread).
const (
	// SpreadRoundRobin sends each request to the next router in turn.
	SpreadRoundRobin = "round-robin"
	// SpreadLeastOutstanding sends each request to the router with the fewest
	// of this client's requests still open (ties: in turn), as a load
	// balancer's least-connections policy does: a router whose request just
	// ended, and whose window share therefore has a free room, gets the next
	// arrival instead of waiting for its turn.
	SpreadLeastOutstanding = "least-outstanding"
)

func validSpread(s string) error {
	switch s {
	case "", SpreadRoundRobin, SpreadLeastOutstanding:
		return nil
	}
	return fmt.Errorf("unknown spread %q (%s or %s)", s, SpreadRoundRobin, SpreadLeastOutstanding)
}

// spreader picks the router of each request.
type spreader struct {
	urls  []string
	least bool

	mu   sync.Mutex
	next int   // where the turn (or the tie-break scan) starts
	open []int // requests open per router
}

// newSpreader returns nil when there is nothing to spread.
func newSpreader(urls []string, mode string) *spreader {
	if len(urls) == 0 {
		return nil
	}
	return &spreader{urls: urls, least: mode == SpreadLeastOutstanding, open: make([]int, len(urls))}
}

// pick returns the index of the router for one request (-1 on a nil
// spreader) and the function to call when that request's answer has ended.
func (s *spreader) pick() (int, func()) {
	if s == nil {
		return -1, func() {}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.urls)
	best := s.next % n
	if s.least {
		for k := 1; k < n; k++ {
			if i := (s.next + k) % n; s.open[i] < s.open[best] {
				best = i
			}
		}
	}
	s.next = best + 1
	s.open[best]++
	return best, func() {
		s.mu.Lock()
		s.open[best]--
		s.mu.Unlock()
	}
}
