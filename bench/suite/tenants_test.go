package suite

import (
	"strings"
	"testing"

	"github.com/smg-project/smg/bench"
)

// The target pools every round's answers: a round of 100 whose p99 is one
// of its two slow answers reads, with the next round's 100, as the 1% it is.
func TestTenantTargetPoolsTheRounds(t *testing.T) {
	answers := func(base float64, slow int) []float64 {
		xs := make([]float64, 100)
		for i := range xs {
			xs[i] = base + float64(i%10)/1000
		}
		for i := range slow {
			xs[i] = 0.300
		}
		return xs
	}
	run := func(config string, ttft []float64, shed int) TenantRun {
		return TenantRun{Config: config, SteadyTTFT: ttft, ByTenant: map[string]bench.Summary{
			"steady": {Requests: len(ttft) + shed, Shed: shed, TTFT: bench.PercentilesOf(ttft)}}}
	}
	runs := []TenantRun{
		run("tenants-alone#1", answers(0.100, 0), 0),
		run("tenants-flood#1", answers(0.105, 2), 2),
		run("tenants-alone#2", answers(0.100, 0), 0),
		run("tenants-flood#2", answers(0.105, 0), 1),
	}
	var b strings.Builder
	writeTenantTarget(&b, runs)
	got := b.String()
	// Alone: p99 of 200 answers of 100-109 ms is 109 ms. Beside the flood the
	// two 300 ms answers are the pooled sample's slowest 1%: its p99 is
	// 114 ms; per round 300 and 114 ms.
	for _, want := range []string{"114 ms against 109 ms over all 2 rounds' answers (200 and 200), 1.05×: met",
		"Per round: 1.05-2.75× (median 1.90×)", "refused 3 times in 203 requests"} {
		if !strings.Contains(got, want) {
			t.Errorf("target line %q\nlacks %q", got, want)
		}
	}
	// No steady answer alone or beside the flood: no ratio to state.
	runs[0].SteadyTTFT, runs[2].SteadyTTFT = nil, nil
	b.Reset()
	writeTenantTarget(&b, runs)
	if got := b.String(); got != "" {
		t.Errorf("without answers alone: %q, want no target line", got)
	}
}
