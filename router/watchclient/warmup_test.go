package watchclient

import (
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/router"
)

func warmingSnapshot(epoch string, rev uint64, warming int32, ws ...*smgv1.RoutingWorker) *smgv1.WatchResponse {
	m := snapshotMsg(epoch, rev, ws...)
	m.GetSnapshot().WarmingSecs = warming
	return m
}

func ready(id, model string) *smgv1.RoutingWorker {
	return &smgv1.RoutingWorker{WorkerId: id, Model: model, Healthy: true}
}

func pending(id, model string) *smgv1.RoutingWorker {
	return &smgv1.RoutingWorker{WorkerId: id, Model: model}
}

// view is the latest snapshot applied, by worker id.
func (f *fakeTarget) view(t *testing.T) map[string]router.Worker {
	t.Helper()
	s := f.latest()
	out := map[string]router.Worker{}
	ids := make([]string, 0, len(s.Workers))
	for _, w := range s.Workers {
		out[w.ID] = w
		ids = append(ids, w.ID)
	}
	if !slices.IsSorted(ids) {
		t.Fatalf("snapshot not sorted by id: %v", ids)
	}
	return out
}

// restart ends the stream as a control plane killed with SIGKILL does, and
// returns the next stream.
func restart(s *fakeStream, fc *fakeConn) *fakeStream {
	s.end <- status.Error(codes.Unavailable, "control plane gone")
	return <-fc.streams
}

// restartedAfterE1 runs a client that held epoch E1 (w1 and w2, healthy)
// and returns the stream of its reconnect after a restart. Call in a bubble.
func restartedAfterE1(t *testing.T) (*fakeConn, *fakeTarget, *fakeStream) {
	fc, target := newFakeConn(), newTarget()
	runBubbled(t, New(fc, target, Options{RouterID: "r1"}, nil))
	s := <-fc.streams
	s.toClient <- snapshotMsg("E1", 5, ready("w1", "m"), ready("w2", "m"))
	synctest.Wait()
	return fc, target, restart(s, fc)
}

// The failure this guards against: a restarted in-memory control plane's first snapshot
// lacks workers (and lists those coming back as not yet healthy). While it
// says it is warming up, the router keeps the previous epoch's workers, without
// vetoes; each leaves the hold when the new epoch lists it healthy or deletes
// it, and the rest when the warm-up has passed.
func TestWarmingEpochKeepsPreviousWorkers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fc, target := newFakeConn(), newTarget()
		c := New(fc, target, Options{RouterID: "r1"}, nil)
		runBubbled(t, c)
		s := <-fc.streams
		s.toClient <- snapshotMsg("E1", 5, overloaded("w1"), ready("w2", "n"), ready("w3", "m"))
		synctest.Wait()

		s = restart(s, fc)
		if h := s.next(t, isHello).GetHello(); h.Epoch != "E1" {
			t.Fatalf("hello %v", h)
		}
		s.toClient <- warmingSnapshot("E2", 1, 10, pending("w1", "m"), ready("w4", "m"))
		synctest.Wait()
		v := target.view(t)
		if len(v) != 4 {
			t.Fatalf("after the warming snapshot: %v, want w1..w4", v)
		}
		for _, id := range []string{"w1", "w2", "w3"} {
			if w := v[id]; !w.Held || !w.Healthy || w.Veto != router.VetoNone {
				t.Errorf("%s = %+v, want kept from E1: held, healthy, no veto", id, w)
			}
		}
		if w := v["w4"]; w.Held || !w.Healthy {
			t.Errorf("w4 = %+v, want the new epoch's", w)
		}
		if ep, rev := c.Revision(); ep != "E2" || rev != 1 {
			t.Fatalf("revision %s/%d, want E2/1", ep, rev)
		}

		// The new epoch judges w1: its verdict from then on, kept copy gone.
		s.toClient <- deltaMsg("E2", 2, overloaded("w1"))
		synctest.Wait()
		if w := target.view(t)["w1"]; w.Held || w.Veto != router.VetoOverload {
			t.Fatalf("w1 = %+v, want the new epoch's overload veto", w)
		}
		s.toClient <- deltaMsg("E2", 3, pending("w1", "m"))
		synctest.Wait()
		if w := target.view(t)["w1"]; w.Held || w.Healthy {
			t.Fatalf("w1 = %+v: once judged, a later unhealthy verdict must not bring the kept copy back", w)
		}
		// An explicit delete on the new control plane removes a kept worker.
		s.toClient <- &smgv1.WatchResponse{Epoch: "E2", Revision: 4,
			Msg: &smgv1.WatchResponse_Delta{Delta: &smgv1.WatchDelta{Removed: []string{"w2"}}}}
		synctest.Wait()
		if _, ok := target.view(t)["w2"]; ok {
			t.Fatal("w2 deleted on the new control plane is still routed")
		}

		// w3 never comes back: kept until the warm-up has passed, then gone.
		time.Sleep(10*time.Second - time.Millisecond)
		synctest.Wait()
		if w := target.view(t)["w3"]; !w.Held {
			t.Fatalf("w3 = %+v before the warm-up ended, want held", w)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		v = target.view(t)
		if _, ok := v["w3"]; ok || len(v) != 2 {
			t.Fatalf("after the warm-up: %v, want w1 and w4 only", v)
		}
		if ep, rev := c.Revision(); ep != "E2" || rev != 4 || target.latest().Revision != 4 {
			t.Fatalf("revision %s/%d (published %d), want E2/4", ep, rev, target.latest().Revision)
		}
	})
}

