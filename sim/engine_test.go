package sim

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// testConfig is a small engine with round numbers: 10 ms steps, 10,000
// prompt tokens per second (100 tokens = 10 ms).
func testConfig() modelConfig {
	o := DefaultOptions()
	o.MaxRunningRequests = 4
	o.KVCapacityTokens = 10000
	o.PrefillTokensPerSec = 10000
	o.ITL = 10 * time.Millisecond
	o.SGLangMetricsInterval = 4
	return configFrom(o)
}

func startEngine(t *testing.T, cfg modelConfig, dp int) *engine {
	t.Helper()
	e := newEngine(cfg, dp, 1, nil)
	e.start()
	t.Cleanup(e.close)
	return e
}

func mustSubmit(t *testing.T, e *engine, prompt, maxTokens int) *request {
	t.Helper()
	req, err := e.submit(t.Context(), submitSpec{promptTokens: prompt, maxTokens: maxTokens, dpRank: -1})
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// firstTokenAt waits for req's first token and returns when it came.
func firstTokenAt(req *request) time.Time {
	for req.generated.Load() == 0 && !req.done.Load() {
		<-req.notify
	}
	return time.Now()
}

func waitDone(req *request) {
	for !req.done.Load() {
		<-req.notify
	}
}

func TestRunningNeverExceedsWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := startEngine(t, testConfig(), 1)
		var reqs []*request
		for range 20 {
			reqs = append(reqs, mustSubmit(t, e, 50, 5))
		}
		maxRunning, sawQueue := 0, false
		for !reqs[len(reqs)-1].done.Load() {
			time.Sleep(time.Millisecond)
			synctest.Wait()
			st := e.ranks[0].stats(time.Now())
			maxRunning = max(maxRunning, st.Running)
			sawQueue = sawQueue || st.Waiting > 0
		}
		if maxRunning != 4 {
			t.Errorf("max running = %d, want exactly the window 4", maxRunning)
		}
		if !sawQueue {
			t.Error("20 requests on a window of 4 never queued")
		}
		for _, r := range reqs {
			if r.generated.Load() != 5 || r.finish != "length" {
				t.Errorf("request ended with %d tokens, finish %q; want 5, length", r.generated.Load(), r.finish)
			}
		}
	})
}

func TestBurstDeepensQueueAndTTFT(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.window = 2
		// The burst is queued before the scheduler runs: started first, it
		// could take the first request into a step of one before the
		// second arrived.
		e := newEngine(cfg, 1, 1, nil)
		t.Cleanup(e.close)
		start := time.Now()
		var reqs []*request
		for range 8 {
			reqs = append(reqs, mustSubmit(t, e, 100, 10))
		}
		e.start()
		synctest.Wait()
		if st := e.ranks[0].stats(time.Now()); st.Waiting != 6 || st.Running != 2 {
			t.Fatalf("after a burst of 8 on a window of 2: waiting %d running %d, want 6 and 2", st.Waiting, st.Running)
		}
		ttft := make([]time.Duration, len(reqs))
		for i, r := range reqs {
			ttft[i] = firstTokenAt(r).Sub(start)
		}
		// Two prompts of 100 tokens prefill together in one 20 ms step.
		if ttft[0] != 20*time.Millisecond || ttft[1] != 20*time.Millisecond {
			t.Errorf("first pair TTFT = %v, %v; want 20ms (200 tokens at 10,000/s)", ttft[0], ttft[1])
		}
		for i := 2; i < len(ttft); i += 2 {
			if ttft[i] <= ttft[i-2] {
				t.Errorf("TTFT did not grow with queue position: #%d %v after #%d %v", i, ttft[i], i-2, ttft[i-2])
			}
		}
		if ttft[7] < 4*ttft[0] {
			t.Errorf("last TTFT %v, want at least 4x the first (%v): it waited for 3 batches", ttft[7], ttft[0])
		}
	})
}

