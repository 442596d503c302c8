package ttft

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"testing/synctest"
	"time"
)

func TestPredictIsWorkOverRatePlusAStep(t *testing.T) {
	cases := []struct {
		ahead, own int64
		rate       float64
		step, want time.Duration
	}{
		{0, 1000, 10000, 0, 100 * time.Millisecond},
		{9000, 1000, 10000, 20 * time.Millisecond, time.Second + 20*time.Millisecond},
		{-5, 1000, 10000, -time.Second, 100 * time.Millisecond}, // negatives read as 0
		{1000, 0, 0, time.Second, 0},                            // no rate: no prediction
		{1000, 0, math.Inf(1), time.Second, 0},
		{1000, 0, math.NaN(), time.Second, 0},
	}
	for _, c := range cases {
		if got := Predict(c.ahead, c.own, c.rate, c.step); got != c.want {
			t.Errorf("Predict(%d, %d, %v, %v) = %v, want %v", c.ahead, c.own, c.rate, c.step, got, c.want)
		}
	}
	if got := Predict(math.MaxInt64/2, math.MaxInt64/2, 1e-9, 0); got <= 0 {
		t.Errorf("a huge prediction overflowed: %v", got)
	}
}

func TestRateSampleCountsTheWorkAheadAndLeavesOutOneStep(t *testing.T) {
	// 4000 tokens (1000 own behind 3000) in 210 ms with a 10 ms step: 20000 tokens/s.
	if got := RateSample(4000, 210*time.Millisecond, 10*time.Millisecond); math.Abs(got-20000) > 1e-6 {
		t.Errorf("rate sample = %v, want 20000", got)
	}
	// A step estimate longer than the TTFT counts half the TTFT as prefill.
	if got := RateSample(1000, 100*time.Millisecond, time.Second); math.Abs(got-20000) > 1e-6 {
		t.Errorf("rate sample = %v, want 20000", got)
	}
	if RateSample(0, time.Second, 0) != 0 || RateSample(10, 0, 0) != 0 {
		t.Error("empty samples must read 0")
	}
}

func TestEstimatorLearnsTheRateAndStep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := New(time.Now)
		if _, s := e.Predict(0, 100); s != NoData {
			t.Fatalf("status before any sample = %v, want no_data", s)
		}
		e.ObserveStep(10 * time.Millisecond)
		if e.Step() != 10*time.Millisecond {
			t.Fatalf("step = %v, want 10ms", e.Step())
		}
		// A gap that also held other prompts' chunks barely moves it.
		time.Sleep(TimeConstant)
		e.ObserveStep(400 * time.Millisecond)
		if s := e.Step(); s > 40*time.Millisecond {
			t.Fatalf("step after one long gap = %v, want under 40ms", s)
		}
		time.Sleep(10 * TimeConstant)
		e.ObserveStep(10 * time.Millisecond)
		// Work 2000 in 115 ms with a 10 ms step (15 ms fixed): 20000 tokens/s.
		e.ObserveFirstToken(2000, 115*time.Millisecond)
		rate, s := e.Rate()
		if s != OK || math.Abs(rate-20000) > 1 {
			t.Fatalf("rate = %v %v, want 20000 ok", rate, s)
		}
		// 3000 ahead + 1000 own at 20000/s + one and a half 10 ms steps.
		if d, s := e.Predict(3000, 1000); s != OK || (d-215*time.Millisecond).Abs() > 10*time.Microsecond {
			t.Fatalf("predict = %v %v, want 215ms ok", d, s)
		}
	})
}

