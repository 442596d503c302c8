package suite

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/smg-project/smg/bench"
)

// buildSMG builds the smg binary into a temporary directory, or returns
// $SMG_BENCH_BIN when set (make bench-overload SHORT=1 passes bin/smg).
func buildSMG(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("SMG_BENCH_BIN"); bin != "" {
		return bin
	}
	bin := filepath.Join(t.TempDir(), "smg")
	out, err := exec.Command("go", "build", "-o", bin, "../../cmd/smg").CombinedOutput()
	if err != nil {
		t.Fatalf("go build ./cmd/smg: %v\n%s", err, out)
	}
	return bin
}

// TestOverloadSmoke is make bench-overload SHORT=1: real simulated engines
// behind a real smg launch fed by a real smg agent, every configuration at
// 0.5× and 2× of the fleet's nominal capacity. It asserts shapes, not timings.
func TestOverloadSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real binaries for about a minute")
	}
	var log strings.Builder
	// Starting the agent waits until the gateway shows every engine fed by
	// its stream, so every run below covers the agent path.
	s := &Suite{Bin: buildSMG(t), Short: true, Seed: 1, Log: &log, AgentPoll: 100 * time.Millisecond}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	rep, err := s.Overload(ctx)
	if err != nil {
		t.Fatalf("overload scenario: %v\n%s", err, log.String())
	}
	configs := append(append(OverloadConfigs(0), WindowConfigs()...), PriorityConfigs()...)
	for _, gc := range configs {
		for _, load := range []float64{0.5, 2} {
			run, ok := rep.Run(gc.Name, load)
			if !ok && load < 1 && !slices.Contains(shortLightConfigs, gc.Name) {
				continue // a short run offers 2× only to the rest
			}
			if !ok {
				t.Fatalf("no result for %s at %.1fx", gc.Name, load)
			}
			if run.Summary.Requests == 0 || run.Summary.Completed == 0 {
				t.Errorf("%s at %.1fx: %d requests, %d completed; want some of each", gc.Name, load,
					run.Summary.Requests, run.Summary.Completed)
			}
		}
	}
	for _, load := range rep.Loads {
		for _, name := range []string{"off", "steer"} {
			if run, _ := rep.Run(name, load); run.Summary.Shed != 0 {
				t.Errorf("%s at %.1fx shed %d requests; only --worker-overload-shed may shed", name, load, run.Summary.Shed)
			}
		}
	}
	for _, name := range []string{"shed", "shed-tuned"} {
		run, _ := rep.Run(name, 2)
		if run.Summary.Shed == 0 {
			t.Errorf("%s at 2x shed nothing; want 503 %s answers\n%s", name, bench.ShedCode, log.String())
		}
		if run.RetryAfterSeen != run.Summary.Shed {
			t.Errorf("%s at 2x: %d of %d sheds carried Retry-After", name, run.RetryAfterSeen, run.Summary.Shed)
		}
		// Sheds happen only while every engine is vetoed, and the vetoes come
		// from the agent's pushed records: the trace must have seen them.
		var vetoed float64
		for _, sec := range run.Trace {
			vetoed += sec.AllVetoed
		}
		if vetoed == 0 {
			t.Errorf("%s at 2x: no sample of GET /workers showed every engine vetoed, yet %d sheds", name, run.Summary.Shed)
		}
	}
	for _, run := range rep.Runs {
		if got := len(run.Trace); got != int(rep.RunSeconds) {
			t.Errorf("%s at %.1fx: trace of %d seconds, want %.0f", run.Config, run.Load, got, rep.RunSeconds)
		}
		arrivals := 0
		for _, sec := range run.Trace {
			arrivals += sec.Arrivals
		}
		if arrivals != run.Summary.Requests {
			t.Errorf("%s at %.1fx: trace counts %d arrivals, summary %d requests", run.Config, run.Load, arrivals, run.Summary.Requests)
		}
	}
	// The gRPC twin (2× only in a short run) answers beside its HTTP one.
	if pairs := GRPCPairs(rep); len(pairs) != 1 || pairs[0].Config != "window-1r-grpc" || pairs[0].Load != 2 ||
		pairs[0].GRPC.Completed == 0 || pairs[0].HTTP.Completed == 0 {
		t.Errorf("gRPC beside HTTP: %+v; want window-1r-grpc at 2x with answers on both", pairs)
	}
	// The priority mix: both classes sent and summarised apart.
	for _, load := range rep.Loads {
		run, ok := rep.Run("window-priority", load)
		if !ok || run.ByClass["bulk"].Requests == 0 || run.ByClass["interactive"].Requests == 0 ||
			run.ByClass["bulk"].Requests+run.ByClass["interactive"].Requests != run.Summary.Requests {
			t.Errorf("window-priority at %.1fx: per-class summaries %+v of %d requests", load, run.ByClass, run.Summary.Requests)
		}
	}
	var table strings.Builder
	WriteOverloadTable(&table, rep)
	if got := strings.Count(table.String(), "\n"); got != 2+len(rep.Runs) {
		t.Errorf("table has %d lines for %d runs:\n%s", got, len(rep.Runs), table.String())
	}
	t.Logf("took %s\n%s", time.Duration(rep.Took*float64(time.Second)).Round(time.Second), table.String())
}