func TestKVUsageTracksHeldTokens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := startEngine(t, testConfig(), 1)
		a := mustSubmit(t, e, 100, 50)
		b := mustSubmit(t, e, 300, 20)
		for range 15 {
			time.Sleep(10 * time.Millisecond)
			synctest.Wait()
			st := e.ranks[0].stats(time.Now())
			want := 0
			for _, r := range []*request{a, b} {
				if g := int(r.generated.Load()); g > 0 && !r.done.Load() {
					want += r.promptTokens + g
				} else if !r.done.Load() {
					want += r.promptTokens + 1 // admitted: the prompt plus its first token's slot
				}
			}
			if st.KVUsed != want {
				t.Fatalf("KV used %d, want %d (prompts plus generated tokens held)", st.KVUsed, want)
			}
			if got := st.usage(); got != float64(want)/10000 {
				t.Fatalf("usage %v, want %v", got, float64(want)/10000)
			}
		}
		waitDone(a)
		waitDone(b)
		synctest.Wait()
		if st := e.ranks[0].stats(time.Now()); st.KVUsed != 0 || st.usage() != 0 {
			t.Errorf("after completion KV used %d usage %v, want 0", st.KVUsed, st.usage())
		}
	})
}

func TestKVCapacityHoldsQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.capacity = 300
		e := startEngine(t, cfg, 1)
		a := mustSubmit(t, e, 200, 5)
		b := mustSubmit(t, e, 200, 5)
		synctest.Wait()
		if st := e.ranks[0].stats(time.Now()); st.Running != 1 || st.Waiting != 1 {
			t.Fatalf("running %d waiting %d: the second prompt must wait for KV", st.Running, st.Waiting)
		}
		waitDone(a)
		doneA := time.Now()
		if firstTokenAt(b).Before(doneA) {
			t.Error("second request started before the first freed its KV")
		}
		if _, err := e.submit(t.Context(), submitSpec{promptTokens: 290, maxTokens: 20, dpRank: -1}); !errors.Is(err, errTooLong) {
			t.Errorf("a request larger than the cache: err %v, want errTooLong", err)
		}
	})
}

func TestPreemptionWhenDecodeOutgrowsKV(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.capacity = 250
		e := startEngine(t, cfg, 1)
		a := mustSubmit(t, e, 100, 100)
		b := mustSubmit(t, e, 100, 100)
		for !a.done.Load() || !b.done.Load() {
			time.Sleep(5 * time.Millisecond)
			synctest.Wait()
			if st := e.ranks[0].stats(time.Now()); st.KVUsed > 250 {
				t.Fatalf("KV used %d exceeds the capacity 250", st.KVUsed)
			}
		}
		st := e.ranks[0].stats(time.Now())
		if st.Preempt == 0 {
			t.Error("two requests that outgrow the cache were never preempted")
		}
		if a.generated.Load() != 100 || b.generated.Load() != 100 {
			t.Errorf("generated %d and %d, want 100 each after recompute", a.generated.Load(), b.generated.Load())
		}
	})
}

func TestFreezeStopsSteps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := startEngine(t, testConfig(), 1)
		req := mustSubmit(t, e, 10, 1000)
		time.Sleep(100 * time.Millisecond)
		e.setFault(Fault{Freeze: true})
		synctest.Wait()
		before := e.ranks[0].stats(time.Now())
		tokens := req.generated.Load()
		time.Sleep(10 * time.Second)
		synctest.Wait()
		after := e.ranks[0].stats(time.Now())
		if after.Steps != before.Steps || req.generated.Load() != tokens {
			t.Fatalf("frozen engine stepped: steps %d -> %d, tokens %d -> %d", before.Steps, after.Steps, tokens, req.generated.Load())
		}
		if after.Running != 1 {
			t.Errorf("frozen engine dropped its running request: running %d", after.Running)
		}
		e.setFault(Fault{})
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		if req.generated.Load() <= tokens {
			t.Error("no tokens after the freeze was cleared")
		}
	})
}

func TestSlowMultipliesStepTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := startEngine(t, testConfig(), 1)
		e.setFault(Fault{Slow: 3})
		start := time.Now()
		req := mustSubmit(t, e, 100, 11)
		waitDone(req)
		// 10 ms prefill (first token) + 10 steps of 10 ms, all three times slower.
		if got := time.Since(start); got != 330*time.Millisecond {
			t.Errorf("slow x3 request took %v, want 330ms", got)
		}
	})
}

