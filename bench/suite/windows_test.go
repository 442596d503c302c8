package suite

import (
	"math"
	"reflect"
	"slices"
	"strings"
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

// TestPickConfigs: --configs runs the configurations in the order named (so
// rounds can alternate twins), name@secs with that router wait, and refuses
// a name it does not know.
func TestPickConfigs(t *testing.T) {
	all := WindowConfigs()
	got, err := pickConfigs(all, []string{"window-vllm-3r-next", "window-3r-next", "window-vllm-1r"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, gc := range got {
		names = append(names, gc.Name)
	}
	if want := []string{"window-vllm-3r-next", "window-3r-next", "window-vllm-1r"}; !slices.Equal(names, want) {
		t.Fatalf("picked %v, want %v", names, want)
	}
	if _, err := pickConfigs(all, []string{"window-1r", "window-9r"}); err == nil || !strings.Contains(err.Error(), "window-9r") {
		t.Fatalf("unknown name: err %v, want one naming window-9r", err)
	}
	// name@secs: the configuration with that router wait, beside itself.
	got, err = pickConfigs(all, []string{"window-3r-next", "window-3r-next@0"})
	if err != nil {
		t.Fatal(err)
	}
	if got[1].Name != "window-3r-next@0" || !slices.Equal(got[1].Flags, windowFlags) ||
		!slices.Contains(got[1].RouterFlags, "0") || slices.Contains(got[1].RouterFlags, roomWait) {
		t.Fatalf("window-3r-next@0: %s %v %v, want wait 0 in both", got[1].Name, got[1].Flags, got[1].RouterFlags)
	}
	if !slices.Equal(got[0].Flags, windowWaitFlags) || got[0].Name != "window-3r-next" {
		t.Fatalf("window-3r-next: %s %v, want %v", got[0].Name, got[0].Flags, windowWaitFlags)
	}
	if _, err := pickConfigs(all, []string{"window-9r@0"}); err == nil || !strings.Contains(err.Error(), "window-9r@0") {
		t.Fatalf("unknown name with a wait: err %v", err)
	}
}

// TestLearnedTwins: every learned-window configuration has a reported-window
// twin (its name without "vllm-") that differs from it only in the engines'
// flavor: the same router flags, routers, spreading, failover and loans, so
// the two compare learned against reported windows and nothing else.
func TestLearnedTwins(t *testing.T) {
	all := WindowConfigs()
	n := 0
	for _, gc := range all {
		if !gc.LearnWindows {
			continue
		}
		n++
		name := strings.Replace(gc.Name, "vllm-", "", 1)
		i := slices.IndexFunc(all, func(c GatewayConfig) bool { return c.Name == name })
		if i < 0 {
			t.Errorf("%s: no reported twin %s", gc.Name, name)
			continue
		}
		twin := all[i]
		if twin.LearnWindows || !slices.Equal(twin.SimArgs, []string{"--flavor", "sglang"}) {
			t.Errorf("%s: twin %s learns (%v) or runs %v, want SGLang engines reporting their window", gc.Name, name, twin.LearnWindows, twin.SimArgs)
		}
		a, b := gc, twin
		a.Name, a.Why, a.LearnWindows, a.SimArgs = "", "", false, nil
		b.Name, b.Why, b.LearnWindows, b.SimArgs = "", "", false, nil
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s differs from %s beyond the window's source:\n%+v\n%+v", gc.Name, name, gc, twin)
		}
	}
	if n < 4 {
		t.Fatalf("%d learned configurations, want one router, three in turn, with failover and with loans", n)
	}
}
