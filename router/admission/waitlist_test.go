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

// A waiter without an objective whose selection takes time (the clock
// moves between its joining the queue and its timer starting, so its timer
// fires a little before the wait's end read on the timer's clock) is shed at
// the end of its wait, and the waitlist serves on: its lock is not left held.
func TestGateSlowSelectionShedsAtTheEndOfTheWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := newOneGate(1, 1)
		o.acquire(context.Background(), 1, 0)
		w := &Waiter{Need: 1, Try: func() bool {
			time.Sleep(time.Millisecond) // selection's own time
			return o.g.TryAcquire(1, 0)
		}}
		began := time.Now()
		if got := o.wl.Acquire(context.Background(), w, time.Second); got != RoomShed {
			t.Fatalf("no room in time: %v, want shed", got)
		}
		if d := time.Since(began); d < time.Second || d > time.Second+10*time.Millisecond {
			t.Fatalf("shed after %s, want its 1s wait", d)
		}
		if n := o.waiting(); n != 0 {
			t.Fatalf("a shed request still counts as waiting (%d)", n)
		}
		o.release(1)
		if got := o.acquire(context.Background(), 1, time.Second); got != RoomAtOnce {
			t.Fatalf("after the shed, a request with room: %v, want admitted at once", got)
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

// sure starts a waiter that waits only while its room is sure in time
// (Left: what *left says), of class, for at most wait.
func (o *oneGate) sure(wait time.Duration, class Class, left *time.Duration) (<-chan RoomResult, *time.Duration) {
	out := make(chan RoomResult, 1)
	took := new(time.Duration)
	w := o.waiter(1)
	w.Class, w.Yield = class, true
	w.Left = func() time.Duration { return *left }
	go func() {
		began := time.Now()
		out <- o.wl.Acquire(context.Background(), w, wait)
		*took = time.Since(began)
	}()
	return out, took
}

// A waiter with Left is refused as soon as the pace of grants has slowed so
// far that its room is no longer sure within its wait, not at the end of
// the wait: first in line at a 100 ms pace, a 1 s wait, and no grant
// after it joined, it is refused once c·(t − last grant) passes what is
// left (4.5 gaps first in line: after 1 s / 5.5 ≈ 182 ms). A waiter without
// Left waits its whole wait; a refusal is counted as refused demand.
func TestWaitlistSureWaiterIsRefusedOnceThePaceSlows(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := newOneGate(1, 1)
		o.acquire(context.Background(), 1, 0)
		grantsEvery(t, o, 100*time.Millisecond, grantMin)
		long := time.Hour
		res, took := o.sure(time.Second, Default, &long)
		synctest.Wait()
		time.Sleep(150 * time.Millisecond)
		synctest.Wait()
		stillWaiting(t, res, "sure waiter 150 ms after the last grant")
		time.Sleep(50 * time.Millisecond)
		synctest.Wait()
		select {
		case got := <-res:
			if got != RoomShed {
				t.Fatalf("sure waiter: %v, want shed", got)
			}
		default:
			t.Fatal("sure waiter still waiting 200 ms after the last grant (its room no longer sure within 1 s)")
		}
		if *took < 181*time.Millisecond || *took > 183*time.Millisecond {
			t.Errorf("refused after %v, want 1 s / 5.5 ≈ 182 ms", *took)
		}
		if rooms, _ := o.wl.TakeDemand(); rooms[Default] != 1 {
			t.Errorf("refused demand %v, want 1 room", rooms)
		}
		// Without Left: the whole wait.
		began := time.Now()
		if got := o.acquire(context.Background(), 1, time.Second); got != RoomShed || time.Since(began) != time.Second {
			t.Fatalf("plain waiter: %v after %v, want shed after its whole 1 s", got, time.Since(began))
		}
	})
}

