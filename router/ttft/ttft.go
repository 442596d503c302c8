// Package ttft predicts a request's time to first token on a worker from
// what the router measures: the worker's prefill rate (prompt tokens over
// time to first token, counting the work that was ahead), its decode step
// time, the prompt tokens ahead of the request there and the request's own
// prompt length.
//
//	predicted TTFT = fixed time + (tokens ahead + own tokens) / prefill rate
//
// Both terms are fitted through the latest first tokens (see fit): the fixed
// time is what a first token waits beyond its prefill (the step under way,
// the decodes of the requests beside it). When the samples' work is too
// alike to tell the two apart, the rate goes through the origin and the
// fixed time is one and a half measured decode steps (see fallbackFixed).
//
// The rate is measured on requests, not read from the engine's prompt-token
// counter: that counter moves with demand (an idle engine reads 0 tokens/s),
// so it bounds the capacity from below and says nothing of it while the
// engine is lightly loaded. A first token answered after prefilling W tokens
// (its own plus those ahead of it when it was dispatched) in a time T is one
// sample of the rate, W / (T - 1.5 steps). The rate is the median of the
// latest samples: the work ahead comes partly from the control plane, a
// fraction of a second behind, so a sample may count work already done (too
// fast) or miss work just dispatched by another router (too slow); the
// median ignores such outliers on both sides where a mean follows them.
//
// The estimator bounds what it learns: a rate outside [MinRate, MaxRate]
// (an engine that answers a first byte before any prefill, or one that
// never gets through its prompts) makes it say Implausible, and callers
// fail open to the running window alone.
package ttft

