package router

import (
	"context"
	"math"
	"sync"
	"time"
)

// admission is SMG's token bucket (--max-concurrent-requests,
// --rate-limit-tokens-per-second): a request needs a token and a concurrency
// slot. The bucket holds at most --max-concurrent-requests tokens (the burst)
// and that many requests are in flight at most. With a refill rate, tokens
// come back only with time, so completions cannot raise the admission rate;
// with rate 0 it is a plain concurrency limit (the token comes back when the
// answer ends). Waiters are served first come, first served: up to
// --queue-size wait, each for at most --queue-timeout-secs.
type admission struct {
	mu        sync.Mutex
	capacity  float64
	rate      float64 // tokens per second; 0: returned on completion instead
	tokens    float64
	inFlight  int64
	last      time.Time // of the last refill
	queue     []*admWaiter
	queueSize int
	timeout   time.Duration
	metrics   *metrics
	now       func() time.Time
}

type admWaiter struct {
	ready   chan struct{} // closed on grant
	wake    chan struct{} // the waiter became the head: (re)arm its refill timer
	granted bool
}

type admitResult uint8

const (
	admitted admitResult = iota
	admitQueueFull
	admitTimeout
	admitCanceled // the client went away while waiting
)

// admissionRetryAfter is the Retry-After (seconds) of admission refusals in
// --retry-after-mode interval: the gateway's own queue drains in well under
// the load monitor interval.
const admissionRetryAfter = 1

// newAdmission builds the bucket; rate < 0 means "unset": refill at limit
// tokens per second, as SMG does.
func newAdmission(limit int, rate float64, queueSize int, timeout time.Duration, m *metrics, now func() time.Time) *admission {
	if rate < 0 {
		rate = float64(limit)
	}
	return &admission{capacity: float64(limit), rate: rate, tokens: float64(limit), last: now(),
		queueSize: queueSize, timeout: timeout, metrics: m, now: now}
}

func (a *admission) refillLocked() {
	now := a.now()
	if a.rate > 0 {
		a.tokens = min(a.capacity, a.tokens+now.Sub(a.last).Seconds()*a.rate)
	}
	a.last = now
}

// tokenEpsilon absorbs float rounding in the refill, so a waiter whose timer
// was set for the instant the refill covers its token is admitted then.
const tokenEpsilon = 1e-9

func (a *admission) admitsLocked() bool {
	return a.tokens >= 1-tokenEpsilon && float64(a.inFlight+1) <= a.capacity
}

func (a *admission) takeLocked() {
	a.tokens--
	a.inFlight++
}

// grantLocked admits waiters from the head while the head fits. When the
// head changed, or wake is set (a slot freed), the head is woken so it
// (re)arms its refill timer.
func (a *admission) grantLocked(wake bool) {
	for len(a.queue) > 0 && a.admitsLocked() {
		w := a.queue[0]
		a.queue[0] = nil
		a.queue = a.queue[1:]
		a.takeLocked()
		w.granted = true
		close(w.ready)
		wake = true
	}
	if wake && len(a.queue) > 0 {
		select {
		case a.queue[0].wake <- struct{}{}:
		default:
		}
	}
}

// refillWaitLocked is how long head w waits for the refill to cover one
// token, or -1 when only a completion can admit it (no slot free, or no refill).
func (a *admission) refillWaitLocked(w *admWaiter) time.Duration {
	if a.rate <= 0 || len(a.queue) == 0 || a.queue[0] != w || float64(a.inFlight+1) > a.capacity {
		return -1
	}
	return max(time.Nanosecond, time.Duration(math.Ceil((1-a.tokens)/a.rate*float64(time.Second))))
}

func (a *admission) acquire(ctx context.Context) admitResult {
	a.mu.Lock()
	a.refillLocked()
	if len(a.queue) == 0 && a.admitsLocked() {
		a.takeLocked()
		a.mu.Unlock()
		a.metrics.rateLimit.WithLabelValues("allowed").Inc()
		return admitted
	}
	if len(a.queue) >= a.queueSize {
		a.mu.Unlock()
		a.metrics.rateLimit.WithLabelValues("rejected").Inc()
		a.metrics.admission.WithLabelValues("queue_full").Inc()
		return admitQueueFull
	}
	w := &admWaiter{ready: make(chan struct{}), wake: make(chan struct{}, 1)}
	a.queue = append(a.queue, w)
	a.metrics.queued.Inc()
	a.mu.Unlock()
	defer a.metrics.queued.Dec()

	deadline := time.NewTimer(a.timeout)
	defer deadline.Stop()
	var refill *time.Timer
	defer func() {
		if refill != nil {
			refill.Stop()
		}
	}()
	res := admitted
	for res == admitted {
		a.mu.Lock()
		a.refillLocked()
		a.grantLocked(false)
		wait := a.refillWaitLocked(w)
		a.mu.Unlock()
		var tick <-chan time.Time
		if wait >= 0 {
			if refill == nil {
				refill = time.NewTimer(wait)
			} else {
				refill.Reset(wait)
			}
			tick = refill.C
		}
		select {
		case <-w.ready:
			a.metrics.rateLimit.WithLabelValues("allowed").Inc()
			return admitted
		case <-w.wake:
		case <-tick:
		case <-deadline.C:
			res = admitTimeout
		case <-ctx.Done():
			res = admitCanceled
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if w.granted { // granted as the wait ended: take it
		a.metrics.rateLimit.WithLabelValues("allowed").Inc()
		return admitted
	}
	for i, q := range a.queue {
		if q == w {
			a.queue = append(a.queue[:i], a.queue[i+1:]...)
			break
		}
	}
	a.grantLocked(true) // the head may have been the one holding others back
	if res == admitTimeout {
		a.metrics.rateLimit.WithLabelValues("rejected").Inc()
		a.metrics.admission.WithLabelValues("queue_timeout").Inc()
	}
	return res
}

// release ends one admitted request: its concurrency slot frees; without a
// refill rate its token comes back too.
func (a *admission) release() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.inFlight--
	if a.rate <= 0 {
		a.tokens = min(a.capacity, a.tokens+1)
	}
	a.refillLocked()
	a.grantLocked(true)
}

// waitingCount is the number of requests queued for a token.
func (a *admission) waitingCount() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return int64(len(a.queue))
}
