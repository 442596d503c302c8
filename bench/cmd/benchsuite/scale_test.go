package main

import (
	"strings"
	"testing"

	"github.com/smg-project/smg/bench/scale"
)

// A fan-out row's marginal cost is shown against the floor run with as
// many routers, and only that one.
func TestAgainstFloor(t *testing.T) {
	row := func(name string, routers int, floor bool, us float64) *scale.Result {
		return &scale.Result{Config: scale.Config{Name: name, Routers: routers, Floor: floor},
			Marginal: scale.Marginal{PerRouterChangeUs: us}}
	}
	fan250, fan1000 := row("fanout-R250", 250, false, 12), row("fanout-R1000", 1000, false, 15)
	floor1000 := row("floor-R1000", 1000, true, 10)
	rs := []*scale.Result{fan250, fan1000, floor1000}
	for _, c := range []struct {
		r    *scale.Result
		want string
	}{
		{fan1000, "15.0, 1.50x"},
		{fan250, "12.0"}, // no floor with 250 routers
		{floor1000, "10.0 (the floor)"},
	} {
		if got := againstFloor(c.r, rs); got != c.want {
			t.Errorf("%s: againstFloor = %q, want %q", c.r.Config.Name, got, c.want)
		}
	}
	var b strings.Builder
	writeScaleTable(&b, rs)
	if !strings.Contains(b.String(), "| 15.0, 1.50x |") {
		t.Errorf("table lacks the ratio:\n%s", b.String())
	}
}
