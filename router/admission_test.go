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
	return newTestBucket(t, limit, -1, queue, timeout)
}

func newTestBucket(t *testing.T, limit int, rate float64, queue int, timeout time.Duration) *admission {
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return newAdmission(limit, rate, queue, timeout, m, time.Now)
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
		if a.waitingCount() != 0 {
			t.Fatal("queue place not freed")
		}
	})
}

// SMG's token bucket with a refill rate: the burst is --max-concurrent-requests
// tokens; after it, admissions come at the refill rate however fast requests
// complete, and never above --max-concurrent-requests in flight.
func TestTokenBucketRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newTestBucket(t, 4, 2, 10, time.Minute) // burst 4, 2 per second
		ctx := context.Background()
		for range 4 {
			if a.acquire(ctx) != admitted {
				t.Fatal("burst not admitted")
			}
			a.release() // completions do not hand tokens back
		}
		start := time.Now()
		results := make(chan admitResult, 3)
		for range 3 {
			go func() { results <- a.acquire(ctx) }()
			synctest.Wait()
		}
		var at []time.Duration
		for range 3 {
			if r := <-results; r != admitted {
				t.Fatalf("queued request: %v", r)
			}
			at = append(at, time.Since(start))
			a.release()
		}
		want := []time.Duration{500 * time.Millisecond, time.Second, 1500 * time.Millisecond}
		for i := range want {
			if at[i] != want[i] {
				t.Fatalf("admitted at %v, want %v (one token per 500ms)", at, want)
			}
		}
		if v := testutil.ToFloat64(a.metrics.rateLimit.WithLabelValues("allowed")); v != 7 {
			t.Fatalf("smg_http_rate_limit_total{result=allowed} = %v, want 7", v)
		}
	})
}

// The refill never mints concurrency: with every slot held, tokens pile up
// but nothing is admitted until a request completes.
func TestTokenBucketConcurrencyBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newTestBucket(t, 2, 100, 10, time.Minute)
		ctx := context.Background()
		a.acquire(ctx)
		a.acquire(ctx)
		results := make(chan admitResult, 1)
		go func() { results <- a.acquire(ctx) }()
		time.Sleep(30 * time.Second)
		synctest.Wait()
		select {
		case r := <-results:
			t.Fatalf("admitted above the concurrency bound: %v", r)
		default:
		}
		a.release()
		if r := <-results; r != admitted {
			t.Fatalf("after a completion: %v", r)
		}
		if a.waitingCount() != 0 {
			t.Fatal("queue not empty")
		}
		a.release()
		a.release()
	})
}

// A rejection is counted as rejected; rate 0 is a plain concurrency limit.
func TestTokenBucketRejectedCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newTestBucket(t, 1, 0, 0, time.Minute)
		ctx := context.Background()
		a.acquire(ctx)
		if r := a.acquire(ctx); r != admitQueueFull {
			t.Fatalf("got %v, want queue full", r)
		}
		a.release()
		if r := a.acquire(ctx); r != admitted {
			t.Fatalf("rate 0: a completion must hand the token back, got %v", r)
		}
		if v := testutil.ToFloat64(a.metrics.rateLimit.WithLabelValues("rejected")); v != 1 {
			t.Fatalf("rejected = %v, want 1", v)
		}
	})
}
