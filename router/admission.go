package router

import (
	"context"
	"sync/atomic"
	"time"
)

// admission bounds the requests proxied at once (--max-concurrent-requests).
// Up to --queue-size more wait, each for at most --queue-timeout-secs.
type admission struct {
	slots     chan struct{}
	waiting   atomic.Int64
	queueSize int64
	timeout   time.Duration
	metrics   *metrics
}

type admitResult uint8

const (
	admitted admitResult = iota
	admitQueueFull
	admitTimeout
	admitCanceled // the client went away while waiting
)

// admissionRetryAfter is the Retry-After (seconds) of admission refusals: the
// gateway's own queue drains in well under the load monitor interval.
const admissionRetryAfter = 1

func newAdmission(limit, queueSize int, timeout time.Duration, m *metrics) *admission {
	return &admission{slots: make(chan struct{}, limit), queueSize: int64(queueSize), timeout: timeout, metrics: m}
}

func (a *admission) acquire(ctx context.Context) admitResult {
	select {
	case a.slots <- struct{}{}:
		return admitted
	default:
	}
	if a.waiting.Add(1) > a.queueSize {
		a.waiting.Add(-1)
		a.metrics.admission.WithLabelValues("queue_full").Inc()
		return admitQueueFull
	}
	a.metrics.queued.Inc()
	defer func() {
		a.waiting.Add(-1)
		a.metrics.queued.Dec()
	}()
	t := time.NewTimer(a.timeout)
	defer t.Stop()
	select {
	case a.slots <- struct{}{}:
		return admitted
	case <-t.C:
		a.metrics.admission.WithLabelValues("queue_timeout").Inc()
		return admitTimeout
	case <-ctx.Done():
		return admitCanceled
	}
}

func (a *admission) release() { <-a.slots }
