package watch

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// manyWorkers is n new workers named prefix0, prefix1, ...
func manyWorkers(prefix string, n int) []*registry.Worker {
	ws := make([]*registry.Worker, n)
	for i := range ws {
		ws[i] = newWorker(fmt.Sprint(prefix, i))
	}
	return ws
}

// A router that stops reading never holds the other routers of its shared
// writer back: one that keeps acking (its acks lie: modelled by a budget it
// never reaches) blocks one send, which the watchdog cuts short after
// WriterStall; one that stops acking too leaves the writer by the budget
// before any send on it can block. Either way it gets everything once it
// reads again.
func TestSharedWriterLeavesABlockedRouterBehind(t *testing.T) {
	for _, tc := range []struct {
		name   string
		budget int64
		stalls float64
	}{
		{"acks without reading: the watchdog", 1 << 30, 1},
		{"stops acking: the budget", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := registry.New(testEpoch, 0)
			put(t, reg, newWorker("w0"))
			// WriterStall well above any send's time on a starved box, so
			// that only the blocked router's send outlasts it.
			h := start(t, reg, Options{HeartbeatInterval: time.Hour, LoadInterval: -1, Writers: 1, WriterBudget: tc.budget, WriterStall: 250 * time.Millisecond})
			joined := make(chan string, 100)
			h.srv.joined = func(id string) { joined <- id }
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()

			// The blocked router: the smallest flow-control window gRPC
			// allows, so that a few hundred KiB unread block a send.
			conn, err := grpc.NewClient(h.conn.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithInitialWindowSize(1<<16), grpc.WithInitialConnWindowSize(1<<16))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			bad := (&harness{srv: h.srv, conn: conn}).watch(t, ctx, &smgv1.WatchHello{RouterId: "bad"})
			recv(t, bad)
			if id := <-joined; id != "bad" {
				t.Fatalf("%s joined the writer first", id)
			}
			good := h.watch(t, ctx, &smgv1.WatchHello{RouterId: "good"})
			recv(t, good)
			if id := <-joined; id != "good" {
				t.Fatalf("%s joined, want good", id)
			}

			// 3,000 workers join: a snapshot of about 200 KiB, which the
			// blocked router does not read.
			big := put(t, reg, manyWorkers("n", 3000)...)
			if m := recv(t, good); m.GetSnapshot() == nil || m.Revision != big {
				t.Fatalf("good got %v, want the snapshot at %d", m.GetRevision(), big)
			}
			// The next change: the writer reaches the blocked router first.
			var last uint64
			for i := range 5 {
				last = setOverloaded(t, reg, "w0", i%2 == 0)
				if m := recv(t, good); m.GetDelta() == nil || m.Revision != last {
					t.Fatalf("good got %v, want the delta at %d", m, last)
				}
			}
			if n := counter(t, h, "smg_watch_writer_stalls_total"); n != tc.stalls {
				t.Fatalf("stalls = %v, want %v", n, tc.stalls)
			}
			// Reading again, the blocked router catches up.
			for {
				m := recv(t, bad)
				if m.Revision == last {
					break
				}
				if m.Revision > last {
					t.Fatalf("bad got revision %d past %d", m.Revision, last)
				}
			}
		})
	}
}

