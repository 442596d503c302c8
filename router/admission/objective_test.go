package admission

import (
	"math"
	"strings"
	"testing"
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
