package admission

import (
	"sync"
	"sync/atomic"
)

// Gate is one worker's running window as this router holds it: the rooms it
// may fill (its share, the whole window, or Unlimited) and the rooms its
// dispatched requests hold; and, under --worker-token-budget, the tokens it
// may hold (its share of the worker's token budget) and the tokens its
// requests hold (prompt plus expected output). It is the one gate type for
// PD decode windows and the running windows and token budgets of regular
// workers. Taking and giving back rooms alone is lock-free and allocates
// nothing; requests that find no room wait in their pool's Waitlist, which
// the caller pokes when a room frees.
type Gate struct {
	limit    atomic.Int64 // Unlimited or rooms
	inFlight atomic.Int64 // rooms held by dispatched requests
	window   atomic.Int64 // the worker's whole window (0: none), for the wider-than-the-window rule

	tokLimit  atomic.Int64 // Unlimited or tokens
	tokens    atomic.Int64 // tokens held by dispatched requests
	tokBudget atomic.Int64 // the worker's whole token budget (0: none)
	// tokMu serializes acquisitions that carry tokens: the token check and
	// the add happen together, so concurrent takers never pass the limit
	// (a release only lowers the count, so it needs no lock).
	tokMu sync.Mutex
}

// Set installs a new limit and whole window (a snapshot arrived).
func (g *Gate) Set(limit, window int64) {
	g.window.Store(window)
	g.limit.Store(limit)
}

// SetTokens installs a new token limit and whole token budget.
func (g *Gate) SetTokens(limit, budget int64) {
	g.tokBudget.Store(budget)
	g.tokLimit.Store(limit)
}

// Limit is the rooms this router may fill (Unlimited: never gated).
func (g *Gate) Limit() int64 { return g.limit.Load() }

// Window is the worker's whole window (0: none).
func (g *Gate) Window() int64 { return g.window.Load() }

// InFlight is the rooms this router's dispatched requests hold.
func (g *Gate) InFlight() int64 { return g.inFlight.Load() }

// TokenLimit is the tokens this router may hold (Unlimited: not gated by tokens).
func (g *Gate) TokenLimit() int64 { return g.tokLimit.Load() }

// TokenBudget is the worker's whole token budget (0: none).
func (g *Gate) TokenBudget() int64 { return g.tokBudget.Load() }

// Tokens is the tokens this router's dispatched requests hold.
func (g *Gate) Tokens() int64 { return g.tokens.Load() }

// HasRoom reports whether need rooms and tokens tokens fit now.
func (g *Gate) HasRoom(need, tokens int64) bool {
	l := g.limit.Load()
	if l != Unlimited && g.inFlight.Load()+need > l {
		return false
	}
	return g.tokensFit(tokens)
}

func (g *Gate) tokensFit(tokens int64) bool {
	l := g.tokLimit.Load()
	return tokens <= 0 || l == Unlimited || g.tokens.Load()+tokens <= l
}

// TryAcquire takes need rooms and tokens tokens if both fit.
func (g *Gate) TryAcquire(need, tokens int64) bool {
	if tokens <= 0 {
		return g.tryRooms(need)
	}
	g.tokMu.Lock()
	defer g.tokMu.Unlock()
	if !g.tokensFit(tokens) || !g.tryRooms(need) {
		return false
	}
	g.tokens.Add(tokens)
	return true
}

func (g *Gate) tryRooms(need int64) bool {
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

// Release gives need rooms and tokens tokens back. The caller then pokes
// the waitlists of the worker's pools, so they go to their waiters.
func (g *Gate) Release(need, tokens int64) {
	if tokens > 0 {
		g.tokens.Add(-tokens)
	}
	g.inFlight.Add(-need)
}

// TooWide reports whether need rooms exceed the worker's whole window: such a
// request can never be admitted there.
func (g *Gate) TooWide(need int64) bool {
	w := g.window.Load()
	return w > 0 && need > w
}

// TooManyTokens reports whether tokens exceed the worker's whole token
// budget: such a request can never be admitted there.
func (g *Gate) TooManyTokens(tokens int64) bool {
	b := g.tokBudget.Load()
	return b > 0 && tokens > b
}

// GateLimit is the number of rooms this router may hold on a worker whose
// whole window (plus queue allowance) is rooms, given the share the control
// plane granted it (0: no allocator; < 0: none granted yet). perRouter
// counts against the whole window alone (the spec's per-gateway counting).
// Token budgets and their shares follow the same rule, in tokens.
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
