package scale

import (
	"strings"
	"testing"
	"time"
)

// TestSlowReportsSlowestFirstWithTheNextGC: the log lists the slowest
// flips first, each with the end of the first collection after its send.
func TestSlowReportsSlowestFirstWithTheNextGC(t *testing.T) {
	base := time.Unix(1000, 0)
	ms := func(d int) int64 { return base.Add(time.Duration(d) * time.Millisecond).UnixNano() }
	flips := [][2]int64{
		{ms(100), ms(101)}, // 1 ms
		{ms(300), ms(350)}, // 50 ms: a GC ended 40 ms after its send
		{ms(500), ms(505)}, // 5 ms: no GC after it
	}
	ends := []time.Time{base.Add(340 * time.Millisecond), base.Add(200 * time.Millisecond), base.Add(50 * time.Millisecond)}
	var b strings.Builder
	logSlowReports(&b, "x", flips, ends)
	want := []string{
		"scale x: slow report → verdict 50.0 ms, sent at +300 ms in its second; the next GC ended 40.0 ms after the send",
		"scale x: slow report → verdict 5.0 ms, sent at +500 ms in its second; no GC ended after it",
		"scale x: slow report → verdict 1.0 ms, sent at +100 ms in its second; the next GC ended 100.0 ms after the send",
	}
	if got := strings.Split(strings.TrimSpace(b.String()), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