// A complete registry (warming 0, e.g. a durable one) is the whole fleet at
// once: a worker deleted while the router was away leaves at the snapshot.
// A warming snapshot to a router that held nothing keeps nothing.
func TestCompleteSnapshotKeepsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fc, target := newFakeConn(), newTarget()
		runBubbled(t, New(fc, target, Options{RouterID: "r1"}, nil))
		s := <-fc.streams
		s.toClient <- warmingSnapshot("E1", 3, 10, ready("w1", "m"))
		synctest.Wait()
		if v := target.view(t); len(v) != 1 || v["w1"].Held {
			t.Fatalf("first snapshot: %v", v)
		}
		s = restart(s, fc)
		s.toClient <- snapshotMsg("E2", 1, ready("w2", "m"))
		synctest.Wait()
		if v := target.view(t); len(v) != 1 || v["w2"].ID != "w2" {
			t.Fatalf("complete snapshot: %v, want w2 alone", v)
		}
	})
}

// A re-sync snapshot that says the registry is complete ends the hold
// before the bound; one still warming moves the bound.
func TestResyncEndsOrExtendsTheHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, target, s := restartedAfterE1(t)
		s.toClient <- warmingSnapshot("E2", 1, 5, ready("w1", "m"))
		time.Sleep(4 * time.Second)
		s.toClient <- warmingSnapshot("E2", 2, 3, ready("w1", "m"))
		time.Sleep(2 * time.Second) // 6 s in: past the first bound, inside the second
		synctest.Wait()
		if !target.view(t)["w2"].Held {
			t.Fatal("w2 dropped before the re-sync's bound")
		}
		s.toClient <- snapshotMsg("E2", 3, ready("w1", "m"))
		synctest.Wait()
		if v := target.view(t); len(v) != 1 {
			t.Fatalf("after a complete re-sync: %v, want w1 alone", v)
		}
	})
}

// A second restart while warming keeps what was kept (the first epoch's
// workers), not just the half-built view of the second.
func TestRestartWhileWarmingKeepsTheOriginal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fc, target, s := restartedAfterE1(t)
		s.toClient <- warmingSnapshot("E2", 1, 10, pending("w1", "m"))
		synctest.Wait()
		s = restart(s, fc)
		s.toClient <- warmingSnapshot("E3", 1, 10)
		synctest.Wait()
		v := target.view(t)
		if len(v) != 2 || !v["w1"].Held || !v["w1"].Healthy || !v["w2"].Held {
			t.Fatalf("after two restarts: %+v, want w1 and w2 kept healthy from E1", v)
		}
	})
}
