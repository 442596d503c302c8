package windows

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func sum(v []int64) (s int64) {
	for _, x := range v {
		s += x
	}
	return s
}

func TestPlanSplitsByDemandAndSpreadsTheRest(t *testing.T) {
	for _, c := range []struct {
		name   string
		window int64
		in     []RouterInput
		want   []int64
	}{
		{"idle: even floor", 4, []RouterInput{{ID: "a"}, {ID: "b"}, {ID: "c"}}, []int64{2, 1, 1}},
		{"max-min fair", 6, []RouterInput{{ID: "a", Demand: 1}, {ID: "b", Demand: 10}, {ID: "c", Demand: 10}}, []int64{1, 3, 2}},
		{"fewer rooms than routers: most waiting first", 2,
			[]RouterInput{{ID: "a", Demand: 3, Waiting: 1}, {ID: "b", Demand: 5, Waiting: 5}, {ID: "c", Demand: 4, Waiting: 2}},
			[]int64{0, 1, 1}},
	} {
		got := Plan(c.window, c.in)
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: Plan = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestPlanGrowsOnlyOutOfReleasedCapacity(t *testing.T) {
	// a holds 3 of 4 and b now waits: a shrinks at once, but b may grow only
	// into the room a has released (held), not into what a may still use.
	in := []RouterInput{
		{ID: "a", Demand: 0, Share: 3, Held: 3},
		{ID: "b", Demand: 4, Waiting: 3, Share: 1, Held: 1},
	}
	got := Plan(4, in)
	if got[0] >= 3 || got[1] != 1 {
		t.Fatalf("before a acknowledges: Plan = %v, want a shrunk and b still 1", got)
	}
	// a applied its lower share and reports 0 in flight: b may take it all.
	in[0].Share, in[0].Held = got[0], got[0]
	got = Plan(4, in)
	if got[1] <= 1 || sum(got) > 4 {
		t.Fatalf("after a released: Plan = %v, want b grown within 4", got)
	}
}

// TestPlanSumBound: whatever the demand, the rooms the routers may occupy
// (max of share and held) never exceed the window, across many rounds where
// each router acknowledges decreases only some of the time.
func TestPlanSumBound(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 200 {
		window := int64(1 + rng.IntN(16))
		n := 1 + rng.IntN(5)
		in := make([]RouterInput, n)
		for i := range in {
			in[i].ID = string(rune('a' + i))
		}
		for round := range 50 {
			for i := range in {
				in[i].Demand = int64(rng.IntN(int(window) * 2))
				in[i].Waiting = in[i].Demand / 2
			}
			next := Plan(window, in)
			for i := range in {
				if next[i] > in[i].Share {
					in[i].Held = max(in[i].Held, next[i])
				}
				in[i].Share = next[i]
				if rng.IntN(2) == 0 { // acknowledged: holds at most its share now
					in[i].Held = in[i].Share
				}
			}
			var occupied int64
			for i := range in {
				occupied += max(in[i].Share, in[i].Held)
			}
			if occupied > window {
				t.Fatalf("trial %d round %d: routers may occupy %d of a window of %d: %+v", trial, round, occupied, window, in)
			}
		}
	}
}

func TestPlanEmptyOrNoWindow(t *testing.T) {
	if got := Plan(0, []RouterInput{{ID: "a", Demand: 3}}); got[0] != 0 {
		t.Fatalf("no window: %v", got)
	}
	if got := Plan(4, nil); len(got) != 0 {
		t.Fatalf("no routers: %v", got)
	}
}
