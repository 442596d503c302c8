package watchclient

import (
	"testing"
	"testing/synctest"
	"time"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/router"
)

func windowed(id string, rooms, share int64) *smgv1.RoutingWorker {
	return &smgv1.RoutingWorker{WorkerId: id, Model: "m", Healthy: true, AdmissionRooms: rooms, WindowShare: share}
}

func (f *fakeTarget) setObs(o router.Observations) {
	f.mu.Lock()
	f.obs = o
	f.mu.Unlock()
}

// lastReport waits one report interval and returns the newest report sent.
func (s *fakeStream) lastReport(t *testing.T) *smgv1.RouterReport {
	t.Helper()
	time.Sleep(DefaultReportInterval)
	synctest.Wait()
	var last *smgv1.RouterReport
	for {
		select {
		case r := <-s.sent:
			if r.GetReport() != nil {
				last = r.GetReport()
			}
		default:
			if last == nil {
				t.Fatal("no report sent")
			}
			return last
		}
	}
}

// gate is what the latest snapshot lets the router fill on id.
func (f *fakeTarget) gate(t *testing.T, id string) (rooms, share int64) {
	t.Helper()
	w := f.view(t)[id]
	return w.AdmissionRooms, w.WindowShare
}

// A failover never gives a router more room than it held: a new leader's
// snapshot without a window (its allocator has not run) or with no share
// granted yet (-1) leaves the router on the window and share it held, and
// its reports count that share as in flight so the new leader grants those
// rooms back to it, not to another router. A granted share ends the carry;
// within an epoch -1 applies at once; a replica that drops its soft state
// mid-epoch (no window) is carried over too; the stale bound ends it all.
func TestFailoverKeepsTheWindowHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fc, target := newFakeConn(), newTarget()
		runBubbled(t, New(fc, target, Options{RouterID: "r1", StaleAfter: 15 * time.Second}, nil))
		s := <-fc.streams
		s.toClient <- snapshotMsg("E1", 5, windowed("w1", 4, 2), windowed("w2", 4, -1))
		synctest.Wait()

		s = restart(s, fc)
		s.toClient <- snapshotMsg("E2", 1, windowed("w1", 0, 0), windowed("w2", 4, -1))
		synctest.Wait()
		if r, sh := target.gate(t, "w1"); r != 4 || sh != 2 {
			t.Fatalf("new leader without a window: w1 gated on %d/%d, want the 4/2 held", r, sh)
		}
		target.setObs(router.Observations{Demand: []router.WindowDemand{{WorkerID: "w1", InFlight: 1}, {WorkerID: "w2"}}})
		rep := s.lastReport(t)
		if d := rep.GetDemand(); len(d) != 2 || d[0].GetInFlight() != 2 || d[1].GetInFlight() != 0 {
			t.Fatalf("report demand %v, want w1 at its carried share 2 in flight, w2 as is", d)
		}
		// The allocator runs but has granted nothing yet: still the held share.
		s.toClient <- deltaMsg("E2", 2, windowed("w1", 4, -1))
		synctest.Wait()
		if r, sh := target.gate(t, "w1"); r != 4 || sh != 2 {
			t.Fatalf("new leader's -1 before any grant: %d/%d, want the 4/2 held", r, sh)
		}
		// Its grant ends the carry; a later -1 in the same epoch applies.
		s.toClient <- deltaMsg("E2", 3, windowed("w1", 4, 3))
		synctest.Wait()
		if r, sh := target.gate(t, "w1"); r != 4 || sh != 3 {
			t.Fatalf("after the grant: %d/%d, want the new leader's 4/3", r, sh)
		}
		s.toClient <- deltaMsg("E2", 4, windowed("w1", 4, -1))
		synctest.Wait()
		if _, sh := target.gate(t, "w1"); sh != -1 {
			t.Fatalf("a shrink to -1 within the epoch: share %d, want -1 at once", sh)
		}
		rep = s.lastReport(t)
		if d := rep.GetDemand(); d[0].GetInFlight() != 1 {
			t.Fatalf("report after the carry ended: %v, want the true in-flight count", d)
		}

		// A replica stepping down drops its soft state: a delta without the
		// window keeps the one held, until the stale bound.
		s.toClient <- deltaMsg("E2", 5, windowed("w1", 4, 2))
		s.toClient <- deltaMsg("E2", 6, windowed("w1", 0, 0))
		synctest.Wait()
		if r, sh := target.gate(t, "w1"); r != 4 || sh != 2 {
			t.Fatalf("window dropped mid-epoch: %d/%d, want the 4/2 held", r, sh)
		}
		for range 15 { // heartbeats keep the stream trusted
			time.Sleep(time.Second)
			s.toClient <- heartbeatMsg("E2", 6)
		}
		synctest.Wait()
		if r, sh := target.gate(t, "w1"); r != 0 || sh != 0 {
			t.Fatalf("past the stale bound: %d/%d, want the control plane's 0/0", r, sh)
		}
	})
}

