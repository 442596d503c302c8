package promseries_test

import (
	"testing"

	"github.com/smg-project/smg/internal/promseries"
)

// Pairs come sorted by name (the registry's order, else it copies and sorts
// them on every scrape), and nil when a value is not UTF-8.
func TestPairs(t *testing.T) {
	got := promseries.Pairs("worker", "http://a", "model", "m", "dp_rank", "0")
	want := [][2]string{{"dp_rank", "0"}, {"model", "m"}, {"worker", "http://a"}}
	if len(got) != len(want) {
		t.Fatalf("%d pairs, want %d", len(got), len(want))
	}
	for i, p := range got {
		if p.GetName() != want[i][0] || p.GetValue() != want[i][1] {
			t.Fatalf("pair %d = %s=%s, want %s=%s", i, p.GetName(), p.GetValue(), want[i][0], want[i][1])
		}
	}
	if p := promseries.Pairs("worker", "http://\xff"); p != nil {
		t.Fatalf("a value not UTF-8 gave %v, want nil", p)
	}
}
