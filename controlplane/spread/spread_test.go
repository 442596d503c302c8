package spread

import (
	"fmt"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestNextIsWithinOneIntervalAndRecursExactly(t *testing.T) {
	const iv = 60 * time.Second
	for i := range 1000 {
		p := PhaseOf("seed", fmt.Sprintf("w%05d", i), iv)
		if off := time.Duration(p.offset); off < 0 || off >= iv {
			t.Fatalf("offset %s outside [0, %s)", time.Duration(p.offset), iv)
		}
		for _, from := range []time.Time{t0, t0.Add(time.Duration(i) * 7919 * time.Millisecond), time.Unix(0, -int64(i)*1e9)} {
			n := p.Next(from)
			if !n.After(from) || n.Sub(from) > iv {
				t.Fatalf("Next(%s) = %s: not in (t, t+interval]", from, n)
			}
			if got := p.Next(n); got.Sub(n) != iv {
				t.Fatalf("from its own phase the next contact is %s later, want exactly %s", got.Sub(n), iv)
			}
			if got := n.UnixNano() % int64(iv); got != p.offset && got+int64(iv) != p.offset {
				t.Fatalf("Next lands at %d mod interval, want the offset %d", got, p.offset)
			}
		}
	}
}

// The phases of N workers cover the interval evenly: no 1/k of it holds much
// more than N/k of them. Ids that differ in their last character (as a
// fleet's usually do) included.
func TestPhasesSpreadEvenly(t *testing.T) {
	const n, k = 10000, 20
	const iv = 10 * time.Second
	for _, seed := range []string{"", "cp-a"} {
		var buckets [k]int
		for i := range n {
			off := time.Duration(PhaseOf(seed, fmt.Sprintf("w%05d", i), iv).offset)
			buckets[off*k/iv]++
		}
		for b, c := range buckets {
			if c > n/k*115/100 || c < n/k*85/100 {
				t.Fatalf("seed %q: bucket %d of %d holds %d phases, want about %d: %v", seed, b, k, c, n/k, buckets)
			}
		}
	}
}

// Two control planes with different seeds do not contact a worker in step.
func TestSeedsShiftThePhases(t *testing.T) {
	same := 0
	for i := range 1000 {
		id := fmt.Sprintf("w%05d", i)
		if PhaseOf("cp-a", id, time.Minute) == PhaseOf("cp-b", id, time.Minute) {
			same++
		}
	}
	if same > 0 {
		t.Fatalf("%d of 1000 workers have the same phase under two seeds", same)
	}
	if PhaseOf("a", "bc", time.Minute) == PhaseOf("ab", "c", time.Minute) {
		t.Fatal("seed and key run together")
	}
}

func TestPhaseAtRecursAtItsInstant(t *testing.T) {
	at := t0.Add(1234567 * time.Microsecond)
	p := PhaseAt(at, 10*time.Second)
	if got := p.Next(at); got.Sub(at) != 10*time.Second {
		t.Fatalf("a worker first contacted at t is next contacted %s later, want 10s", got.Sub(at))
	}
	if got := p.Next(at.Add(-time.Nanosecond)); !got.Equal(at) {
		t.Fatalf("Next just before the instant = %s, want the instant", got)
	}
}

func TestBurstSpendsItsSizeThenRefills(t *testing.T) {
	b := NewBurst(64, time.Second)
	took := 0
	for range 1000 {
		if b.Take(t0) {
			took++
		}
	}
	if took != 64 {
		t.Fatalf("%d contacts at once, want 64", took)
	}
	if b.Take(t0.Add(10 * time.Millisecond)) {
		t.Fatal("a contact 10 ms later, with 0.64 refilled")
	}
	if !b.Take(t0.Add(20 * time.Millisecond)) {
		t.Fatal("no contact 20 ms later, with 1.28 refilled")
	}
	took = 0
	for range 1000 {
		if b.Take(t0.Add(time.Hour)) {
			took++
		}
	}
	if took != 64 {
		t.Fatalf("after an hour %d contacts at once, want the size (64)", took)
	}
	if NewBurst(0, time.Second).Take(t0) {
		t.Fatal("a budget of 0 let a contact through")
	}
}

func TestSchedulePopsDueEntriesInOrder(t *testing.T) {
	var q Schedule[int]
	for _, s := range []int{5, 1, 4, 2, 3} {
		q.At(q.Add(fmt.Sprint(s), s), t0.Add(time.Duration(s)*time.Second))
	}
	if at, ok := q.Peek(); !ok || !at.Equal(t0.Add(time.Second)) {
		t.Fatalf("Peek = %s %v", at, ok)
	}
	var got []string
	for sl := q.PopDue(t0.Add(3 * time.Second)); sl != nil; sl = q.PopDue(t0.Add(3 * time.Second)) {
		got = append(got, sl.ID)
	}
	if fmt.Sprint(got) != "[1 2 3]" || len(q.h) != 2 {
		t.Fatalf("due at 3 s: %v (left %d), want [1 2 3] and 2 left", got, len(q.h))
	}
}

// TestScheduleSkipsStaleEntriesAndSweeps: a slot rescheduled or replaced
// leaves its old entry behind, never popped; Sweep forgets the slots
// not kept since the last one.
func TestScheduleSkipsStaleEntriesAndSweeps(t *testing.T) {
	var q Schedule[int]
	a, b := q.Add("a", 1), q.Add("b", 2)
	q.At(a, t0)
	q.At(a, t0.Add(time.Second)) // rescheduled: the entry at t0 is stale
	q.At(b, t0)
	q.Add("b", 3) // replaced, unscheduled
	if sl := q.PopDue(t0); sl != nil {
		t.Fatalf("popped %s at t0: every entry there is stale", sl.ID)
	}
	if sl := q.PopDue(t0.Add(time.Second)); sl != a || !sl.Next().IsZero() || q.PopDue(t0.Add(time.Second)) != nil {
		t.Fatalf("popped %v, want a, once, no longer scheduled", sl)
	}
	q.Sweep()
	q.Keep("a")
	q.Sweep()
	if q.Get("a") != a || q.Get("b") != nil {
		t.Fatalf("after sweeps: a %v b %v, want a kept and b forgotten", q.Get("a"), q.Get("b"))
	}
}
