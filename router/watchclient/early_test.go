package watchclient

import (
	"testing"
	"testing/synctest"
	"time"
)

// earlyTarget is a fakeTarget that asks for early reports.
type earlyTarget struct {
	*fakeTarget
	soon chan struct{}
}

func (e earlyTarget) ReportSoon() <-chan struct{} { return e.soon }

// reports drains what the client sent, once the bubble has settled, and
// counts the reports.
func (s *fakeStream) reports() int {
	synctest.Wait()
	n := 0
	for len(s.sent) > 0 {
		if isReport(<-s.sent) {
			n++
		}
	}
	return n
}

// A router that asks for a report gets one at once, not at the next tick,
// but never sooner than MinEarlyReport after the report before it: asks
// within that time fold into one report sent when it is up; the ticks go
// on as before.
func TestEarlyReportsAtOnceAtMostOncePerMinEarlyReport(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fc := newFakeConn()
		target := earlyTarget{newTarget(), make(chan struct{}, 1)}
		runBubbled(t, New(fc, target, Options{RouterID: "r1"}, nil))
		s := <-fc.streams
		s.toClient <- snapshotMsg("E", 1)
		ask := func() { target.soon <- struct{}{} }

		time.Sleep(100 * time.Millisecond) // the first tick is at 250 ms
		if n := s.reports(); n != 0 {
			t.Fatalf("%d reports before the first tick, none asked for", n)
		}
		ask()
		if n := s.reports(); n != 1 {
			t.Fatalf("%d reports at once after an ask, want 1", n)
		}
		ask()
		synctest.Wait()
		ask()
		time.Sleep(MinEarlyReport - time.Millisecond)
		if n := s.reports(); n != 0 {
			t.Fatalf("%d reports within %v of the previous one, want 0", n, MinEarlyReport)
		}
		time.Sleep(time.Millisecond)
		if n := s.reports(); n != 1 {
			t.Fatalf("%d reports %v after the previous one (two asks held), want 1", n, MinEarlyReport)
		}
		time.Sleep(250*time.Millisecond - 100*time.Millisecond - MinEarlyReport) // the tick
		if n := s.reports(); n != 1 {
			t.Fatalf("%d reports at the tick, want 1", n)
		}
		time.Sleep(time.Second)
		if n := s.reports(); n != 4 {
			t.Fatalf("%d reports in the next second without asks, want 4 (the ticks)", n)
		}
	})
}
