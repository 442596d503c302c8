package admission

import (
	"context"
	"math"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

const ms = time.Millisecond

func TestDecideObjective(t *testing.T) {
	cases := []struct {
		name        string
		left        time.Duration
		cands       []Candidate
		want        ObjectiveVerdict
		wait, retry time.Duration
	}{
		{"no candidate: the routing rules answer", 500 * ms, nil, ObjectiveGo, 0, 0},
		{"a worker with room meets it", 500 * ms,
			[]Candidate{{TTFT: 900 * ms, Predicted: true, Room: true}, {TTFT: 400 * ms, Predicted: true, Room: true}}, ObjectiveGo, 0, 0},
		{"a worker with room and no prediction fails open", 500 * ms,
			[]Candidate{{TTFT: 900 * ms, Predicted: true, Room: true}, {Room: true}}, ObjectiveGo, 0, 0},
		{"the one that meets it is full: wait until it no longer could", 500 * ms,
			[]Candidate{{TTFT: 900 * ms, Predicted: true, Room: true}, {TTFT: 200 * ms, Predicted: true}}, ObjectiveWait, 300 * ms, 0},
		{"a full worker with no prediction: wait all that is left", 500 * ms,
			[]Candidate{{TTFT: 900 * ms, Predicted: true, Room: true}, {}}, ObjectiveWait, 500 * ms, 0},
		{"none meets it: refuse, retry once the work ahead drains by the excess", 500 * ms,
			[]Candidate{{TTFT: 3700 * ms, Predicted: true, Room: true}, {TTFT: 2900 * ms, Predicted: true}}, ObjectiveRefuse, 0, 2400 * ms},
		{"a small excess retries after a second", 500 * ms,
			[]Candidate{{TTFT: 600 * ms, Predicted: true, Room: true}}, ObjectiveRefuse, 0, time.Second},
		{"a prediction exactly at the objective meets it", 500 * ms,
			[]Candidate{{TTFT: 500 * ms, Predicted: true, Room: true}}, ObjectiveGo, 0, 0},
		{"the objective already spent in the door's queue", 0,
			[]Candidate{{TTFT: 10 * ms, Predicted: true, Room: true}, {Room: true}}, ObjectiveRefuse, 0, time.Second},
		{"spent, and a long prediction", -200 * ms,
			[]Candidate{{TTFT: 3 * time.Second, Predicted: true}}, ObjectiveRefuse, 0, 3 * time.Second},
	}
	for _, c := range cases {
		v, wait, retry := DecideObjective(c.left, c.cands)
		if v != c.want || wait != c.wait || retry != c.retry {
			t.Errorf("%s: got %v wait %v retry %v, want %v wait %v retry %v", c.name, v, wait, retry, c.want, c.wait, c.retry)
		}
	}
}

func TestObjectiveFromSecs(t *testing.T) {
	if d, err := ObjectiveFromSecs(0.25); err != nil || d != 250*ms {
		t.Fatalf("0.25 s = %v %v", d, err)
	}
	for _, s := range []float64{0, -1, math.NaN(), 0.0001, 601, math.Inf(1)} {
		if _, err := ObjectiveFromSecs(s); err == nil {
			t.Errorf("objective %v s accepted", s)
		}
	}
}

// A bad objective in the YAML is refused like any value out of range,
// naming the class and the key; a good one is read.
func TestSchedulerConfigObjectives(t *testing.T) {
	c, err := ParseSchedulerConfig([]byte("classes:\n  interactive: {ttft_objective_secs: 0.5}\n"), DefaultSchedulerConfig())
	if err != nil || c.Classes[Interactive].TTFTObjective != 500*ms || c.Classes[Bulk].TTFTObjective != 0 {
		t.Fatalf("objective not read: %v %+v", err, c.Classes)
	}
	for _, v := range []string{"0", "-2", "100000", ".nan"} {
		_, err := ParseSchedulerConfig([]byte("classes:\n  interactive: {ttft_objective_secs: "+v+"}\n"), DefaultSchedulerConfig())
		if err == nil || !strings.Contains(err.Error(), "classes.interactive.ttft_objective_secs") {
			t.Errorf("objective %s: error %v, want one naming classes.interactive.ttft_objective_secs", v, err)
		}
	}
}

// grantsEvery makes o's rooms go to waiters every gap, n times, so the
// pool's pace is known; o's one room is held at the end.
func grantsEvery(t *testing.T, o *oneGate, gap time.Duration, n int) {
	t.Helper()
	for range n {
		res := o.run(1, time.Minute)
		synctest.Wait()
		time.Sleep(gap)
		o.release(1)
		synctest.Wait()
		admittedNow(t, res, "waiter")
	}
}

// Under an objective a request that cannot be sure of a room in time is
// refused at once, on arrival, not after waiting; one that may wait waits
// at most until its objective could no longer be met, never longer.
func TestObjectiveRefusalIsImmediateAndAWaitNeverOutlastsTheObjective(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := newOneGate(1, 1)
		o.acquire(context.Background(), 1, 0)
		grantsEvery(t, o, 50*ms, grantMin)
		full := []Candidate{{TTFT: 100 * ms, Predicted: true}} // meets 400 ms once it has room
		// Rooms every 50 ms: sure within 4.5 gaps (225 ms), inside the
		// 300 ms the objective leaves: it waits, and its room comes.
		v, wait, _ := DecideObjectiveIn(o.wl, 400*ms, full)
		if v != ObjectiveWait || wait != 300*ms {
			t.Fatalf("verdict %v wait %v, want wait 300ms", v, wait)
		}
		res := o.run(1, wait)
		synctest.Wait()
		time.Sleep(50 * ms)
		o.release(1)
		synctest.Wait()
		admittedNow(t, res, "waiter the pace promised a room")

		// The room is held and none frees: the waiter leaves when the
		// objective could no longer be met, not later.
		v, wait, _ = DecideObjectiveIn(o.wl, 400*ms, full)
		if v != ObjectiveWait {
			t.Fatalf("verdict %v, want wait", v)
		}
		began := time.Now()
		if got := o.acquire(context.Background(), 1, wait); got != RoomShed {
			t.Fatalf("waiter with no room: %v, want shed", got)
		}
		if waited := time.Since(began); waited != wait || waited > 400*ms-100*ms {
			t.Fatalf("waited %v, want %v: the objective less the prediction", waited, wait)
		}

		// No room for 300 ms: the pace has slowed past what the objective
		// leaves. Refused at once, on the clock it arrived on.
		began = time.Now()
		v, wait, retry := DecideObjectiveIn(o.wl, 400*ms, full)
		if v != ObjectiveRefuse || wait != 0 || retry < time.Second {
			t.Fatalf("verdict %v wait %v retry %v, want refuse with Retry-After >= 1s", v, wait, retry)
		}
		if d := time.Since(began); d != 0 {
			t.Fatalf("the refusal took %v, want none", d)
		}
		// Without a window there is nothing to be sure of: the plain verdict.
		if v, wait, _ := DecideObjectiveIn(nil, 400*ms, full); v != ObjectiveWait || wait != 300*ms {
			t.Fatalf("no waitlist: verdict %v wait %v, want wait 300ms", v, wait)
		}
	})
}