func TestCancelFreesRequest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.window = 1
		e := startEngine(t, cfg, 1)
		a := mustSubmit(t, e, 100, 1000)
		b := mustSubmit(t, e, 100, 5)
		firstTokenAt(a)
		a.cancel()
		waitDone(b)
		synctest.Wait()
		st := e.ranks[0].stats(time.Now())
		if st.Running != 0 || st.KVUsed != 0 || st.Finished["abort"] != 1 {
			t.Errorf("after cancel: running %d KV %d aborts %d; want 0, 0, 1", st.Running, st.KVUsed, st.Finished["abort"])
		}
	})
}

func TestDPRanksAreIndependent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.window = 1
		e := startEngine(t, cfg, 2)
		mustSubmit(t, e, 100, 1000)
		mustSubmit(t, e, 100, 1000)
		synctest.Wait()
		for _, r := range e.ranks {
			if st := r.stats(time.Now()); st.Running != 1 || st.Waiting != 0 {
				t.Errorf("rank %d: running %d waiting %d, want one request on each rank", r.id, st.Running, st.Waiting)
			}
		}
	})
}

func TestSGLangGaugesLag(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := startEngine(t, testConfig(), 1) // publishes every 4 decode steps
		mustSubmit(t, e, 10, 1000)
		time.Sleep(10 * time.Millisecond) // the prefill step publishes
		synctest.Wait()
		b := mustSubmit(t, e, 10, 1000)
		_ = b
		time.Sleep(15 * time.Millisecond) // b is admitted and prefilled with a decode: published
		synctest.Wait()
		st := e.ranks[0].stats(time.Now())
		if st.Published.Running != 2 {
			t.Fatalf("published running %d after a prefill step, want 2", st.Published.Running)
		}
		kv := st.Published.KVUsed
		time.Sleep(20 * time.Millisecond) // two decode steps: not yet the 4th
		synctest.Wait()
		st = e.ranks[0].stats(time.Now())
		if st.Published.KVUsed != kv || st.KVUsed == kv {
			t.Errorf("published KV %d (live %d) moved within the interval from %d", st.Published.KVUsed, st.KVUsed, kv)
		}
	})
}

// pdPair wires a decode engine to a prefill engine in process.
func pdPair(t *testing.T, prefillCfg, decodeCfg modelConfig) (prefill, decode *engine) {
	prefillCfg.role, decodeCfg.role = RolePrefill, RoleDecode
	prefill = startEngine(t, prefillCfg, 1)
	decode = newEngine(decodeCfg, 1, 2, func(ctx context.Context, _ string, _ int, room uint64) error {
		return prefill.Bootstrap(ctx, room)
	})
	decode.start()
	t.Cleanup(decode.close)
	return prefill, decode
}

func submitPD(t *testing.T, e *engine, room uint64, maxTokens int) *request {
	t.Helper()
	req, err := e.submit(t.Context(), submitSpec{promptTokens: 100, maxTokens: maxTokens, dpRank: -1,
		pd: &pdInfo{host: "prefill", port: 1, room: room}})
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func TestPrefillHoldsKVUntilDecodeAdmits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pcfg, dcfg := testConfig(), testConfig()
		dcfg.window = 1
		prefill, decode := pdPair(t, pcfg, dcfg)
		d1 := submitPD(t, decode, 1, 20) // occupies the decode window for ~200 ms
		p1 := submitPD(t, prefill, 1, 1)
		waitDone(p1)
		if p1.err != nil {
			t.Fatalf("prefill of an admitted room failed: %v", p1.err)
		}
		p2 := submitPD(t, prefill, 2, 1)
		d2 := submitPD(t, decode, 2, 20) // waits for the decode window
		firstTokenAt(p2)
		synctest.Wait()
		if st := prefill.ranks[0].stats(time.Now()); st.KVUsed != 101 || p2.done.Load() {
			t.Fatalf("prefill KV %d (done %v) while decode has not admitted room 2; want 101 held", st.KVUsed, p2.done.Load())
		}
		waitDone(d1)
		waitDone(p2)
		waitDone(d2)
		if p2.err != nil || d2.err != nil || d2.generated.Load() != 20 {
			t.Errorf("room 2: prefill err %v, decode err %v, decode tokens %d", p2.err, d2.err, d2.generated.Load())
		}
		synctest.Wait()
		if st := prefill.ranks[0].stats(time.Now()); st.KVUsed != 0 {
			t.Errorf("prefill KV %d after handover, want 0", st.KVUsed)
		}
	})
}

