package admission

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

// oneGate is a waitlist over a single worker's gate: the smallest pool.
type oneGate struct {
	g  Gate
	wl *Waitlist
}

func newOneGate(limit, window int64) *oneGate {
	o := &oneGate{wl: NewWaitlist()}
	o.g.Set(limit, window)
	return o
}

func (o *oneGate) waiter(need int64) *Waiter {
	return &Waiter{Need: need, Try: func() bool { return o.g.TryAcquire(need, 0) }}
}

func (o *oneGate) acquire(ctx context.Context, need int64, wait time.Duration) RoomResult {
	return o.wl.Acquire(ctx, o.waiter(need), wait)
}

func (o *oneGate) run(need int64, wait time.Duration) <-chan RoomResult {
	return o.runClass(need, wait, Default)
}

// runClass starts a waiter of class in the background.
func (o *oneGate) runClass(need int64, wait time.Duration, class Class) <-chan RoomResult {
	out := make(chan RoomResult, 1)
	w := o.waiter(need)
	w.Class = class
	go func() { out <- o.wl.Acquire(context.Background(), w, wait) }()
	return out
}

// admittedNow fails unless res already holds "waited" (a freed room went to it).
func admittedNow(t *testing.T, res <-chan RoomResult, who string) {
	t.Helper()
	select {
	case got := <-res:
		if got != RoomWaited {
			t.Fatalf("%s: %v, want waited", who, got)
		}
	default:
		t.Fatalf("the freed room did not go to the %s", who)
	}
}

// stillWaiting fails if res already holds a result.
func stillWaiting(t *testing.T, res <-chan RoomResult, who string) {
	t.Helper()
	select {
	case <-res:
		t.Fatalf("the %s was admitted with no room", who)
	default:
	}
}

func (o *oneGate) release(need int64) {
	o.g.Release(need, 0)
	o.wl.Poke()
}

func (o *oneGate) setLimit(l int64) {
	o.g.limit.Store(l)
	o.wl.Poke()
}

func (o *oneGate) waiting() int64 {
	var n int64
	for _, c := range o.wl.WaitingByClass() {
		n += c
	}
	return n
}

func TestGateRoomDispatchesAtOnce(t *testing.T) {
	o := newOneGate(2, 2)
	for range 2 {
		if got := o.acquire(context.Background(), 1, time.Second); got != RoomAtOnce {
			t.Fatalf("acquire with room = %v, want admitted", got)
		}
	}
	if in := o.g.InFlight(); in != 2 {
		t.Fatalf("in flight = %d, want 2", in)
	}
	if o.g.HasRoom(1, 0) {
		t.Fatal("a full gate reports room")
	}
}

func TestGateFullWaitsThenShedsAtTheDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := newOneGate(1, 1)
		o.acquire(context.Background(), 1, 0)
		began := time.Now()
		res := o.run(1, 30*time.Second)
		synctest.Wait()
		if w := o.waiting(); w != 1 {
			t.Fatalf("waiting rooms = %d, want 1", w)
		}
		if got := <-res; got != RoomShed {
			t.Fatalf("no room in time: %v, want shed", got)
		}
		if d := time.Since(began); d != 30*time.Second {
			t.Fatalf("shed after %s, want the whole 30s wait", d)
		}
		if w := o.waiting(); w != 0 {
			t.Fatalf("a shed request still counts as waiting (%d)", w)
		}
	})
}

func TestGateFreedRoomGoesToLongestWaiterAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := newOneGate(1, 1)
		o.acquire(context.Background(), 1, 0)
		first := o.run(1, time.Minute)
		synctest.Wait()
		time.Sleep(time.Second) // fake time: first has waited longer
		second := o.run(1, time.Minute)
		synctest.Wait()
		freed := time.Now()
		o.release(1)
		synctest.Wait()
		admittedNow(t, first, "longest waiter")
		if d := time.Since(freed); d != 0 {
			t.Fatalf("dispatched %s after the room freed, want at once (event-driven)", d)
		}
		stillWaiting(t, second, "second waiter")
		o.release(1)
		if got := <-second; got != RoomWaited {
			t.Fatalf("second waiter: %v, want waited", got)
		}
	})
}

// Under the scheduler a pool's waiters are served highest class first: a
// freed room goes to an interactive request that came after a bulk one.
func TestGateFreedRoomGoesToTheHighestClass(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := newOneGate(1, 1)
		o.acquire(context.Background(), 1, 0)
		run := func(class Class) <-chan RoomResult {
			res := o.runClass(1, time.Minute, class)
			synctest.Wait()
			return res
		}
		bulk := run(Bulk)
		inter := run(Interactive)
		bulk2 := run(Bulk)
		o.release(1)
		synctest.Wait()
		admittedNow(t, inter, "interactive waiter")
		o.release(1)
		synctest.Wait()
		admittedNow(t, bulk, "first bulk waiter (FIFO within the class)")
		stillWaiting(t, bulk2, "second bulk waiter")
		o.release(1)
		<-bulk2
	})
}

func TestGateNewcomerQueuesBehindWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := newOneGate(2, 4)
		o.acquire(context.Background(), 1, 0)
		wide := o.run(2, time.Minute) // needs 2, only 1 free: waits
		synctest.Wait()
		// One room is free, but the wide request waited first.
		if got := o.acquire(context.Background(), 1, 0); got != RoomShed {
			t.Fatalf("newcomer with 0 wait while others wait: %v, want shed (FCFS)", got)
		}
		o.release(1)
		if got := <-wide; got != RoomWaited {
			t.Fatalf("wide waiter: %v, want waited", got)
		}
	})
}

func TestGateZeroWaitShedsWhenFull(t *testing.T) {
	o := newOneGate(1, 1)
	o.acquire(context.Background(), 1, 0)
	if got := o.acquire(context.Background(), 1, 0); got != RoomShed {
		t.Fatalf("wait 0 on a full window: %v, want shed", got)
	}
}

func TestGateWiderThanWindow(t *testing.T) {
	o := newOneGate(8, 8)
	if !o.g.TooWide(9) || o.g.TooWide(8) {
		t.Fatal("tooWide: a batch of 9 on a window of 8 must be too wide, 8 must not")
	}
	// Wider than this router's share but not than the window: it waits.
	synctest.Test(t, func(t *testing.T) {
		o := newOneGate(2, 8)
		res := o.run(4, time.Minute)
		synctest.Wait()
		o.setLimit(4) // the control plane grew the share
		if got := <-res; got != RoomWaited {
			t.Fatalf("batch within the window after the share grew: %v, want waited", got)
		}
	})
}

func TestGateNoWindowNeverGated(t *testing.T) {
	o := newOneGate(GateLimit(0, 5, false), 0)
	for range 1000 {
		if got := o.acquire(context.Background(), 1, 0); got != RoomAtOnce {
			t.Fatalf("worker without a window: %v, want admitted", got)
		}
	}
}

func TestGateClientLeavingFreesItsPlace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := newOneGate(1, 1)
		o.acquire(context.Background(), 1, 0)
		ctx, cancel := context.WithCancel(context.Background())
		out := make(chan RoomResult, 1)
		go func() { out <- o.acquire(ctx, 1, time.Minute) }()
		synctest.Wait()
		cancel()
		if got := <-out; got != RoomCancelled {
			t.Fatalf("client left: %v, want canceled", got)
		}
		if w := o.waiting(); w != 0 {
			t.Fatalf("waiting = %d after the client left", w)
		}
	})
}

func TestGateLimit(t *testing.T) {
	for _, c := range []struct {
		name             string
		max, share, want int64
		perRouter        bool
	}{
		{"no window", 0, 3, Unlimited, false},
		{"share granted", 8, 3, 3, false},
		{"no share granted yet", 8, -1, 0, false},
		{"no allocator: whole window", 8, 0, 8, false},
		{"per-router ignores the share", 8, 3, 8, true},
		{"share above a shrunk window", 2, 3, 2, false},
	} {
		if got := GateLimit(c.max, c.share, c.perRouter); got != c.want {
			t.Errorf("%s: limit %d, want %d", c.name, got, c.want)
		}
	}
}

