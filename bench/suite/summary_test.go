package suite

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/smg-project/smg/bench"
)

func TestReplaceBlockKeepsOtherSections(t *testing.T) {
	path := filepath.Join(t.TempDir(), "benchmarks.md")
	orig := "# Benchmarks\n\n## Router hot path\n\nnumbers\n\n## Overload benchmark\n\nintro\n\n## Later\n\nkeep me\n"
	if err := os.WriteFile(path, []byte(orig), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, content := range []string{"first", "second"} {
		if err := replaceBlock(path, "bench-overload", content); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := os.ReadFile(path)
	doc := string(b)
	for _, want := range []string{"## Router hot path\n\nnumbers", "intro", "second", "## Later\n\nkeep me"} {
		if !strings.Contains(doc, want) {
			t.Errorf("missing %q in\n%s", want, doc)
		}
	}
	if strings.Contains(doc, "first") || strings.Index(doc, "second") > strings.Index(doc, "## Later") {
		t.Errorf("block not replaced in place:\n%s", doc)
	}
}

func TestTraceBinsArrivalsAndVerdictsBySecond(t *testing.T) {
	records := []bench.Record{
		{Start: 0.2, Engine: "0", Completed: true, TTFT: 0.1},
		{Start: 0.7, Engine: "1", Completed: true, TTFT: 0.4},
		{Start: 1.5, Shed: true, Status: 503},
		{Start: 2.0001, Engine: "1", Completed: true, TTFT: 0.2}, // late start of an arrival scheduled in the window
	}
	vetoed := func(at float64, engine int, v bool, waiting int) WorkerSample {
		s := WorkerSample{At: at, Engine: engine}
		s.Waiting = waiting
		if v {
			s.Vetoed, s.Veto = true, "overload"
		}
		return s
	}
	samples := []WorkerSample{
		vetoed(0.5, 0, false, 0), vetoed(0.5, 1, true, 3),
		vetoed(1.2, 0, true, 4), vetoed(1.2, 1, true, 2),
		vetoed(1.7, 0, false, 1), vetoed(1.7, 1, true, 5),
	}
	tr := Trace(records, samples, 2, 2)
	if len(tr) != 2 {
		t.Fatalf("trace of %d seconds, want 2", len(tr))
	}
	s0, s1 := tr[0], tr[1]
	if s0.Arrivals != 2 || s0.Shed != 0 || s0.Routed[0] != 1 || s0.Routed[1] != 1 || s0.TTFTMax != 0.4 {
		t.Errorf("second 0 = %+v; want 2 arrivals, one per engine, max TTFT 0.4", s0)
	}
	if s1.Arrivals != 2 || s1.Shed != 1 || s1.Routed[1] != 1 {
		t.Errorf("second 1 = %+v; want the shed and the late start", s1)
	}
	if s0.VetoedShare[1] != 1 || s0.VetoedShare[0] != 0 || s0.AllVetoed != 0 || s0.MaxWaiting[1] != 3 {
		t.Errorf("second 0 verdicts = %+v", s0)
	}
	if s1.VetoedShare[0] != 0.5 || s1.VetoedShare[1] != 1 || s1.AllVetoed != 0.5 || s1.MaxWaiting[0] != 4 || s1.MaxWaiting[1] != 5 {
		t.Errorf("second 1 verdicts = %+v; want engine 0 vetoed in half the samples, all vetoed in half", s1)
	}
}
