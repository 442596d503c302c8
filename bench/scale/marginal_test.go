package scale

import (
	"math"
	"testing"
	"time"
)

func TestMarginal(t *testing.T) {
	near := func(got, want float64) bool { return math.Abs(got-want) < 1e-9 }
	quiet := phase{wall: 10 * time.Second, cpu: 2 * time.Second, revs: 40, sent: 10_000, reads: 80_000, writes: 90_000}
	flips := phase{wall: 10 * time.Second, cpu: 5 * time.Second, revs: 240, sent: 210_000, reads: 180_000, writes: 490_000}
	// 3 s of CPU more for 200 revisions more to 1,000 routers: 15 µs per
	// router per change; for 200,000 messages more: 15 µs per message, 2
	// writes and half a read per message.
	want := Marginal{PerRouterChangeUs: 15, PerSentUs: 15, WritesPerSent: 2, ReadsPerSent: 0.5}
	same := func(a, b Marginal) bool {
		return near(a.PerRouterChangeUs, b.PerRouterChangeUs) && near(a.PerSentUs, b.PerSentUs) &&
			near(a.WritesPerSent, b.WritesPerSent) && near(a.ReadsPerSent, b.ReadsPerSent)
	}
	if m := marginal(quiet, flips, 1000); !same(m, want) {
		t.Errorf("marginal = %+v; want %+v", m, want)
	}
	// A quiet window half as long counts double.
	half := phase{wall: 5 * time.Second, cpu: time.Second, revs: 20, sent: 5_000, reads: 40_000, writes: 45_000}
	if m := marginal(half, flips, 1000); !same(m, want) {
		t.Errorf("marginal with a half-length quiet window = %+v; want %+v", m, want)
	}
	// The upper bound charges everything: 5 s over 1,000 x 240.
	if ub := flips.cpu.Seconds() * 1e6 / 1000 / float64(flips.revs); ub < 20 {
		t.Errorf("upper bound %v µs: want above the marginal", ub)
	}
	// No extra revisions or messages, no quiet window, no routers: nothing
	// to divide by.
	for name, m := range map[string]Marginal{
		"two quiet windows": marginal(quiet, quiet, 1000),
		"no quiet window":   marginal(phase{}, flips, 1000),
		"no routers":        marginal(quiet, flips, 0),
	} {
		if m != (Marginal{}) {
			t.Errorf("%s: marginal = %+v; want zeros", name, m)
		}
	}
}

func TestSince(t *testing.T) {
	p0 := phase{cpu: time.Second, revs: 10, sent: 100, reads: 5, writes: 7}
	p1 := phase{cpu: 3 * time.Second, revs: 25, sent: 400, reads: 8, writes: 17}
	got := since(p0, p1, 10*time.Second)
	want := phase{wall: 10 * time.Second, cpu: 2 * time.Second, revs: 15, sent: 300, reads: 3, writes: 10}
	if got != want {
		t.Errorf("since = %+v; want %+v", got, want)
	}
}

// allAt is when the last router was sent a revision at or past rev.
func TestSendLogAllAt(t *testing.T) {
	l := newSendLog()
	l.on.Store(true)
	l.sent("router-00000", 3)
	l.sent("router-00001", 2)
	l.sent("joiner-0-0", 9) // not a synthetic router: not logged
	if _, ok := l.allAt(3, 2); ok {
		t.Error("allAt(3): router-00001 was never sent 3 or later, want not ok")
	}
	l.sent("router-00001", 5)
	at, ok := l.allAt(3, 2)
	if !ok {
		t.Fatal("allAt(3) not ok after both routers were sent 3 or later")
	}
	var want int64
	l.byPeer.Range(func(_, p any) bool { want = max(want, p.(*peerLog).log[len(p.(*peerLog).log)-1].at); return true })
	if at != want {
		t.Errorf("allAt(3) = %d, want the later send %d", at, want)
	}
	if _, ok := l.allAt(3, 3); ok {
		t.Error("allAt with 3 routers of which 2 logged: want not ok")
	}
}