// A waiter with Left is re-evaluated on every grant pass: when what Left
// allows drops to nothing (the prediction moved: no worker would meet its
// objective now) it is refused at the next pass, here a room freed that it
// cannot use; and when waiters of a higher class join ahead of it, at its
// new place its room is no longer sure in time. An unknown pace refuses
// nobody before Left or the wait runs out.
func TestWaitlistSureWaiterIsReevaluatedOnEveryGrantPass(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := newOneGate(1, 1)
		o.acquire(context.Background(), 1, 0)
		// Pace unknown: waits while Left allows, refused at the pass after
		// it dropped to nothing.
		left := time.Hour
		res, took := o.sure(time.Minute, Default, &left)
		synctest.Wait()
		time.Sleep(10 * time.Second)
		stillWaiting(t, res, "sure waiter, pace unknown")
		left = 0
		o.wl.Poke() // a room freed elsewhere: its try fails, the pass re-reads Left
		synctest.Wait()
		if got := <-res; got != RoomShed || *took != 10*time.Second {
			t.Fatalf("sure waiter once Left is 0: %v after %v, want shed at that pass (10 s)", got, *took)
		}

		// Known pace (100 ms): first in line in an 800 ms wait its room is
		// sure (4.5 gaps); two interactive waiters join ahead: third, it
		// needs 3 + 3.5√3 ≈ 9.1 gaps, past what is left. Refused then.
		grantsEvery(t, o, 100*time.Millisecond, grantMin)
		left = time.Hour
		res, took = o.sure(800*time.Millisecond, Default, &left)
		synctest.Wait()
		stillWaiting(t, res, "sure waiter first in line")
		ahead := []<-chan RoomResult{o.runClass(1, time.Minute, Interactive)}
		synctest.Wait()
		stillWaiting(t, res, "sure waiter second in line (2 + 3.5√2 ≈ 6.9 gaps within 800 ms)")
		ahead = append(ahead, o.runClass(1, time.Minute, Interactive))
		synctest.Wait()
		if got := <-res; got != RoomShed || *took != 0 {
			t.Fatalf("sure waiter pushed to third: %v after %v, want shed at once", got, *took)
		}
		for _, r := range ahead {
			o.release(1)
			synctest.Wait()
			admittedNow(t, r, "interactive waiter")
		}
	})
}

// A panic in a waiter's Try (a worker selection, recovered by the HTTP
// server in the goroutine that freed a room) leaves the waitlist unlocked:
// the pool's later requests are answered instead of hanging on its lock.
func TestWaitlistPanicInTryLeavesThePoolUsable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := newOneGate(1, 1)
		if got := o.acquire(context.Background(), 1, 0); got != RoomAtOnce {
			t.Fatalf("first: %v, want at once", got)
		}
		boom := &Waiter{Need: 1, Try: func() bool { panic("selection failed") }}
		done := make(chan RoomResult, 1)
		// Its first Try (joining, with nobody queued) panics too: the
		// join's own lock must be released as well.
		func() {
			defer func() {
				if recover() == nil {
					t.Fatal("Try's panic did not reach the caller")
				}
			}()
			o.wl.Acquire(context.Background(), boom, time.Second)
		}()
		if !o.wl.mu.TryLock() {
			t.Fatal("a panic in Try while joining left the waitlist locked")
		}
		o.wl.mu.Unlock()

		// A waiter already queued whose Try panics on a grant pass.
		armed := false
		late := &Waiter{Need: 1, Try: func() bool {
			if armed {
				panic("selection failed")
			}
			return false
		}}
		go func() { done <- o.wl.Acquire(context.Background(), late, time.Second) }()
		synctest.Wait()
		armed = true
		o.g.Release(1, 0)
		func() {
			defer func() {
				if recover() == nil {
					t.Fatal("Try's panic did not reach Poke's caller")
				}
			}()
			o.wl.Poke()
		}()
		if !o.wl.mu.TryLock() {
			t.Fatal("a panic in Try on a grant pass left the waitlist locked")
		}
		o.wl.mu.Unlock()
		// The pool still answers: the queued waiter is shed at the end of
		// its wait, and a newcomer then takes the free room.
		if got := <-done; got != RoomShed {
			t.Fatalf("queued waiter: %v, want shed at the end of its wait", got)
		}
		if got := o.acquire(context.Background(), 1, time.Second); got != RoomAtOnce {
			t.Fatalf("newcomer: %v, want at once", got)
		}
	})
}
