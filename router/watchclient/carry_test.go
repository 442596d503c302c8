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