// counter reads a metric of h's registry.
func counter(t *testing.T, h *harness, name string) float64 {
	t.Helper()
	mfs, err := h.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// routerView is a test router's view: each worker's veto, applied from the
// messages it receives, and the revision it holds.
type routerView struct {
	rev     uint64
	vetos   map[string]smgv1.Veto
	goodbye bool
}

// apply applies m to v; a message must never take the router back.
func (v *routerView) apply(m *smgv1.WatchResponse) error {
	if m.Revision < v.rev {
		return fmt.Errorf("revision %d after %d", m.Revision, v.rev)
	}
	switch {
	case m.GetGoodbye() != nil:
		v.goodbye = true
		return nil
	case m.GetSnapshot() != nil:
		v.vetos = map[string]smgv1.Veto{}
		for _, w := range m.GetSnapshot().Workers {
			v.vetos[w.WorkerId] = w.Veto
		}
	case m.GetDelta() != nil:
		for _, w := range m.GetDelta().Upserts {
			v.vetos[w.WorkerId] = w.Veto
		}
		for _, id := range m.GetDelta().Removed {
			delete(v.vetos, id)
		}
	}
	v.rev = m.Revision
	return nil
}

// Routers joining and leaving while shared writers run their rounds, each
// acking what it applied: every router still watching ends at the
// registry's revision with its exact view, applying deltas in order (a
// delta meant for another revision would leave a view that differs).
func TestSharedWritersConverge(t *testing.T) {
	reg := registry.New(testEpoch, 0)
	put(t, reg, manyWorkers("w", 20)...)
	h := start(t, reg, Options{HeartbeatInterval: time.Hour, LoadInterval: -1, Writers: 2})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	var mu sync.Mutex
	views := map[string]*routerView{}
	progress := make(chan struct{}, 1) // poked at every message applied
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	run := func(id string, ctx context.Context) {
		st := h.watch(t, ctx, &smgv1.WatchHello{RouterId: id})
		v := &routerView{}
		mu.Lock()
		views[id] = v
		mu.Unlock()
		wg.Go(func() {
			for {
				m, err := st.Recv()
				if err != nil {
					if ctx.Err() == nil {
						errs <- fmt.Errorf("%s: %v", id, err)
					}
					return
				}
				mu.Lock()
				err = v.apply(m)
				bye := v.goodbye
				mu.Unlock()
				if err != nil {
					errs <- fmt.Errorf("%s: %v", id, err)
					return
				}
				select {
				case progress <- struct{}{}:
				default:
				}
				if bye {
					return
				}
				st.Send(&smgv1.WatchRequest{Msg: &smgv1.WatchRequest_Ack{Ack: &smgv1.WatchAck{Revision: m.Revision}}})
			}
		})
	}
	for i := range 10 {
		run(fmt.Sprint("r", i), ctx)
	}
	left := map[string]bool{}
	type leaver struct {
		id    string
		leave context.CancelFunc
	}
	var leavers []leaver
	for i := range 200 {
		switch {
		case i%50 == 25:
			remove(t, reg, fmt.Sprint("w", i%20))
		case i%50 == 26:
			put(t, reg, newWorker(fmt.Sprint("w", (i-1)%20)))
		default:
			setOverloaded(t, reg, fmt.Sprint("w", i%20), i%3 == 0)
		}
		switch i % 20 {
		case 5: // a router joins mid-run and stays
			run(fmt.Sprint("join", i), ctx)
		case 10: // a router joins and leaves a few changes later
			lctx, leave := context.WithCancel(ctx)
			id := fmt.Sprint("leave", i)
			run(id, lctx)
			leavers = append(leavers, leaver{id, leave})
		case 15:
			mu.Lock()
			left[leavers[0].id] = true
			mu.Unlock()
			leavers[0].leave()
			leavers = leavers[1:]
		}
	}
	last := reg.Revision()
	// all says whether every router still watching is in the state ok.
	all := func(ok func(*routerView) bool) bool {
		mu.Lock()
		defer mu.Unlock()
		for id, v := range views {
			if !left[id] && !ok(v) {
				return false
			}
		}
		return true
	}
	waitAll := func(what string, ok func(*routerView) bool) {
		t.Helper()
		for !all(ok) {
			select {
			case <-progress:
			case err := <-errs:
				t.Fatal(err)
			case <-ctx.Done():
				t.Fatalf("routers did not %s", what)
			}
		}
	}
	waitAll("converge", func(v *routerView) bool { return v.rev == last })
	mu.Lock()
	final := map[string]routerView{}
	for id, v := range views {
		final[id] = *v
	}
	mu.Unlock()
	// Close: every router gets a goodbye, those held by a shared writer too.
	if testutil.ToFloat64(h.srv.metrics.shared) == 0 {
		t.Fatal("no stream on a shared writer")
	}
	h.srv.Close()
	waitAll("hear goodbye", func(v *routerView) bool { return v.goodbye })
	for _, l := range leavers {
		l.leave()
	}
	cancel()
	wg.Wait()

	want := map[string]smgv1.Veto{}
	for _, w := range reg.Snapshot().Workers() {
		want[w.ID] = RoutingWorker(w, "").Veto
	}
	for id, v := range final {
		if left[id] {
			continue
		}
		if v.rev != last || fmt.Sprint(v.vetos) != fmt.Sprint(want) {
			t.Fatalf("%s at %d holds %v, want %d with %v", id, v.rev, v.vetos, last, want)
		}
	}
}

// Loads go on a grid per phase: a router in phase 7 of 10 gets them 0.7 s
// into each second, one in phase 0 on the second.
func TestLoadPhasesSpreadTheGrid(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := registry.New(testEpoch, 0)
		put(t, reg, newWorker("w1"))
		s := NewServer(reg, Options{HeartbeatInterval: time.Hour, LoadInterval: time.Second, LoadPhases: 10}, nil, nil)
		if p := s.loadPhase("r1"); p != 0 {
			t.Fatalf("r1's phase %v, want 0", p)
		}
		if p := s.loadPhase("r2"); p != 700*time.Millisecond {
			t.Fatalf("r2's phase %v, want 700ms", p)
		}
		start := time.Now() // midnight
		r1 := serveFake(t, s, &smgv1.WatchHello{RouterId: "r1"})
		r2 := serveFake(t, s, &smgv1.WatchHello{RouterId: "r2"})
		<-r1.sent
		<-r2.sent
		time.Sleep(100 * time.Millisecond)
		rev := setLoad(t, reg, "w1", 3)
		if m := <-r2.sent; m.Revision != rev || time.Since(start) != 700*time.Millisecond {
			t.Fatalf("r2 got %v at %v, want the load at 700ms", m, time.Since(start))
		}
		if m := <-r1.sent; m.Revision != rev || time.Since(start) != time.Second {
			t.Fatalf("r1 got %v at %v, want the load at 1s", m, time.Since(start))
		}
	})
}