// A worker kept through a second restart keeps the window it was published
// with, the carried one included.
func TestKeptWorkerKeepsItsCarriedWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fc, target := newFakeConn(), newTarget()
		runBubbled(t, New(fc, target, Options{RouterID: "r1", StaleAfter: 15 * time.Second}, nil))
		s := <-fc.streams
		s.toClient <- snapshotMsg("E1", 5, windowed("w1", 4, 2))
		synctest.Wait()
		s = restart(s, fc)
		s.toClient <- warmingSnapshot("E2", 1, 10, windowed("w1", 0, 0)) // healthy, no window yet: carried
		synctest.Wait()
		s = restart(s, fc)
		s.toClient <- warmingSnapshot("E3", 1, 10) // lacks w1: kept
		synctest.Wait()
		w := target.view(t)["w1"]
		if !w.Held || w.AdmissionRooms != 4 || w.WindowShare != 2 {
			t.Fatalf("w1 = %+v, want it kept with the 4/2 window it held", w)
		}
	})
}

func budgeted(id string, rooms, share, tokens, tokenShare int64) *smgv1.RoutingWorker {
	w := windowed(id, rooms, share)
	w.TokenBudget, w.TokenShare = tokens, tokenShare
	return w
}

// A token share is carried through a failover like a room share, each on
// its own: a new leader that does not know the worker's KV capacity yet
// (budget 0) would ungate the router, and one that granted it nothing yet
// (-1) would stop it; both leave it on the budget and share it held, and
// its reports count that share as tokens in flight. A room share granted
// before the token share ends the rooms' carry only.
func TestFailoverKeepsTheTokenShareHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fc, target := newFakeConn(), newTarget()
		runBubbled(t, New(fc, target, Options{RouterID: "r1", StaleAfter: 15 * time.Second}, nil))
		s := <-fc.streams
		s.toClient <- snapshotMsg("E1", 5, budgeted("w1", 4, 2, 20000, 9000), budgeted("w2", 0, 0, 20000, 6000))
		synctest.Wait()

		s = restart(s, fc)
		s.toClient <- snapshotMsg("E2", 1, budgeted("w1", 4, -1, 0, 0), budgeted("w2", 0, 0, 0, 0))
		synctest.Wait()
		for id, want := range map[string]int64{"w1": 9000, "w2": 6000} {
			if w := target.view(t)[id]; w.TokenBudget != 20000 || w.TokenShare != want {
				t.Fatalf("new leader without a budget: %s gated on %d/%d tokens, want the 20000/%d held", id, w.TokenBudget, w.TokenShare, want)
			}
		}
		target.setObs(router.Observations{Demand: []router.WindowDemand{{WorkerID: "w1", InFlight: 1, TokensInFlight: 500}, {WorkerID: "w2", TokensInFlight: 100}}})
		rep := s.lastReport(t)
		if d := rep.GetDemand(); len(d) != 2 || d[0].GetTokensInFlight() != 9000 || d[1].GetTokensInFlight() != 6000 || d[0].GetInFlight() != 2 {
			t.Fatalf("report demand %v, want the carried shares in flight (w1 2 rooms, 9000 tokens; w2 6000 tokens)", d)
		}
		// Rooms granted, the budget known but no token share yet: rooms are
		// the new leader's, tokens still the share held.
		s.toClient <- deltaMsg("E2", 2, budgeted("w1", 4, 3, 20000, -1))
		synctest.Wait()
		if w := target.view(t)["w1"]; w.WindowShare != 3 || w.TokenBudget != 20000 || w.TokenShare != 9000 {
			t.Fatalf("rooms granted first: %d rooms, %d/%d tokens, want 3 and the 20000/9000 held", w.WindowShare, w.TokenBudget, w.TokenShare)
		}
		rep = s.lastReport(t)
		if d := rep.GetDemand(); d[0].GetInFlight() != 1 || d[0].GetTokensInFlight() != 9000 {
			t.Fatalf("report %v, want w1's true rooms and its carried tokens", d)
		}
		// The token grant ends the carry; a later -1 in the epoch applies.
		s.toClient <- deltaMsg("E2", 3, budgeted("w1", 4, 3, 20000, 8000))
		s.toClient <- deltaMsg("E2", 4, budgeted("w1", 4, 3, 20000, -1))
		synctest.Wait()
		if w := target.view(t)["w1"]; w.TokenShare != -1 {
			t.Fatalf("a shrink to -1 within the epoch: token share %d, want -1 at once", w.TokenShare)
		}
		// w2's budget never came back: the stale bound ends its carry.
		for range 15 {
			time.Sleep(time.Second)
			s.toClient <- heartbeatMsg("E2", 4)
		}
		synctest.Wait()
		if w := target.view(t)["w2"]; w.TokenBudget != 0 || w.TokenShare != 0 {
			t.Fatalf("past the stale bound: %d/%d, want the control plane's 0/0", w.TokenBudget, w.TokenShare)
		}
	})
}
