package router

import (
	"sync"
	"sync/atomic"
)

// Breaker states.
const (
	breakerClosed int32 = iota
	breakerOpen
	breakerHalfOpen
)

type breakerConfig struct {
	disabled         bool
	failureThreshold int32
	successThreshold int32
	timeout          int64 // nanoseconds
}

// breaker is one worker's circuit breaker. Selection reads it with two atomic
// loads and no lock; only recording an outcome that changes state locks.
type breaker struct {
	state     atomic.Int32
	openUntil atomic.Int64 // monotonic nanoseconds; meaningful while open
	failures  atomic.Int32 // consecutive failures while closed

	mu        sync.Mutex
	successes int32 // consecutive successes while half-open
	// Cuts by evidence back off while the worker keeps failing this router
	// (reachable from the control plane, not from here): the next cut waits
	// cutGap after the last one, doubling from evidenceGapMin up to the
	// timeout, and a close starts over.
	lastCut, cutGap int64

	// heldUntil (monotonic nanoseconds) keeps the worker out of routing
	// whatever the breaker's state, even disabled: a provider's 429 asked
	// for that long (its Retry-After).
	heldUntil atomic.Int64
}

// allow reports whether the breaker lets a request through: closed, half-open,
// or open past its timeout (which counts as half-open).
func (b *breaker) allow(cfg *breakerConfig, now int64) bool {
	if now < b.heldUntil.Load() {
		return false
	}
	if cfg.disabled {
		return true
	}
	if b.state.Load() != breakerOpen {
		return true
	}
	return now >= b.openUntil.Load()
}

// success records a good answer. It returns true when the breaker closed.
func (b *breaker) success(cfg *breakerConfig, now int64) bool {
	if cfg.disabled {
		return false
	}
	if b.state.Load() == breakerClosed {
		if b.failures.Load() != 0 {
			b.failures.Store(0)
		}
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state.Load() {
	case breakerOpen:
		if now < b.openUntil.Load() {
			return false // a late answer from before the trip
		}
		b.state.Store(breakerHalfOpen)
		b.successes = 0
		fallthrough
	case breakerHalfOpen:
		b.successes++
		if b.successes >= cfg.successThreshold {
			b.close()
			return true
		}
	}
	return false
}

// failure records a failed attempt. It returns true when the breaker opened.
func (b *breaker) failure(cfg *breakerConfig, now int64) bool {
	if cfg.disabled {
		return false
	}
	if b.state.Load() == breakerClosed {
		if b.failures.Add(1) < cfg.failureThreshold {
			return false
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state.Load() {
	case breakerClosed:
		if b.failures.Load() < cfg.failureThreshold {
			return false
		}
	case breakerOpen:
		if now < b.openUntil.Load() {
			return false // already open
		}
	}
	// Closed past the threshold, half-open, or open past its timeout: (re)open.
	b.openUntil.Store(now + cfg.timeout)
	b.state.Store(breakerOpen)
	b.failures.Store(0)
	b.successes = 0
	return true
}

// hold keeps the worker out of routing until now (monotonic nanoseconds),
// or longer if an earlier hold lasts longer.
func (b *breaker) hold(until int64) {
	for {
		cur := b.heldUntil.Load()
		if cur >= until || b.heldUntil.CompareAndSwap(cur, until) {
			return
		}
	}
}

// evidenceGapMin is the wait between the first two cuts by evidence.
const evidenceGapMin = int64(1e9)

// evidence cuts an open breaker's timeout short: the worker answered the
// control plane since (a fresh load report: it restarted, or came back
// faster than the control plane judged it unreachable), so the breaker is
// half-open now: requests go through, --cb-success-threshold successes close
// it, and one failure reopens it for a whole timeout (a worker only this
// router cannot reach costs one failure per cut, and the cuts back off).
// It reports whether the timeout was cut.
func (b *breaker) evidence(cfg *breakerConfig, now int64) bool {
	if cfg.disabled || b.state.Load() != breakerOpen {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state.Load() != breakerOpen || b.openUntil.Load() <= now {
		return false
	}
	if b.cutGap > 0 && now < b.lastCut+b.cutGap {
		return false
	}
	b.lastCut = now
	b.cutGap = min(max(2*b.cutGap, evidenceGapMin), max(cfg.timeout, evidenceGapMin))
	b.openUntil.Store(now)
	return true
}

// reset closes the breaker at once: the control plane saw the worker alive,
// so re-admission is not held up by the breaker's timeout.
func (b *breaker) reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.close()
}

func (b *breaker) close() {
	b.state.Store(breakerClosed)
	b.failures.Store(0)
	b.successes = 0
	b.lastCut, b.cutGap = 0, 0
}
