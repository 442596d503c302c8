package admission

import (
	"math"
	"testing"
	"testing/synctest"
	"time"
)

// Before any answer has ended, a tenant's stream still has a demand (its
// holding time assumed DefaultHoldPrior), so a tenant past its weighted share
// is held back by the stream's headroom in a run's first second instead of
// taking every slot until its answers end. Once an answer ends, its measured
// holding time replaces the prior.
func TestHoldPriorBeforeAnyAnswerEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTest(t, refusedCfg(), 8)
		steady := admitN(t, s, "auth:steady", 1)
		flood := admitN(t, s, "auth:flood", 4) // its weighted share of 8
		for range 2 {
			time.Sleep(100 * time.Millisecond)
			steady = append(steady, admitN(t, s, "auth:steady", 1)...)
		}
		// steady: 3 arrivals in 0.2 s, about 2.5 slots busy at a 1 s hold
		// with its burst margin; it holds 3 and keeps one slot of headroom.
		if _, r := s.AdmitTenant(t.Context(), Default, "auth:flood"); r != OverFairShare {
			t.Fatalf("flood past its weighted share, no answer ended yet: %v, want refused for the steady tenant's headroom", r)
		}
		// One of steady's answers ends after 0.2 s: its holding time is
		// known, its demand (0.5 slots) is under what it holds.
		steady[0].Release()
		steady = steady[1:]
		tk, r := s.AdmitTenant(t.Context(), Default, "auth:flood")
		if r != Admitted {
			t.Fatalf("flood once the steady tenant's holding time is measured: %v, want admitted", r)
		}
		for _, h := range append(append(steady, flood...), tk) {
			h.Release()
		}
	})
}

// With no answer ended anywhere, the prior is DefaultHoldPrior, or the time
// the oldest request in flight has held its slot when longer; once an answer
// ends, the mean measured.
func TestHoldPriorFollowsTheOldestInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTest(t, refusedCfg(), 8)
		held := admitN(t, s, "auth:a", 1)
		prior := func() float64 {
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.holdPriorLocked(time.Now())
		}
		if p := prior(); p != DefaultHoldPrior.Seconds() {
			t.Fatalf("prior %v at the start, want %v", p, DefaultHoldPrior.Seconds())
		}
		time.Sleep(3 * time.Second)
		if p := prior(); p != 3 {
			t.Fatalf("prior %v with a request in flight for 3 s, want 3", p)
		}
		held[0].Release()
		time.Sleep(10 * time.Second)
		if p := prior(); p != 3 {
			t.Fatalf("prior %v after a 3 s answer ended, want its 3 s", p)
		}
	})
}

// A tenant's rate is measured from its stream's own first arrival, leaving
// that arrival out and over at least one holding time: one arrival is no
// rate, two sent together are not thousands a second, and a stream that
// starts long after the scheduler is counted at its rate within a second.
func TestStreamMeanFirstSeconds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var d classDemand
		time.Sleep(10 * time.Second) // the scheduler started long before
		d.arrive(time.Now())
		if m := d.streamMean(time.Now(), 1); m != 0 {
			t.Fatalf("one arrival: mean %v, want 0", m)
		}
		d.arrive(time.Now())
		want := 1 / (demandTau.Seconds() * (1 - math.Exp(-1/demandTau.Seconds())))
		if m := d.streamMean(time.Now(), 1); math.Abs(m-want) > 1e-9 {
			t.Fatalf("two arrivals together: mean %v, want %v (one over a 1 s hold)", m, want)
		}

		var e classDemand
		since := time.Now()
		for range 10 { // 5 a second for 2 s, 1 s assumed held
			e.arrive(time.Now())
			time.Sleep(200 * time.Millisecond)
		}
		if m := e.streamMean(time.Now(), 1); m < 4 || m > 6 {
			t.Fatalf("5 arrivals a second held 1 s: mean %v, want about 5", m)
		}
		if m := e.mean(time.Now(), since.Add(-10*time.Second)); m != 0 {
			t.Fatalf("no answer ended: the class mean %v, want 0 (no prior)", m)
		}
	})
}
