package router

import (
	"math"
	"sync"
	"time"

	"github.com/smg-project/smg/router/admission"
)

// completionMeter is an exponentially decayed rate of completed requests
// (answers that ended) on this router: each completion adds 1/tau, and the
// sum decays by e^(-dt/tau), so the value tracks completions per second over
// roughly the last tau.
type completionMeter struct {
	mu   sync.Mutex
	tau  float64 // seconds
	rate float64 // completions per second at last
	last time.Time
}

// completionTau is the meter's memory: long enough to smooth bursts of
// completions, short enough to follow a fleet that grows or shrinks.
const completionTau = 10 * time.Second

func newCompletionMeter(tau time.Duration) *completionMeter {
	return &completionMeter{tau: tau.Seconds()}
}

func (m *completionMeter) decayLocked(now time.Time) {
	if !m.last.IsZero() {
		if dt := now.Sub(m.last).Seconds(); dt > 0 {
			m.rate *= math.Exp(-dt / m.tau)
		}
	}
	m.last = now
}

// add records one completion at now.
func (m *completionMeter) add(now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.decayLocked(now)
	m.rate += 1 / m.tau
}

// perSecond is the completion rate at now.
func (m *completionMeter) perSecond(now time.Time) float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.decayLocked(now)
	return m.rate
}

// estimateRetryAfter is when a retry would be admitted: the requests queued
// ahead of it plus itself, each waiting for one completion, at the observed
// completion rate; whole seconds, rounded up, within [1, interval]. With no
// completion observed it is the interval.
func estimateRetryAfter(ahead int64, perSecond float64, interval int) int {
	if perSecond <= 0 || math.IsNaN(perSecond) {
		return max(1, interval)
	}
	secs := math.Ceil(float64(ahead+1) / perSecond)
	return int(max(1, min(float64(interval), secs)))
}

// waitingAhead is the requests queued in this router that a newcomer of
// class c would wait behind (every queued request without the scheduler).
func (r *Router) waitingAhead(c admission.Class) int64 {
	if r.door == nil {
		return 0
	}
	return r.door.Waiting(c)
}

// retryAfterShed is the Retry-After of a shed answer: the spec's load monitor
// interval, or the estimate in --retry-after-mode estimated.
func (r *Router) retryAfterShed() int {
	if r.opts.RetryAfterMode != RetryAfterEstimated {
		return r.loadMonitorInterval()
	}
	return estimateRetryAfter(r.waitingAhead(admission.Bulk), r.completions.perSecond(r.clock()), r.loadMonitorInterval())
}

// retryAfterQueued is the Retry-After of an admission or scheduler refusal
// (queue full, wait timed out): 1 second, or the estimate for the class.
func (r *Router) retryAfterQueued(c admission.Class) int {
	if r.opts.RetryAfterMode != RetryAfterEstimated {
		return admissionRetryAfter
	}
	return estimateRetryAfter(r.waitingAhead(c), r.completions.perSecond(r.clock()), r.loadMonitorInterval())
}
