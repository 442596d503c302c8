package admission

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func newTestAdmission(t *testing.T, limit, queue int, timeout time.Duration) *Limiter {
	return newTestBucket(t, limit, -1, queue, timeout)
}

func newTestBucket(t *testing.T, limit int, rate float64, queue int, timeout time.Duration) *Limiter {
	m, err := NewLimiterMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return NewLimiter(limit, rate, queue, timeout, m, time.Now)
}

// A request that waits longer than --queue-timeout-secs times out; one that
// finds room within it is admitted; a full queue refuses at once.
func TestAdmissionQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newTestAdmission(t, 1, 1, 60*time.Second)
		ctx := context.Background()
		if a.acquire(ctx) != Admitted {
			t.Fatal("first request not admitted")
		}
		results := make(chan Result)
		start := time.Now()
		go func() { results <- a.acquire(ctx) }()
		synctest.Wait() // the second request is queued
		if r := a.acquire(ctx); r != QueueFull {
			t.Fatalf("third request: %v, want queue full", r)
		}
		if r := <-results; r != QueueTimeout || time.Since(start) != 60*time.Second {
			t.Fatalf("queued request: %v after %v, want timeout after 60s", r, time.Since(start))
		}
		if testutil.ToFloat64(a.metrics.queueTimeout) != 1 ||
			testutil.ToFloat64(a.metrics.queueFull) != 1 {
			t.Fatal("rejections not counted")
		}

		go func() { results <- a.acquire(ctx) }()
		time.Sleep(59 * time.Second) // fake time inside the bubble
		a.Release(nil)
		if r := <-results; r != Admitted {
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
		results := make(chan Result)
		go func() { results <- a.acquire(ctx) }()
		synctest.Wait()
		cancel()
		if r := <-results; r != Cancelled {
			t.Fatalf("got %v", r)
		}
		if a.Waiting(Default) != 0 {
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
			if a.acquire(ctx) != Admitted {
				t.Fatal("burst not admitted")
			}
			a.Release(nil) // completions do not hand tokens back
		}
		start := time.Now()
		results := make(chan Result, 3)
		for range 3 {
			go func() { results <- a.acquire(ctx) }()
			synctest.Wait()
		}
		var at []time.Duration
		for range 3 {
			if r := <-results; r != Admitted {
				t.Fatalf("queued request: %v", r)
			}
			at = append(at, time.Since(start))
			a.Release(nil)
		}
		want := []time.Duration{500 * time.Millisecond, time.Second, 1500 * time.Millisecond}
		for i := range want {
			if at[i] != want[i] {
				t.Fatalf("admitted at %v, want %v (one token per 500ms)", at, want)
			}
		}
		if v := testutil.ToFloat64(a.metrics.allowed); v != 7 {
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
		results := make(chan Result, 1)
		go func() { results <- a.acquire(ctx) }()
		time.Sleep(30 * time.Second)
		synctest.Wait()
		select {
		case r := <-results:
			t.Fatalf("admitted above the concurrency bound: %v", r)
		default:
		}
		a.Release(nil)
		if r := <-results; r != Admitted {
			t.Fatalf("after a completion: %v", r)
		}
		if a.Waiting(Default) != 0 {
			t.Fatal("queue not empty")
		}
		a.Release(nil)
		a.Release(nil)
	})
}

// A rejection is counted as rejected; rate 0 is a plain concurrency limit.
func TestTokenBucketRejectedCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newTestBucket(t, 1, 0, 0, time.Minute)
		ctx := context.Background()
		a.acquire(ctx)
		if r := a.acquire(ctx); r != QueueFull {
			t.Fatalf("got %v, want queue full", r)
		}
		a.Release(nil)
		if r := a.acquire(ctx); r != Admitted {
			t.Fatalf("rate 0: a completion must hand the token back, got %v", r)
		}
		if v := testutil.ToFloat64(a.metrics.rejected); v != 1 {
			t.Fatalf("rejected = %v, want 1", v)
		}
	})
}