func TestEstimatorRateIsTheMedianOfRecentSamples(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := New(time.Now)
		for range 3 {
			time.Sleep(time.Second)
			e.ObserveFirstToken(10000, time.Second) // 10000 tokens/s
		}
		// Outliers on either side (work ahead the control plane had not
		// summed yet, or had not taken away yet) do not move it.
		e.ObserveFirstToken(50, 1200*time.Millisecond)
		e.ObserveFirstToken(400000, time.Second)
		if r, _ := e.Rate(); r != 10000 {
			t.Fatalf("rate with two outliers = %v, want 10000", r)
		}
		// The engine now runs at 20000 tokens/s: once those samples are
		// the majority of the window, the rate is theirs.
		for range Samples/2 + 1 {
			time.Sleep(100 * time.Millisecond)
			e.ObserveFirstToken(20000, time.Second)
		}
		if r, s := e.Rate(); s != OK || r != 20000 {
			t.Fatalf("rate after a majority of new samples = %v %v, want 20000", r, s)
		}
		// Samples older than MaxAge are gone: after a long silence there is
		// no rate (a stalled engine's rate does not refuse forever), and a
		// new sample replaces the old ones.
		time.Sleep(MaxAge - time.Second)
		if _, s := e.Rate(); s != OK {
			t.Fatalf("status %v before MaxAge of silence, want ok", s)
		}
		time.Sleep(2 * time.Second)
		if _, s := e.Rate(); s != NoData {
			t.Fatalf("status %v after MaxAge of silence, want no_data", s)
		}
		if _, s := e.Predict(0, 100); s != NoData {
			t.Fatalf("prediction status %v after MaxAge of silence, want no_data", s)
		}
		e.ObserveFirstToken(5000, time.Second)
		if r, _ := e.Rate(); r != 5000 {
			t.Fatalf("rate after a long silence = %v, want 5000", r)
		}
	})
}

func TestEstimatorBoundsALyingEngine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// First bytes before any prefill: 100000 tokens in 1 µs.
		fast := New(time.Now)
		fast.ObserveFirstToken(100000, time.Microsecond)
		if _, s := fast.Predict(0, 10); s != Implausible {
			t.Fatalf("an infinite rate predicted with status %v, want implausible", s)
		}
		// An engine that never gets through its prompts: 10 tokens in 100 s.
		slow := New(time.Now)
		slow.ObserveFirstToken(10, 100*time.Second)
		if d, s := slow.Predict(0, 10); s != Implausible || d != 0 {
			t.Fatalf("a zero rate predicted %v with status %v, want 0 implausible", d, s)
		}
		// Honest samples bring it back within bounds.
		for range 2 {
			time.Sleep(time.Second)
			slow.ObserveFirstToken(10000, time.Second)
		}
		if _, s := slow.Predict(0, 10); s != OK {
			t.Fatalf("status after honest samples = %v, want ok", s)
		}
	})
}

// Prompts of many lengths: the estimator fits the time a first token takes
// beyond its prefill (the step under way, the decodes beside it) apart from
// the rate, so short and long prompts are both predicted right, where a
// rate through the origin would count that time into every token.
func TestEstimatorFitsAFixedTimeBesideTheRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := New(time.Now)
		e.ObserveStep(5 * time.Millisecond) // under the real 20 ms: the fit, not the step, must serve
		ttftOf := func(work int64) time.Duration {
			return 20*time.Millisecond + time.Duration(float64(work)/20000*float64(time.Second))
		}
		works := []int64{64, 16384, 256, 4096, 128, 8192, 1024, 512, 2048, 96}
		for _, w := range works {
			time.Sleep(100 * time.Millisecond)
			e.ObserveFirstToken(w, ttftOf(w))
		}
		// Stale work ahead: two samples that counted 20,000 tokens already
		// done, one that missed 10,000 just dispatched. Medians ignore them.
		e.ObserveFirstToken(20100, ttftOf(100))
		e.ObserveFirstToken(20200, ttftOf(200))
		e.ObserveFirstToken(300, ttftOf(10300))
		time.Sleep(RefitEvery) // the read below folds the three in
		if rate, s := e.Rate(); s != OK || math.Abs(rate-20000) > 200 {
			t.Fatalf("rate = %v %v, want 20000 ok", rate, s)
		}
		for _, w := range []int64{64, 1000, 16000} {
			d, s := e.Predict(w/2, w-w/2)
			if want := ttftOf(w); s != OK || (d-want).Abs() > want/50 {
				t.Errorf("predict %d tokens = %v %v, want %v ok", w, d, s, want)
			}
		}
	})
}

