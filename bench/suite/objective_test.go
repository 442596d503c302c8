package suite

import (
	"testing"

	"github.com/smg-project/smg/bench"
)

// The refusal target pools every load's refusals: one slow refusal among a
// run's 50 is that run's p99, and among all three runs' 150 the 1% it is.
func TestRefusalTargetPoolsTheLoads(t *testing.T) {
	run := func(config string, load float64, slow bool) ObjectiveRun {
		times := make([]float64, 50)
		for i := range times {
			times[i] = 0.001 + float64(i%5)/1000 // 1-5 ms
		}
		if slow {
			times[0] = 0.027
		}
		return ObjectiveRun{Config: config, Load: load, Refused: len(times), RefusalTimes: times, RefusalSecs: bench.PercentilesOf(times)}
	}
	rep := &ObjectiveReport{Runs: []ObjectiveRun{
		run("het-full-1r", 1, false), run("het-full-1r", 2, true), run("het-full-1r", 4, false),
		run("het-full-3r", 4, false), run("het-full-3r", 2, false), run("het-full-3r", 1, false)}}
	if got := rep.Runs[1].RefusalSecs.P99; got != 0.027 {
		t.Fatalf("the slow run's own p99 = %v, want its slowest refusal", got)
	}
	if got := rep.refusalP99("het-full-1r"); got != 0.005 {
		t.Errorf("pooled p99 over 150 refusals, one of them slow = %v s, want 0.005", got)
	}
	// A report without each refusal's time: the slowest run's p99 bounds it.
	rep.Runs[0].RefusalTimes = nil
	if got := rep.refusalP99("het-full-1r"); got != 0.027 {
		t.Errorf("without the times = %v s, want the slowest run's p99 0.027", got)
	}
	if got := rep.refusalP99("het-full-3r"); got != 0.005 {
		t.Errorf("other config = %v s, want 0.005", got)
	}
}
