package router

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

// gateRun acquires in a goroutine and reports the result on a channel.
func gateRun(g *pdGate, need, window int64, wait time.Duration) <-chan gateResult {
	out := make(chan gateResult, 1)
	go func() { out <- g.acquire(context.Background(), need, window, wait) }()
	return out
}

func TestPDGateRoomDispatchesAtOnce(t *testing.T) {
	g := &pdGate{}
	g.setLimit(2)
	for range 2 {
		if got := g.acquire(context.Background(), 1, 2, time.Second); got != gateAdmitted {
			t.Fatalf("acquire with room = %v, want admitted", got)
		}
	}
	if in, _ := g.demand(); in != 2 {
		t.Fatalf("in flight = %d, want 2", in)
	}
}

func TestPDGateFullWaitsThenShedsAtTheDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &pdGate{}
		g.setLimit(1)
		g.acquire(context.Background(), 1, 1, 0)
		began := time.Now()
		res := gateRun(g, 1, 1, 30*time.Second)
		synctest.Wait()
		if _, waiting := g.demand(); waiting != 1 {
			t.Fatalf("waiting rooms = %d, want 1", waiting)
		}
		if got := <-res; got != gateShed {
			t.Fatalf("no room in time: %v, want shed", got)
		}
		if d := time.Since(began); d != 30*time.Second {
			t.Fatalf("shed after %s, want the whole 30s wait", d)
		}
		if _, waiting := g.demand(); waiting != 0 {
			t.Fatalf("a shed request still counts as waiting (%d)", waiting)
		}
	})
}

func TestPDGateFreedRoomGoesToLongestWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &pdGate{}
		g.setLimit(1)
		g.acquire(context.Background(), 1, 1, 0)
		first := gateRun(g, 1, 1, time.Minute)
		synctest.Wait()
		time.Sleep(time.Second) // fake time: first has waited longer
		second := gateRun(g, 1, 1, time.Minute)
		synctest.Wait()
		g.release(1)
		synctest.Wait()
		select {
		case got := <-first:
			if got != gateWaited {
				t.Fatalf("first waiter: %v, want waited", got)
			}
		default:
			t.Fatal("the freed room did not go to the longest waiter")
		}
		select {
		case <-second:
			t.Fatal("the second waiter was admitted with no room")
		default:
		}
		g.release(1)
		if got := <-second; got != gateWaited {
			t.Fatalf("second waiter: %v, want waited", got)
		}
	})
}

func TestPDGateNewcomerQueuesBehindWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &pdGate{}
		g.setLimit(2)
		g.acquire(context.Background(), 1, 4, 0)
		wide := gateRun(g, 2, 4, time.Minute) // needs 2, only 1 free: waits
		synctest.Wait()
		// One room is free, but the wide request waited first.
		if got := g.acquire(context.Background(), 1, 4, 0); got != gateShed {
			t.Fatalf("newcomer with 0 wait while others wait: %v, want shed (FCFS)", got)
		}
		g.release(1)
		if got := <-wide; got != gateWaited {
			t.Fatalf("wide waiter: %v, want waited", got)
		}
	})
}

func TestPDGateZeroWaitShedsWhenFull(t *testing.T) {
	g := &pdGate{}
	g.setLimit(1)
	g.acquire(context.Background(), 1, 1, 0)
	if got := g.acquire(context.Background(), 1, 1, 0); got != gateShed {
		t.Fatalf("--pd-admission-wait-secs 0 on a full window: %v, want shed", got)
	}
}

func TestPDGateWiderThanWindowShedsAtOnce(t *testing.T) {
	g := &pdGate{}
	g.setLimit(8)
	if got := g.acquire(context.Background(), 9, 8, time.Minute); got != gateTooWide {
		t.Fatalf("batch of 9 on a window of 8: %v, want too wide", got)
	}
	// Wider than this router's share but not than the window: it waits.
	synctest.Test(t, func(t *testing.T) {
		g := &pdGate{}
		g.setLimit(2)
		res := gateRun(g, 4, 8, time.Minute)
		synctest.Wait()
		g.setLimit(4) // the control plane grew the share
		if got := <-res; got != gateWaited {
			t.Fatalf("batch within the window after the share grew: %v, want waited", got)
		}
	})
}

func TestPDGateNoWindowNeverGated(t *testing.T) {
	w := Worker{Type: TypeDecode}
	g := &pdGate{}
	g.setLimit(gateLimit(&w, PDWindowShared))
	for range 1000 {
		if got := g.acquire(context.Background(), 1, w.MaxRunning, 0); got != gateAdmitted {
			t.Fatalf("worker without a window: %v, want admitted", got)
		}
	}
}

func TestPDGateClientLeavingFreesItsPlace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &pdGate{}
		g.setLimit(1)
		g.acquire(context.Background(), 1, 1, 0)
		ctx, cancel := context.WithCancel(context.Background())
		out := make(chan gateResult, 1)
		go func() { out <- g.acquire(ctx, 1, 1, time.Minute) }()
		synctest.Wait()
		cancel()
		if got := <-out; got != gateCanceled {
			t.Fatalf("client left: %v, want canceled", got)
		}
		if _, waiting := g.demand(); waiting != 0 {
			t.Fatalf("waiting = %d after the client left", waiting)
		}
	})
}

func TestGateLimit(t *testing.T) {
	for _, c := range []struct {
		name             string
		max, share, want int64
		mode             string
	}{
		{"no window", 0, 3, unlimited, PDWindowShared},
		{"share granted", 8, 3, 3, PDWindowShared},
		{"no share granted yet", 8, -1, 0, PDWindowShared},
		{"no allocator: whole window", 8, 0, 8, PDWindowShared},
		{"per-router ignores the share", 8, 3, 8, PDWindowPerRouter},
		{"share above a shrunk window", 2, 3, 2, PDWindowShared},
	} {
		w := Worker{Type: TypeDecode, MaxRunning: c.max, WindowShare: c.share}
		if got := gateLimit(&w, c.mode); got != c.want {
			t.Errorf("%s: limit %d, want %d", c.name, got, c.want)
		}
	}
}