// Prompts all of one length show no slope: the rate through the origin and
// one and a half decode steps (half the step under way on average, then the
// first token's) serve, as before any fit.
func TestEstimatorWithoutSpreadFallsBackToTheStep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := New(time.Now)
		e.ObserveStep(10 * time.Millisecond)
		for range 2 * fitMin {
			time.Sleep(100 * time.Millisecond)
			e.ObserveFirstToken(1000, 65*time.Millisecond) // 1000 in 50 ms + 1.5 steps
		}
		if d, s := e.Predict(1000, 1000); s != OK || (d-115*time.Millisecond).Abs() > time.Millisecond {
			t.Fatalf("predict = %v %v, want 115ms ok", d, s)
		}
	})
}

// The margin is the 90th percentile of the latest observed less predicted
// TTFTs, never below 0 nor above MaxMargin, and 0 until a few are known.
func TestMarginIsTheNinetiethPercentileOfTheError(t *testing.T) {
	e := New(time.Now)
	ms := time.Millisecond
	for range marginMin - 1 {
		e.ObserveError(300*ms, 100*ms)
	}
	if m := e.Margin(); m != 0 {
		t.Fatalf("margin before %d errors = %v, want 0", marginMin, m)
	}
	// 31 errors: 27 of 0, 4 of +50 ms: the 90th percentile is 50 ms.
	for i := range Samples {
		late := time.Duration(0)
		if i%8 == 0 {
			late = 50 * ms
		}
		e.ObserveError(100*ms+late, 100*ms)
	}
	if m := e.Margin(); m != 50*ms {
		t.Fatalf("margin = %v, want 50ms", m)
	}
	// Over-predictions never shorten a prediction; absurd errors are capped.
	for range Samples {
		e.ObserveError(10*ms, 100*ms)
	}
	if m := e.Margin(); m != 0 {
		t.Fatalf("margin after over-predictions = %v, want 0", m)
	}
	for range Samples {
		e.ObserveError(time.Hour, ms)
	}
	if m := e.Margin(); m != MaxMargin {
		t.Fatalf("margin after absurd errors = %v, want %v", m, MaxMargin)
	}
	e.ObserveError(0, ms)
	e.ObserveError(ms, 0)
	e.ObserveError(-ms, ms)
	if m := e.Margin(); m != MaxMargin {
		t.Fatalf("empty samples moved the margin to %v", m)
	}
}

// While no error is measured (the gate refuses everything) the margin
// halves every MarginHalfLife after MarginGrace, and so do the errors behind
// it: the first requests admitted after a stall are not judged by it again.
// A steady trickle of errors keeps the plain percentile.
func TestMarginDecaysWhileNothingIsMeasured(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := New(time.Now)
		ms := time.Millisecond
		// A stall: every first token 2 s late, one every 500 ms.
		for range Samples {
			e.ObserveError(2100*ms, 100*ms)
			time.Sleep(500 * ms)
		}
		if m := e.Margin(); m != 2*time.Second {
			t.Fatalf("margin under a steady trickle = %v, want 2s (no decay within the grace)", m)
		}
		time.Sleep(MarginGrace - 500*ms)
		if m := e.Margin(); m != 2*time.Second {
			t.Fatalf("margin at the end of the grace = %v, want 2s", m)
		}
		time.Sleep(MarginHalfLife)
		if m := e.Margin(); m != time.Second {
			t.Fatalf("margin one half-life after the grace = %v, want 1s", m)
		}
		time.Sleep(4 * MarginHalfLife)
		if m := e.Margin(); m != 62500*time.Microsecond {
			t.Fatalf("margin five half-lives after the grace = %v, want 62.5ms", m)
		}
		// The stall is over: a request admitted now is 10 ms late. The old
		// errors count as decayed, not as they were.
		e.ObserveError(110*ms, 100*ms)
		if m := e.Margin(); m != 62500*time.Microsecond {
			t.Fatalf("margin after one fresh error = %v, want the decayed 62.5ms", m)
		}
		for range Samples {
			e.ObserveError(110*ms, 100*ms)
		}
		if m := e.Margin(); m != 10*ms {
			t.Fatalf("margin after fresh errors only = %v, want 10ms", m)
		}
	})
}