// ExpectedWait reads the pace of the latest grants to waiters: nothing
// until a few rooms went to waiters, then the mean gap between grants once
// per waiter ahead and once more; a pace that slowed shows at once, and
// grants older than the window no longer count.
func TestWaitlistExpectedWaitFollowsThePaceOfGrants(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := newOneGate(1, 1)
		o.acquire(context.Background(), 1, 0)
		if _, ok := o.wl.ExpectedWait(); ok {
			t.Fatal("an expected wait before any grant")
		}
		// A room frees every 100 ms, each to a waiter.
		for i := range grantMin {
			res := o.run(1, time.Minute)
			synctest.Wait()
			if _, ok := o.wl.ExpectedWait(); ok {
				t.Fatalf("an expected wait after %d grants", i)
			}
			time.Sleep(100 * time.Millisecond)
			o.release(1)
			synctest.Wait()
			admittedNow(t, res, "waiter")
		}
		d, ok := o.wl.ExpectedWait()
		if !ok || d != 100*time.Millisecond {
			t.Fatalf("expected wait with nobody waiting = %v %v, want 100ms", d, ok)
		}
		// Two waiting: the third in line waits three gaps.
		a := o.run(1, time.Minute)
		synctest.Wait()
		b := o.run(1, time.Minute)
		synctest.Wait()
		if d, _ := o.wl.ExpectedWait(); d != 300*time.Millisecond {
			t.Fatalf("expected wait behind two waiters = %v, want 300ms", d)
		}
		// No room for 500 ms: the pace has slowed to at least that.
		time.Sleep(500 * time.Millisecond)
		if d, _ := o.wl.ExpectedWait(); d != 1500*time.Millisecond {
			t.Fatalf("expected wait after 500 ms without a grant = %v, want 1.5s", d)
		}
		o.release(1)
		synctest.Wait()
		admittedNow(t, a, "first waiter")
		o.release(1)
		synctest.Wait()
		admittedNow(t, b, "second waiter")
		// Grants older than the window say nothing.
		time.Sleep(grantWindow + time.Second)
		if _, ok := o.wl.ExpectedWait(); ok {
			t.Fatal("an expected wait from grants older than the window")
		}
	})
}

// A yielding head (its objective is met only on a full worker) does not
// hold the line: a room it cannot use goes to the waiter behind it, and a
// yielding newcomer with no time to wait takes a room the waiters left.
// A head that does not yield keeps the line (first come, first served).
func TestWaitlistYieldingHeadLetsOthersPass(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := newOneGate(1, 1)
		o.acquire(context.Background(), 1, 0)
		picky := func(yield bool) <-chan RoomResult {
			out := make(chan RoomResult, 1)
			w := &Waiter{Need: 1, Yield: yield, Try: func() bool { return false }}
			go func() { out <- o.wl.Acquire(context.Background(), w, time.Second) }()
			return out
		}
		head := picky(true)
		synctest.Wait()
		behind := o.run(1, time.Second)
		synctest.Wait()
		o.release(1)
		synctest.Wait()
		admittedNow(t, behind, "waiter behind the yielding head")
		stillWaiting(t, head, "yielding head")

		o.release(1)
		w := &Waiter{Need: 1, Yield: true, Try: func() bool { return o.g.TryAcquire(1, 0) }}
		if got := o.wl.Acquire(context.Background(), w, 0); got != RoomAtOnce {
			t.Fatalf("yielding newcomer with no wait, a room free: %v, want at once", got)
		}
		if got := <-head; got != RoomShed {
			t.Fatalf("yielding head: %v, want shed at its deadline", got)
		}

		// A head that does not yield holds the line.
		strict := picky(false)
		synctest.Wait()
		behind = o.run(1, 2*time.Second) // outlasts the head
		synctest.Wait()
		o.release(1)
		synctest.Wait()
		stillWaiting(t, behind, "waiter behind a head that does not yield")
		if got := o.acquire(context.Background(), 1, 0); got != RoomShed {
			t.Fatalf("newcomer with no wait behind waiters: %v, want shed", got)
		}
		if got := <-strict; got != RoomShed {
			t.Fatalf("head that never takes a room: %v, want shed", got)
		}
		if got := <-behind; got != RoomWaited {
			t.Fatalf("waiter behind it: %v, want the room once the head left", got)
		}
	})
}

// SureWait bounds the wait of the k-th in line at k + 3.5√k gaps.
func TestWaitlistSureWaitIsAHighQuantileOfThePace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := newOneGate(1, 1)
		o.acquire(context.Background(), 1, 0)
		if _, ok := o.wl.SureWait(); ok {
			t.Fatal("a sure wait before any grant")
		}
		for range grantMin {
			res := o.run(1, time.Minute)
			synctest.Wait()
			time.Sleep(100 * time.Millisecond)
			o.release(1)
			synctest.Wait()
			admittedNow(t, res, "waiter")
		}
		if d, ok := o.wl.SureWait(); !ok || d != 450*time.Millisecond {
			t.Fatalf("sure wait first in line = %v %v, want 4.5 gaps (450ms)", d, ok)
		}
		var rs []<-chan RoomResult
		for range 3 {
			rs = append(rs, o.run(1, time.Minute))
			synctest.Wait()
		}
		if d, _ := o.wl.SureWait(); d != 1100*time.Millisecond {
			t.Fatalf("sure wait fourth in line = %v, want 4 + 3.5×2 gaps (1.1s)", d)
		}
		for _, r := range rs {
			o.release(1)
			synctest.Wait()
			admittedNow(t, r, "waiter")
		}
	})
}
