package router

import (
	"math"
	"testing"
	"time"
)

// The completion meter follows the rate it is fed, on an injected clock.
func TestCompletionMeter(t *testing.T) {
	m := newCompletionMeter(10 * time.Second)
	now := time.Unix(1000, 0)
	if m.perSecond(now) != 0 {
		t.Fatal("a new meter must read 0")
	}
	for range 600 { // 60 s at 10 completions per second
		now = now.Add(100 * time.Millisecond)
		m.add(now)
	}
	if r := m.perSecond(now); math.Abs(r-10) > 0.6 {
		t.Fatalf("rate %v after a minute at 10/s, want about 10", r)
	}
	// Silence decays it: after one time constant, to about 1/e.
	if r := m.perSecond(now.Add(10 * time.Second)); math.Abs(r-10/math.E) > 0.3 {
		t.Fatalf("rate %v after 10 s of silence, want about %v", r, 10/math.E)
	}
}

// The estimate is (queue ahead + 1) / completion rate, rounded up, within
// [1, interval]; with no completion seen it is the interval.
func TestEstimateRetryAfter(t *testing.T) {
	for _, c := range []struct {
		ahead    int64
		rate     float64
		interval int
		want     int
	}{
		{0, 0, 10, 10},      // nothing measured: the spec's interval
		{0, 50, 10, 1},      // a slot frees within a second: at least 1
		{99, 50, 10, 2},     // 100 completions at 50/s
		{100, 50, 10, 3},    // rounded up
		{10000, 50, 10, 10}, // clamped to the interval
		{5, math.NaN(), 7, 7},
	} {
		if got := estimateRetryAfter(c.ahead, c.rate, c.interval); got != c.want {
			t.Errorf("estimate(ahead %d, %v/s, interval %d) = %d, want %d", c.ahead, c.rate, c.interval, got, c.want)
		}
	}
}

// In estimated mode a queue refusal carries the estimate from the router's
// own completions and queue; in interval mode the shed keeps the spec's value.
func TestRetryAfterModes(t *testing.T) {
	now := time.Unix(5000, 0)
	h := newHarness(t, func(o *Options) {
		o.RetryAfterMode = RetryAfterEstimated
		o.LoadMonitorInterval = 10
		o.Now = func() time.Time { return now }
	})
	if got := h.r.retryAfterShed(); got != 10 {
		t.Fatalf("no completion observed: %d, want the interval", got)
	}
	for range 200 { // 20 completions per second for 10 s
		now = now.Add(50 * time.Millisecond)
		h.r.completions.add(now)
	}
	if got := h.r.retryAfterShed(); got != 1 {
		t.Fatalf("empty queue at ~12/s: %d, want 1", got)
	}
	h2 := newHarness(t, func(o *Options) { o.LoadMonitorInterval = 7 })
	h2.r.completions.add(time.Now())
	if got := h2.r.retryAfterShed(); got != 7 {
		t.Fatalf("interval mode: %d, want 7", got)
	}
}