func TestNthIsTheSortedElement(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		n := 1 + r.IntN(500)
		xs := make([]float64, n)
		for i := range xs {
			switch r.IntN(3) {
			case 0:
				xs[i] = float64(r.IntN(5)) // many ties
			case 1:
				xs[i] = float64(i) // sorted runs
			default:
				xs[i] = r.NormFloat64()
			}
		}
		k := r.IntN(n)
		want := slices.Clone(xs)
		slices.Sort(want)
		if got := nth(xs, k); got != want[k] {
			t.Fatalf("nth(%d of %d) = %v, want %v", k, n, got, want[k])
		}
	}
}

// BenchmarkObserveFirstToken is the estimator's cost per answered request
// with a full window of samples whose work differs (the fit runs).
func BenchmarkObserveFirstToken(b *testing.B) {
	now := time.Unix(0, 0)
	e := New(func() time.Time { return now })
	b.ReportAllocs()
	for i := range b.N {
		now = now.Add(time.Millisecond)
		w := int64(100 + (i*7919)%16000)
		e.ObserveFirstToken(w, time.Duration(w)*time.Microsecond+20*time.Millisecond)
		e.ObserveStep(20 * time.Millisecond)
	}
}

// Samples within RefitEvery of the last fit wait for the next sample or read
// after it; none is lost.
func TestSamplesWithinTheRefitIntervalAreFoldedInLater(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := New(time.Now)
		e.ObserveFirstToken(1000, 100*time.Millisecond) // 10,000 tokens/s, fitted at once
		e.ObserveFirstToken(4000, 100*time.Millisecond) // 40,000
		e.ObserveFirstToken(4000, 100*time.Millisecond) // 40,000: the median once fitted
		if rate, _ := e.Rate(); rate != 10000 {
			t.Fatalf("rate within the interval = %v, want the first fit's 10000", rate)
		}
		time.Sleep(RefitEvery)
		if rate, _ := e.Rate(); rate != 40000 {
			t.Fatalf("rate after the interval = %v, want 40000", rate)
		}
	})
}

// Work ahead worth more than MaxAhead of prefill at the measured rate (a
// router or agent lying about its prompt tokens) is not believed: the
// prediction is implausible, so callers fail open to the running window,
// instead of refusing every request (which would measure nothing to
// correct it).
func TestPredictionBoundsTheWorkAhead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := New(time.Now)
		if !e.AheadPlausible(1 << 50) {
			t.Fatal("work ahead judged before any rate is known")
		}
		e.ObserveFirstToken(10000, time.Second) // 10000 tokens/s
		limit := int64(10000 * MaxAhead.Seconds())
		if d, s := e.Predict(limit, 100); s != OK || d < MaxAhead {
			t.Fatalf("MaxAhead of work ahead: %v %v, want ok and at least %v", d, s, MaxAhead)
		}
		for _, ahead := range []int64{limit + 10000, 1 << 50} {
			if d, s := e.Predict(ahead, 100); s != Implausible || d != 0 {
				t.Errorf("%d tokens ahead: %v %v, want 0 implausible", ahead, d, s)
			}
			if e.AheadPlausible(ahead) {
				t.Errorf("%d tokens ahead judged plausible", ahead)
			}
		}
	})
}

// Folding in an error is part of every request: it allocates nothing, and
// the margin it moves is worked out when read, as of the latest error.
func TestObserveErrorAllocatesNothing(t *testing.T) {
	e := New(time.Now)
	ms := time.Millisecond
	for range Samples {
		e.ObserveError(100*ms, 100*ms)
	}
	if n := testing.AllocsPerRun(100, func() { e.ObserveError(150*ms, 100*ms) }); n != 0 {
		t.Fatalf("ObserveError: %v allocations, want 0", n)
	}
	if m := e.Margin(); m != 50*ms {
		t.Fatalf("margin after the latest errors = %v, want 50ms", m)
	}
	if n := testing.AllocsPerRun(100, func() { e.Margin() }); n != 0 {
		t.Fatalf("Margin with no new error: %v allocations, want 0", n)
	}
}
