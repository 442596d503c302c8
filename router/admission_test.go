package router

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func newTestAdmission(t *testing.T, limit, queue int, timeout time.Duration) *admission {
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return newAdmission(limit, queue, timeout, m)
}

// A request that waits longer than --queue-timeout-secs times out; one that
// finds room within it is admitted; a full queue refuses at once.
func TestAdmissionQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newTestAdmission(t, 1, 1, 60*time.Second)
		ctx := context.Background()
		if a.acquire(ctx) != admitted {
			t.Fatal("first request not admitted")
		}
		results := make(chan admitResult)
		start := time.Now()
		go func() { results <- a.acquire(ctx) }()
		synctest.Wait() // the second request is queued
		if r := a.acquire(ctx); r != admitQueueFull {
			t.Fatalf("third request: %v, want queue full", r)
		}
		if r := <-results; r != admitTimeout || time.Since(start) != 60*time.Second {
			t.Fatalf("queued request: %v after %v, want timeout after 60s", r, time.Since(start))
		}
		if testutil.ToFloat64(a.metrics.admission.WithLabelValues("queue_timeout")) != 1 ||
			testutil.ToFloat64(a.metrics.admission.WithLabelValues("queue_full")) != 1 {
			t.Fatal("rejections not counted")
		}

		go func() { results <- a.acquire(ctx) }()
		time.Sleep(59 * time.Second) // fake time inside the bubble
		a.release()
		if r := <-results; r != admitted {
			t.Fatalf("request that found room in time: %v", r)
		}
	})
}

// A client that leaves while queued frees its queue place.
func TestAdmissionCanceledWhileQueued(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newTestAdmission(t, 1, 1, time.Minute)
		a.acquire(context.Background())
		ctx, cancel := context.WithCancel(context.Background())
		results := make(chan admitResult)
		go func() { results <- a.acquire(ctx) }()
		synctest.Wait()
		cancel()
		if r := <-results; r != admitCanceled {
			t.Fatalf("got %v", r)
		}
		if a.waiting.Load() != 0 {
			t.Fatal("queue place not freed")
		}
	})
}