// A change committed at the instant a writer's timer fires for another
// stream's heartbeat still reaches every stream at once: the writer's timed
// round serves only the streams due, so it must notice the change too.
func TestChangeAtATimedRoundReachesEveryStream(t *testing.T) {
	for range 20 {
		synctest.Test(t, func(t *testing.T) {
			reg := registry.New(testEpoch, 0)
			put(t, reg, newWorker("w1"))
			s := NewServer(reg, Options{HeartbeatInterval: time.Second, LoadInterval: -1, Writers: 1}, nil, nil)
			ctx, cancel := context.WithCancel(t.Context())
			var wg sync.WaitGroup
			defer func() { cancel(); wg.Wait() }()
			serve := func(id string) *fakeStream {
				fs := &fakeStream{ctx: ctx, sent: make(chan *smgv1.WatchResponse, 100)}
				wg.Go(func() { s.serve(ctx, fs, &routerRecord{id: id}, &smgv1.WatchHello{RouterId: id}) })
				return fs
			}
			start := time.Now()
			r1 := serve("r1") // heartbeats at 1 s, 2 s
			time.Sleep(500 * time.Millisecond)
			serve("r2") // heartbeat at 1.5 s
			time.Sleep(time.Second)
			rev := setOverloaded(t, reg, "w1", true) // at 1.5 s, with r2's heartbeat
			for m := range r1.sent {
				if m.GetDelta() != nil {
					if m.Revision != rev || time.Since(start) != 1500*time.Millisecond {
						t.Fatalf("r1 got the delta at %d after %v, want %d at 1.5s", m.Revision, time.Since(start), rev)
					}
					break
				}
			}
		})
	}
}
