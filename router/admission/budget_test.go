package admission

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// tokenGate is a waitlist over one worker's gate with no room limit and a
// token limit: waiters take one room and their tokens.
func tokenGate(limit int64) *oneGate {
	o := newOneGate(Unlimited, 0)
	o.g.SetTokens(limit, limit)
	return o
}

func (o *oneGate) tokenWaiter(tokens int64) *Waiter {
	return &Waiter{Need: 1, Tokens: tokens, Class: Default, Try: func() bool { return o.g.TryAcquire(1, tokens) }}
}

// runTokens starts a waiter for tokens in the background.
func (o *oneGate) runTokens(ctx context.Context, tokens int64, wait time.Duration) <-chan RoomResult {
	out := make(chan RoomResult, 1)
	w := o.tokenWaiter(tokens)
	go func() { out <- o.wl.Acquire(ctx, w, wait) }()
	return out
}

func (o *oneGate) releaseTokens(tokens int64) {
	o.g.Release(1, tokens)
	o.wl.Poke()
}

// A request is admitted by the tokens it holds: what fits goes at once,
// what does not waits and goes when tokens free, is shed at its deadline,
// or leaves when its client does; every end gives its tokens back.
func TestTokenBudgetAdmitWaitRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := tokenGate(1000)
		ctx := context.Background()
		if got := o.wl.Acquire(ctx, o.tokenWaiter(600), time.Second); got != RoomAtOnce {
			t.Fatalf("600 of 1000 tokens: %v, want at once", got)
		}
		if o.g.HasRoom(1, 500) || !o.g.HasRoom(1, 400) {
			t.Fatal("HasRoom does not count the tokens held")
		}
		second := o.runTokens(ctx, 500, 10*time.Second)
		synctest.Wait()
		stillWaiting(t, second, "500-token request")
		o.releaseTokens(600)
		synctest.Wait()
		admittedNow(t, second, "500-token request")
		if o.g.Tokens() != 500 {
			t.Fatalf("tokens held %d, want 500", o.g.Tokens())
		}

		// Shed at the deadline: nothing held, the tokens counted as refused.
		shed := o.runTokens(ctx, 600, time.Second)
		time.Sleep(time.Second)
		synctest.Wait()
		if got := <-shed; got != RoomShed {
			t.Fatalf("600 more tokens after the wait: %v, want shed", got)
		}
		if _, tok := o.wl.TakeDemand(); tok[Default] != 600 {
			t.Fatalf("refused token demand %v, want 600", tok)
		}

		// The client leaves while waiting: it leaves nothing held.
		cctx, cancel := context.WithCancel(ctx)
		gone := o.runTokens(cctx, 600, 10*time.Second)
		synctest.Wait()
		if _, tok := o.wl.TakeDemand(); tok[Default] != 600 {
			t.Fatalf("waiting token demand %v, want 600", tok)
		}
		cancel()
		synctest.Wait()
		if got := <-gone; got != RoomCancelled {
			t.Fatalf("client left: %v, want cancelled", got)
		}
		if o.g.Tokens() != 500 || o.wl.Waiters() != 0 {
			t.Fatalf("after the leaver: tokens %d waiters %d, want 500 and 0", o.g.Tokens(), o.wl.Waiters())
		}
		o.releaseTokens(500)
		if o.g.Tokens() != 0 || o.g.InFlight() != 0 {
			t.Fatalf("all released: tokens %d rooms %d", o.g.Tokens(), o.g.InFlight())
		}
		if !o.g.TooManyTokens(1001) || o.g.TooManyTokens(1000) {
			t.Fatal("TooManyTokens does not compare with the whole budget")
		}
	})
}

// Concurrent takers never hold more tokens than the limit, nor more rooms.
func TestTokenBudgetNeverExceededConcurrently(t *testing.T) {
	var g Gate
	g.Set(6, 6)
	g.SetTokens(1000, 1000)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var over []int64
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(i), 7))
			for range 2000 {
				n := 1 + r.Int64N(400)
				if !g.TryAcquire(1, n) {
					continue
				}
				if tk, rm := g.Tokens(), g.InFlight(); tk > 1000 || rm > 6 {
					mu.Lock()
					over = append(over, tk)
					mu.Unlock()
				}
				g.Release(1, n)
			}
		}()
	}
	wg.Wait()
	if len(over) > 0 || g.Tokens() != 0 || g.InFlight() != 0 {
		t.Fatalf("held over the limits %d times (%v); left %d tokens %d rooms", len(over), over[:min(len(over), 5)], g.Tokens(), g.InFlight())
	}
}

// A request whose tokens do not fit lets smaller ones behind it pass for
// BypassFor, then blocks the queue until it is admitted itself, so it is
// never starved by a stream of short ones.
func TestTokenBudgetShortRequestsPassALongOneForAWhile(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := tokenGate(1000)
		ctx := context.Background()
		if got := o.wl.Acquire(ctx, o.tokenWaiter(700), time.Second); got != RoomAtOnce {
			t.Fatal(got)
		}
		long := o.runTokens(ctx, 600, time.Minute)
		synctest.Wait()
		stillWaiting(t, long, "long request")
		short := o.runTokens(ctx, 50, time.Minute)
		synctest.Wait()
		admittedNow(t, short, "short request behind a long one that does not fit")

		time.Sleep(BypassFor)
		late := o.runTokens(ctx, 50, time.Minute)
		synctest.Wait()
		stillWaiting(t, late, "short request after the long one waited BypassFor")
		o.releaseTokens(700)
		synctest.Wait()
		admittedNow(t, long, "long request")
		admittedNow(t, late, "short request behind it")
		if o.g.Tokens() != 700 {
			t.Fatalf("tokens held %d, want 50+600+50", o.g.Tokens())
		}
	})
}
