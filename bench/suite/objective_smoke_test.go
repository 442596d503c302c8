package suite

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestObjectiveSmoke is the objective scenario's part of make bench-overload
// SHORT=1: heterogeneous requests at 2× through one router under a TTFT
// objective. It asserts shapes, not timings: requests admitted and refused,
// every refusal the objective's own 503 with Retry-After, the prediction
// measured.
func TestObjectiveSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real binaries for about ten seconds")
	}
	var log strings.Builder
	s := &Suite{Bin: buildSMG(t), Short: true, Seed: 1, Log: &log, AgentPoll: 100 * time.Millisecond}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := s.Objectives(ctx)
	if err != nil {
		t.Fatalf("objective scenario: %v\n%s", err, log.String())
	}
	run, ok := rep.Run("het-objective-1r", 2)
	if !ok {
		t.Fatalf("no run of het-objective-1r at 2x: %+v", rep.Runs)
	}
	if run.Admitted == 0 || run.Summary.Completed == 0 || run.Refused == 0 {
		t.Errorf("at 2x: admitted %d, completed %d, refused %d; want some of each\n%s", run.Admitted, run.Summary.Completed, run.Refused, log.String())
	}
	if run.Prediction.N == 0 {
		t.Errorf("no prediction ratio measured on the router")
	}
	if run.Summary.Errors != 0 {
		t.Errorf("%d errors (%v): every request must complete or be refused", run.Summary.Errors, run.Summary.ErrorKinds)
	}
	if run.Refused != run.Summary.Status503 || run.Refused != run.Summary.Shed {
		t.Errorf("%d refusals, %d of them 503, %d with a refusal's code", run.Refused, run.Summary.Status503, run.Summary.Shed)
	}
	var table strings.Builder
	WriteObjectiveTable(&table, rep)
	t.Logf("took %s\n%s", time.Duration(rep.Took*float64(time.Second)).Round(time.Second), table.String())
}
