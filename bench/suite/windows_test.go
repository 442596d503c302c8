package suite

import (
	"math"
	"testing"
)

// TestLossBound checks Erlang's loss formula against values worked by hand
// and the split of the slots over routers.
func TestLossBound(t *testing.T) {
	for _, c := range []struct {
		name           string
		rate, held     float64
		slots, routers int
		want           float64
	}{
		// One server offered 1 Erlang: B = 1/2, half of it busy.
		{"one server", 1, 1, 1, 1, 0.5},
		// Two servers offered 2 Erlangs: B = 2/5, 1.2 busy.
		{"two servers", 2, 1, 2, 1, 1.2},
		// The same twice over, one router per pair: the same per router.
		{"two routers", 4, 1, 4, 2, 2.4},
		// Three slots over two routers: 2 and 1, each offered 1 Erlang:
		// B(1, 2) = 1/5 and B(1, 1) = 1/2, so 0.8 + 0.5 busy.
		{"uneven shares", 2, 1, 3, 2, 1.3},
		// Light load: hardly anything refused, busy about the offered load.
		{"light", 1, 1, 32, 1, 1},
	} {
		if got := lossBound(c.rate, c.held, c.slots, c.routers); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("%s: lossBound = %v, want %v", c.name, got, c.want)
		}
	}
	// At twice what 32 slots serve, a router that never waits keeps about
	// 97% of them busy; three routers splitting them, about 92%.
	if got := lossBound(62, 1, 32, 1) / 32; got < 0.965 || got > 0.975 {
		t.Errorf("one router at 2x: %.3f of the slots busy, want about 0.97", got)
	}
	if got := lossBound(62, 1, 32, 3) / 32; got < 0.915 || got > 0.93 {
		t.Errorf("three routers at 2x: %.3f of the slots busy, want about 0.92", got)
	}
}