import (
	"cmp"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Bounds of a plausible prefill rate, in prompt tokens per second. Real
// engines prefill between a few hundred and a few hundred thousand tokens a
// second; the bounds are an order of magnitude or more outside.
const (
	MinRate = 10.0
	MaxRate = 1e7
)

// TimeConstant is how fast old step samples lose weight: a step sample taken
// dt after the previous one moves the estimate 1-e^(-dt/TimeConstant) of the
// way (the first sets it).
const TimeConstant = 5 * time.Second

// The rate is the median of at most Samples samples, none older than MaxAge
// before the newest: it follows an engine that changes within half of them,
// and a sample after a long silence replaces the old ones. A rate whose
// newest sample is older than MaxAge is no rate (NoData): learned in a stall
// and too slow for any objective, it would refuse every request and, as a
// refused request measures nothing, never learn that the stall ended.
const (
	Samples = 31
	MaxAge  = 30 * time.Second
)

// minWeight keeps a sample's weight from vanishing when samples come close
// together (many routers' requests complete in the same instant).
const minWeight = 0.02

// Status says whether a prediction can be used.
type Status uint8

const (
	OK          Status = iota // a prediction from a plausible measured rate
	NoData                    // no first token measured on this worker yet
	Implausible               // the measured rate is outside [MinRate, MaxRate]: fail open
)

// String is the status's label ("ok", "no_data", "implausible").
func (s Status) String() string {
	switch s {
	case NoData:
		return "no_data"
	case Implausible:
		return "implausible"
	}
	return "ok"
}

// Predict is the time to first token of a request of own prompt tokens
// behind ahead tokens on a worker that prefills rate tokens per second and
// takes step per decode step. A rate <= 0 predicts nothing (0).
func Predict(ahead, own int64, rate float64, step time.Duration) time.Duration {
	if !(rate > 0) || math.IsInf(rate, 1) {
		return 0
	}
	work := float64(max(ahead, 0) + max(own, 0))
	d := work/rate*float64(time.Second) + float64(max(step, 0))
	if d > float64(math.MaxInt64/2) {
		return math.MaxInt64 / 2
	}
	return time.Duration(d)
}

// RateSample is the prefill rate one first token shows: work tokens (the
// request's own plus those ahead of it at dispatch) prefilled in ttft, less
// step, the time beyond prefill (the estimator passes fallbackFixed of its
// decode step), counting at least half of ttft as
// prefill so a step estimate larger than ttft cannot make the rate infinite.
func RateSample(work int64, ttft, step time.Duration) float64 {
	if work <= 0 || ttft <= 0 {
		return 0
	}
	prefill := max(ttft-max(step, 0), ttft/2)
	return float64(work) / prefill.Seconds()
}

// Estimator learns one worker's prefill rate and decode step time. Reads are
// lock-free (atomics); samples are folded in under a mutex. The zero value is
// not usable: use New.
type Estimator struct {
	now func() time.Time

	mu       sync.Mutex
	lastStep time.Time
	rateSeen bool
	stepSeen bool
	samples  []rateSample // oldest first, at most Samples
	sorted   []float64    // scratch for the medians
	stepSecs float64
	// fitted is the rate part of the estimate as of the latest fit: a step
	// alone does not move it, so ObserveStep (every stream's second chunk)
	// does not redo the fit.
	fitted estimate
	// The fit runs at most once per RefitEvery: a sample within it is
	// folded in by the next sample or read after it (pending). At thousands
	// of first tokens a second, a fit each was several per cent of the
	// router's CPU for a prediction that moves by a sample in 31.
	fittedAt  time.Time
	pending   atomic.Bool
	published atomic.Pointer[estimate]
	// errs are the latest observed less predicted TTFTs (a ring), for
	// Margin, as decayed up to errAt (the latest's time).
	errs        [Samples]time.Duration
	errNext     int
	errN        int
	errAt       time.Time
	margin      atomic.Pointer[margin]
	marginStale atomic.Bool // errors came since margin was worked out
}

// margin is the margin as of the latest error, at.
type margin struct {
	d  time.Duration
	at time.Time
}

type rateSample struct {
	at   time.Time
	rate float64
	work float64 // tokens
	ttft float64 // seconds
}

type estimate struct {
	rate   float64 // tokens/s, unbounded (Status tells when it is out of bounds)
	step   time.Duration
	hasOne bool
	// fixed is the time a first token takes beyond the prefill of the
	// work, when fitted (fitted true): see fit.
	fixed  time.Duration
	fitted bool
	newest time.Time // the newest rate sample's time
}

// New returns an estimator on the clock now.
func New(now func() time.Time) *Estimator {
	e := &Estimator{now: now}
	e.published.Store(&estimate{})
	e.margin.Store(&margin{})
	return e
}

// weight is how far a sample taken at t moves an estimate last moved at last.
func weight(seen bool, last, t time.Time) float64 {
	if !seen {
		return 1
	}
	dt := t.Sub(last)
	if dt <= 0 {
		return minWeight
	}
	return max(minWeight, 1-math.Exp(-dt.Seconds()/TimeConstant.Seconds()))
}

// ObserveFirstToken folds in one request's first token: work prompt tokens
// (its own plus those ahead of it when it was dispatched) in ttft.
func (e *Estimator) ObserveFirstToken(work int64, ttft time.Duration) {
	if work <= 0 || ttft <= 0 {
		return
	}
	rate := RateSample(work, ttft, fallbackFixed(e.published.Load().step))
	if !(rate > 0) || math.IsInf(rate, 1) {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	t := e.now()
	drop := 0
	for drop < len(e.samples) && (t.Sub(e.samples[drop].at) > MaxAge || len(e.samples)-drop >= Samples) {
		drop++
	}
	e.samples = append(e.samples[:0], e.samples[drop:]...)
	e.samples = append(e.samples, rateSample{at: t, rate: rate, work: float64(work), ttft: ttft.Seconds()})
	e.rateSeen = true
	if !e.fittedAt.IsZero() && t.Sub(e.fittedAt) < RefitEvery {
		e.pending.Store(true)
		return
	}
	e.refit(t)
	e.publish()
}

// fallbackFixed is the fixed time when no line is fitted, from the decode
// step: a request arrives on average half-way through the step under way,
// then waits for the step that sends its first token. One step alone missed
// the half and under-predicted short prompts by about a third (measured on
// the sim engines, where fitted lines put the fixed time at 1.3 steps).
func fallbackFixed(step time.Duration) time.Duration { return step * 3 / 2 }

// RefitEvery is how often at most the samples are fitted again.
const RefitEvery = 20 * time.Millisecond

// catchUp folds in samples left pending by the refit interval once it has
// passed, so a read after the last sample of a burst sees it.
func (e *Estimator) catchUp() {
	if !e.pending.Load() {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if t := e.now(); e.pending.Load() && t.Sub(e.fittedAt) >= RefitEvery {
		e.refit(t)
		e.publish()
	}
}

// ObserveStep folds in one decode step: the time between two tokens of one
// streamed answer. A gap longer than the estimate moves it a tenth as far:
// under chunked prefill a step also computes other requests' prompt chunks,
// work the prefill rate already counts, so the estimate leans to the plain
// decode step (the one that ends a prefill and sends its first token).
func (e *Estimator) ObserveStep(d time.Duration) {
	if d <= 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	t := e.now()
	w := weight(e.stepSeen, e.lastStep, t)
	if e.stepSeen && d.Seconds() > e.stepSecs {
		w /= 10
	}
	e.stepSecs += w * (d.Seconds() - e.stepSecs)
	e.stepSeen, e.lastStep = true, t
	e.publish()
}

// refit recomputes the rate part of the estimate from the samples.
func (e *Estimator) refit(t time.Time) {
	e.fittedAt = t
	e.pending.Store(false)
	e.fitted = estimate{}
	n := len(e.samples)
	if n == 0 {
		return
	}
	e.sorted = e.sorted[:0]
	for _, s := range e.samples {
		e.sorted = append(e.sorted, s.rate)
	}
	e.fitted.rate = nth(e.sorted, n/2)
	if slope, fixed, ok := e.fit(); ok {
		e.fitted.rate, e.fitted.fixed, e.fitted.fitted = 1/slope, time.Duration(fixed*float64(time.Second)), true
	}
}

func (e *Estimator) publish() {
	est := e.fitted
	est.step, est.hasOne = time.Duration(e.stepSecs*float64(time.Second)), e.rateSeen
	if n := len(e.samples); n > 0 {
		est.newest = e.samples[n-1].at
	}
	e.published.Store(&est)
}

// fitMin is the fewest samples fit draws a line through.
const fitMin = 8

// fit draws TTFT = fixed + work × slope through the samples (Theil-Sen: the
// median of the slopes between pairs whose work differs by a quarter or
// more, then the median intercept). A first token waits for more than its
// prefill: the step under way when the request arrived and, on every step
// of its prefill, the decode of the requests running beside it, a time that
// does not grow with the prompt; a rate alone counts it into every token
// and so over-predicts long prompts and under-predicts short ones. Medians
// ignore the samples whose work ahead was stale. ok is false when the
// samples' work is too alike to show a slope (uniform prompts: the rate
// through the origin and fallbackFixed serve then) or the slope is not
// positive.
func (e *Estimator) fit() (slope, fixed float64, ok bool) {
	n := len(e.samples)
	if n < fitMin {
		return 0, 0, false
	}
	e.sorted = e.sorted[:0]
	for i := range n {
		a := &e.samples[i]
		for j := i + 1; j < n; j++ {
			b := &e.samples[j]
			if dw := b.work - a.work; math.Abs(dw) >= 0.25*max(a.work, b.work) {
				e.sorted = append(e.sorted, (b.ttft-a.ttft)/dw)
			}
		}
	}
	if len(e.sorted) < n {
		return 0, 0, false
	}
	slope = nth(e.sorted, len(e.sorted)/2)
	if !(slope > 0) {
		return 0, 0, false
	}
	e.sorted = e.sorted[:0]
	for _, s := range e.samples {
		e.sorted = append(e.sorted, s.ttft-s.work*slope)
	}
	return slope, max(nth(e.sorted, n/2), 0), true
}

// nth is the k-th smallest of xs (what xs[k] would be sorted), found in
// place in linear time on average: the fit's median of up to 465 pair slopes
// runs on every first token, where a sort cost a tenth of the router's CPU.
func nth[T cmp.Ordered](xs []T, k int) T {
	lo, hi := 0, len(xs)-1
	for lo < hi {
		// Median of three as the pivot keeps sorted input linear.
		mid := lo + (hi-lo)/2
		if xs[mid] < xs[lo] {
			xs[mid], xs[lo] = xs[lo], xs[mid]
		}
		if xs[hi] < xs[lo] {
			xs[hi], xs[lo] = xs[lo], xs[hi]
		}
		if xs[hi] < xs[mid] {
			xs[hi], xs[mid] = xs[mid], xs[hi]
		}
		pivot := xs[mid]
		i, j := lo, hi
		for i <= j {
			for xs[i] < pivot {
				i++
			}
			for pivot < xs[j] {
				j--
			}
			if i <= j {
				xs[i], xs[j] = xs[j], xs[i]
				i++
				j--
			}
		}
		switch {
		case k <= j:
			hi = j
		case k >= i:
			lo = i
		default:
			return xs[k]
		}
	}
	return xs[k]
}

// Rate is the measured prefill rate in tokens per second and whether it can
// be used: NoData before the first sample and once the newest is older than
// MaxAge.
func (e *Estimator) Rate() (float64, Status) {
	e.catchUp()
	est := e.published.Load()
	switch {
	case !est.hasOne || e.now().Sub(est.newest) > MaxAge:
		return 0, NoData
	case !(est.rate >= MinRate && est.rate <= MaxRate):
		return est.rate, Implausible
	}
	return est.rate, OK
}

// MaxMargin bounds the margin: an estimator wrong by more is better fixed
// than hidden.
const (
	MaxMargin = 10 * time.Second
	// marginQuantile is the share of the latest first tokens a prediction
	// plus the margin would have covered.
	marginQuantile = 0.9
	marginMin      = 8 // fewer errors say nothing: margin 0
)

// While no error is measured (nothing admitted: a refused request teaches
// nothing), the margin and the errors behind it halve every MarginHalfLife
// once MarginGrace has passed since the latest. Without it a margin grown on
// a stalled host would refuse every request after the stall, and so never
// learn that it ended; with it the gate admits again within seconds and
// measures anew. The grace keeps a steady trickle of requests (one a
// second or more) on its plain percentile.
const (
	MarginGrace    = time.Second
	MarginHalfLife = time.Second
)

// decay is the share of an error left after dt without a newer one.
func decay(dt time.Duration) float64 {
	if dt <= MarginGrace {
		return 1
	}
	return math.Exp2(-float64(dt-MarginGrace) / float64(MarginHalfLife))
}

// ObserveError folds in one request's observed and predicted TTFT.
func (e *Estimator) ObserveError(observed, predicted time.Duration) {
	if observed <= 0 || predicted <= 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	t := e.now()
	if e.errN > 0 {
		if f := decay(t.Sub(e.errAt)); f < 1 {
			for i := range e.errN {
				e.errs[i] = time.Duration(float64(e.errs[i]) * f)
			}
		}
	}
	e.errAt = t
	e.errs[e.errNext] = observed - predicted
	e.errNext = (e.errNext + 1) % Samples
	e.errN = min(e.errN+1, Samples)
	e.marginStale.Store(true) // worked out when read: most routers never read it
}

// refreshMargin works out the margin from the errors as of the latest.
func (e *Estimator) refreshMargin() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.marginStale.Load() {
		return
	}
	var m time.Duration
	if e.errN >= marginMin {
		scratch := e.errs
		m = min(max(nth(scratch[:e.errN], int(marginQuantile*float64(e.errN-1)+0.5)), 0), MaxMargin)
	}
	e.margin.Store(&margin{d: m, at: e.errAt})
	e.marginStale.Store(false)
}

// Margin is what a prediction is lengthened by where it must hold (an
// objective to meet): the 90th percentile of the latest observed less
// predicted TTFTs, in [0, MaxMargin]; 0 before 8 are known; decaying while
// none is measured (see MarginHalfLife). It is a time, not a factor: what
// makes first tokens late (a stalled host, a step under way, work another
// router sent that this one has not heard of yet) adds time whatever the
// request's own prefill.
func (e *Estimator) Margin() time.Duration {
	if e.marginStale.Load() {
		e.refreshMargin()
	}
	m := e.margin.Load()
	if m.d == 0 {
		return 0
	}
	return time.Duration(float64(m.d) * decay(e.now().Sub(m.at)))
}

// Step is the measured decode step time (0 until measured).
func (e *Estimator) Step() time.Duration { return e.published.Load().step }

// MaxAhead bounds the work ahead a prediction believes, in time at the
// measured rate: more comes from a lying router or agent (a running window
// never lets that much queue), and believing it would refuse every request
// under an objective, which then measures nothing to correct it.
const MaxAhead = time.Minute

// AheadPlausible reports whether ahead prompt tokens are within MaxAhead of
// prefill at the measured rate (true while no rate is usable).
func (e *Estimator) AheadPlausible(ahead int64) bool {
	rate, s := e.Rate()
	return s != OK || float64(ahead) <= rate*MaxAhead.Seconds()
}

// Predict is the predicted time to first token of a request of own prompt
// tokens behind ahead tokens on this worker; with a status other than OK the
// prediction is 0 and must not be used. Work ahead past MaxAhead makes it
// Implausible.
func (e *Estimator) Predict(ahead, own int64) (time.Duration, Status) {
	rate, s := e.Rate()
	if s != OK {
		return 0, s
	}
	if float64(ahead) > rate*MaxAhead.Seconds() {
		return 0, Implausible
	}
	if est := e.published.Load(); est.fitted {
		return Predict(ahead, own, rate, est.fixed), OK
	}
	return Predict(ahead, own, rate, fallbackFixed(e.Step())), OK
}