func TestBootstrapTimeoutFailsBothLegs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pcfg, dcfg := testConfig(), testConfig()
		pcfg.bootstrapTimeout = time.Second
		dcfg.window = 1
		prefill, decode := pdPair(t, pcfg, dcfg)
		d1 := submitPD(t, decode, 1, 300) // holds the decode window for ~3 s
		p1 := submitPD(t, prefill, 1, 1)
		start := time.Now()
		p2 := submitPD(t, prefill, 2, 1)
		d2 := submitPD(t, decode, 2, 10)
		waitDone(p2)
		if !errors.Is(p2.err, errBootstrapTimeout) {
			t.Fatalf("prefill err %v, want bootstrap timeout", p2.err)
		}
		if got := time.Since(start); got != time.Second {
			t.Errorf("prefill failed after %v, want the 1s bootstrap timeout", got)
		}
		synctest.Wait()
		if st := prefill.ranks[0].stats(time.Now()); st.KVUsed != 0 {
			t.Errorf("prefill still holds %d KV tokens after the timeout", st.KVUsed)
		}
		waitDone(d2)
		if d2.err == nil {
			t.Error("decode leg of a timed-out room succeeded")
		}
		waitDone(d1)
		waitDone(p1)
		if d1.err != nil || p1.err != nil {
			t.Errorf("room 1 failed: %v / %v", p1.err, d1.err)
		}
	})
}

// The high-water marks behind GET /sim/stats: 20 requests on a window of 4
// peak at 4 running and 16 waiting; a reset starts the marks from now.
func TestPeaksTrackQueueAndBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := startEngine(t, testConfig(), 1)
		var reqs []*request
		for range 20 {
			reqs = append(reqs, mustSubmit(t, e, 50, 5))
		}
		for !reqs[len(reqs)-1].done.Load() {
			time.Sleep(time.Millisecond)
			synctest.Wait()
		}
		if w, r := e.ranks[0].peaks(true); r != 4 || w != 16 {
			t.Errorf("peaks waiting %d running %d, want 16 and 4", w, r)
		}
		if w, r := e.ranks[0].peaks(false); r != 0 || w != 0 {
			t.Errorf("after a reset on an idle engine: peaks waiting %d running %d, want 0", w, r)
		}
	})
}

// TestIdleRoomsIntegrated: the free rooms of the window are integrated over
// time, and apart those while a request waits in the queue: a request that
// arrives mid-step waits for the next scheduling pass with a room free.
func TestIdleRoomsIntegrated(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := startEngine(t, testConfig(), 1)
		synctest.Wait()
		time.Sleep(time.Second)
		if st := e.ranks[0].stats(time.Now()); st.IdleRooms != 4 || st.IdleRoomsQueued != 0 {
			t.Fatalf("idle engine after 1 s: %v room-seconds idle, %v queued; want 4 (the window) and 0", st.IdleRooms, st.IdleRoomsQueued)
		}
		a := mustSubmit(t, e, 100, 10) // a 10 ms prefill step starts at once
		synctest.Wait()
		time.Sleep(5 * time.Millisecond)
		b := mustSubmit(t, e, 100, 10) // waits 5 ms for that step to end
		waitDone(a)
		waitDone(b)
		st := e.ranks[0].stats(time.Now())
		if d := st.IdleRoomsQueued - 0.005; d < -1e-9 || d > 1e-9 {
			t.Errorf("queued idle %v room-seconds, want 0.005 (one room for the 5 ms to the step's end)", st.IdleRoomsQueued)
		}
		if st.IdleRooms <= 4 {
			t.Errorf("idle %v room-seconds, want more than the first second's 4", st.IdleRooms)
		}
	})
}
