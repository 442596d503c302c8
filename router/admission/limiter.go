package admission

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Limiter is SMG's token bucket, the door when the priority scheduler is off (--max-concurrent-requests,
// --rate-limit-tokens-per-second): a request needs a token and a concurrency
// slot. The bucket holds at most --max-concurrent-requests tokens (the burst)
// and that many requests are in flight at most. With a refill rate, tokens
// come back only with time, so completions cannot raise the admission rate;
// with rate 0 it is a plain concurrency limit (the token comes back when the
// answer ends). Waiters are served first come, first served: up to
// --queue-size wait, each for at most --queue-timeout-secs.
type Limiter struct {
	mu        sync.Mutex
	capacity  float64
	rate      float64 // tokens per second; 0: returned on completion instead
	tokens    float64
	inFlight  int64
	last      time.Time // of the last refill
	queue     []*admWaiter
	queueSize int
	timeout   time.Duration
	metrics   *LimiterMetrics
	now       func() time.Time
}

type admWaiter struct {
	ready   chan struct{} // closed on grant
	wake    chan struct{} // the waiter became the head: (re)arm its refill timer
	granted bool
}

// NewLimiter builds the bucket: limit tokens and requests in flight at most,
// refilled at rate tokens per second (rate < 0: unset, refill at limit per
// second as SMG does; 0: a token comes back when its answer ends), up to
// queueSize waiting each at most timeout. now is the clock.
func NewLimiter(limit int, rate float64, queueSize int, timeout time.Duration, m *LimiterMetrics, now func() time.Time) *Limiter {
	if rate < 0 {
		rate = float64(limit)
	}
	return &Limiter{capacity: float64(limit), rate: rate, tokens: float64(limit), last: now(),
		queueSize: queueSize, timeout: timeout, metrics: m, now: now}
}

func (a *Limiter) refillLocked() {
	now := a.now()
	if a.rate > 0 {
		a.tokens = min(a.capacity, a.tokens+now.Sub(a.last).Seconds()*a.rate)
	}
	a.last = now
}

// tokenEpsilon absorbs float rounding in the refill, so a waiter whose timer
// was set for the instant the refill covers its token is admitted then.
const tokenEpsilon = 1e-9

func (a *Limiter) admitsLocked() bool {
	return a.tokens >= 1-tokenEpsilon && float64(a.inFlight+1) <= a.capacity
}

func (a *Limiter) takeLocked() {
	a.tokens--
	a.inFlight++
}

// grantLocked admits waiters from the head while the head fits. When the
// head changed, or wake is set (a slot freed), the head is woken so it
// (re)arms its refill timer.
func (a *Limiter) grantLocked(wake bool) {
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
func (a *Limiter) refillWaitLocked(w *admWaiter) time.Duration {
	if a.rate <= 0 || len(a.queue) == 0 || a.queue[0] != w || float64(a.inFlight+1) > a.capacity {
		return -1
	}
	return max(time.Nanosecond, time.Duration(math.Ceil((1-a.tokens)/a.rate*float64(time.Second))))
}

// Admit takes a token and a slot, waiting in the queue for them (Door; the
// class is not used: one first-come-first-served queue). The ticket is nil.
func (a *Limiter) Admit(ctx context.Context, _ Class) (*Ticket, Result) {
	return nil, a.acquire(ctx)
}

func (a *Limiter) acquire(ctx context.Context) Result {
	a.mu.Lock()
	a.refillLocked()
	if len(a.queue) == 0 && a.admitsLocked() {
		a.takeLocked()
		a.mu.Unlock()
		a.metrics.allowed.Inc()
		return Admitted
	}
	if len(a.queue) >= a.queueSize {
		a.mu.Unlock()
		a.metrics.rejected.Inc()
		a.metrics.queueFull.Inc()
		return QueueFull
	}
	w := &admWaiter{ready: make(chan struct{}), wake: make(chan struct{}, 1)}
	a.queue = append(a.queue, w)
	a.metrics.waiting.Inc()
	a.mu.Unlock()
	defer a.metrics.waiting.Dec()

	deadline := time.NewTimer(a.timeout)
	defer deadline.Stop()
	var refill *time.Timer
	defer func() {
		if refill != nil {
			refill.Stop()
		}
	}()
	res := Admitted
	for res == Admitted {
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
			a.metrics.allowed.Inc()
			return Admitted
		case <-w.wake:
		case <-tick:
		case <-deadline.C:
			res = QueueTimeout
		case <-ctx.Done():
			res = Cancelled
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if w.granted { // granted as the wait ended: take it
		a.metrics.allowed.Inc()
		return Admitted
	}
	for i, q := range a.queue {
		if q == w {
			a.queue = append(a.queue[:i], a.queue[i+1:]...)
			break
		}
	}
	a.grantLocked(true) // the head may have been the one holding others back
	if res == QueueTimeout {
		a.metrics.rejected.Inc()
		a.metrics.queueTimeout.Inc()
	}
	return res
}

// Release ends one admitted request (Door): its concurrency slot frees;
// without a refill rate its token comes back too.
func (a *Limiter) Release(*Ticket) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.inFlight--
	if a.rate <= 0 {
		a.tokens = min(a.capacity, a.tokens+1)
	}
	a.refillLocked()
	a.grantLocked(true)
}

// Waiting is the number of requests queued for a token, whatever their class
// (Door).
func (a *Limiter) Waiting(Class) int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return int64(len(a.queue))
}

// LimiterMetrics are the Limiter's series: SMG's smg_http_rate_limit_total
// and smg's admission queue refusals and depth. They exist (at 0) whether or
// not a Limiter runs.
type LimiterMetrics struct {
	allowed, rejected       prometheus.Counter // smg_http_rate_limit_total{result}
	queueFull, queueTimeout prometheus.Counter // smg_router_admission_rejected_total{reason}
	waiting                 prometheus.Gauge
}

// NewLimiterMetrics registers the Limiter's series on reg.
func NewLimiterMetrics(reg prometheus.Registerer) (*LimiterMetrics, error) {
	rejected := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "smg_router_admission_rejected_total", Help: "Requests refused by the admission queue.",
	}, []string{"reason"})
	rateLimit := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "smg_http_rate_limit_total", Help: "Token bucket decisions (--max-concurrent-requests, --rate-limit-tokens-per-second), by result.",
	}, []string{"result"})
	waiting := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "smg_router_admission_waiting", Help: "Requests waiting in the admission queue.",
	})
	for _, c := range []prometheus.Collector{rejected, rateLimit, waiting} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return &LimiterMetrics{
		allowed: rateLimit.WithLabelValues("allowed"), rejected: rateLimit.WithLabelValues("rejected"),
		queueFull: rejected.WithLabelValues("queue_full"), queueTimeout: rejected.WithLabelValues("queue_timeout"),
		waiting: waiting,
	}, nil
}
