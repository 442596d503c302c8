package watchclient

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/router"
)

// The tests in this file drive time with testing/synctest, so the control
// plane is an in-memory fake connection (a real socket is not durably blocking).

// fakeStream is one watch stream as the client sees it.
type fakeStream struct {
	ctx      context.Context
	toClient chan *smgv1.WatchResponse
	end      chan error
	sent     chan *smgv1.WatchRequest
}

func (s *fakeStream) Header() (metadata.MD, error) { return nil, nil }
func (s *fakeStream) Trailer() metadata.MD         { return nil }
func (s *fakeStream) CloseSend() error             { return nil }
func (s *fakeStream) Context() context.Context     { return s.ctx }

func (s *fakeStream) SendMsg(m any) error {
	if err := s.ctx.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
	select {
	case s.sent <- proto.Clone(m.(proto.Message)).(*smgv1.WatchRequest):
	default: // the test reads what it needs; drop the rest
	}
	return nil
}

func (s *fakeStream) RecvMsg(m any) error {
	select {
	case r := <-s.toClient:
		proto.Reset(m.(proto.Message))
		proto.Merge(m.(proto.Message), r)
		return nil
	case err := <-s.end:
		return err
	case <-s.ctx.Done():
		return status.FromContextError(s.ctx.Err()).Err()
	}
}

// next returns the next request of the given kind the client sent, once
// the bubble has settled.
func (s *fakeStream) next(t *testing.T, kind func(*smgv1.WatchRequest) bool) *smgv1.WatchRequest {
	t.Helper()
	synctest.Wait()
	for {
		select {
		case r := <-s.sent:
			if kind(r) {
				return r
			}
		default:
			t.Fatal("the client sent no such request")
		}
	}
}

func isHello(r *smgv1.WatchRequest) bool  { return r.GetHello() != nil }
func isAck(r *smgv1.WatchRequest) bool    { return r.GetAck() != nil }
func isReport(r *smgv1.WatchRequest) bool { return r.GetReport() != nil }

// fakeConn opens fakeStreams, or refuses like an unreachable control plane.
type fakeConn struct {
	mu      sync.Mutex
	refuse  bool
	dials   []time.Time
	streams chan *fakeStream
}

func newFakeConn() *fakeConn { return &fakeConn{streams: make(chan *fakeStream, 16)} }

func (f *fakeConn) Invoke(context.Context, string, any, any, ...grpc.CallOption) error {
	return status.Error(codes.Unimplemented, "unused")
}

func (f *fakeConn) NewStream(ctx context.Context, _ *grpc.StreamDesc, _ string, _ ...grpc.CallOption) (grpc.ClientStream, error) {
	f.mu.Lock()
	f.dials = append(f.dials, time.Now())
	refuse := f.refuse
	f.mu.Unlock()
	if refuse {
		return nil, status.Error(codes.Unavailable, "connection refused")
	}
	s := &fakeStream{ctx: ctx, toClient: make(chan *smgv1.WatchResponse), end: make(chan error, 1),
		sent: make(chan *smgv1.WatchRequest, 64)}
	f.streams <- s
	return s, nil
}

func (f *fakeConn) setRefuse(v bool) {
	f.mu.Lock()
	f.refuse = v
	f.mu.Unlock()
}

// runBubbled runs c until the bubble's test function ends.
func runBubbled(t *testing.T, c *Client) {
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func (f *fakeTarget) count() (applies, failOpens int, contacts []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.snaps), f.failOpens, append([]string(nil), f.contacts...)
}

func snapshotMsg(epoch string, rev uint64, ws ...*smgv1.RoutingWorker) *smgv1.WatchResponse {
	return &smgv1.WatchResponse{Epoch: epoch, Revision: rev,
		Msg: &smgv1.WatchResponse_Snapshot{Snapshot: &smgv1.WatchSnapshot{Workers: ws}}}
}

func deltaMsg(epoch string, rev uint64, ws ...*smgv1.RoutingWorker) *smgv1.WatchResponse {
	return &smgv1.WatchResponse{Epoch: epoch, Revision: rev,
		Msg: &smgv1.WatchResponse_Delta{Delta: &smgv1.WatchDelta{Upserts: ws}}}
}

func heartbeatMsg(epoch string, rev uint64) *smgv1.WatchResponse {
	return &smgv1.WatchResponse{Epoch: epoch, Revision: rev,
		Msg: &smgv1.WatchResponse_Heartbeat{Heartbeat: &smgv1.WatchHeartbeat{}}}
}

func goodbyeMsg() *smgv1.WatchResponse {
	return &smgv1.WatchResponse{Msg: &smgv1.WatchResponse_Goodbye{Goodbye: &smgv1.Goodbye{Reason: "shutdown"}}}
}

func overloaded(id string) *smgv1.RoutingWorker {
	return &smgv1.RoutingWorker{WorkerId: id, Model: "m", Healthy: true, Veto: smgv1.Veto_VETO_OVERLOAD,
		VetoReason: "token_usage 0.97 >= 0.95"}
}

func TestFailOpenOnceAfterStaleAfterThenRecover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fc, target := newFakeConn(), newTarget()
		c := New(fc, target, Options{RouterID: "r1", StaleAfter: 15 * time.Second}, nil)
		runBubbled(t, c)

		s := <-fc.streams
		if h := s.next(t, isHello).GetHello(); h.RouterId != "r1" || h.Epoch != "" {
			t.Fatalf("hello = %v, want r1 asking for a snapshot", h)
		}
		s.toClient <- snapshotMsg("E", 5, overloaded("w1"))
		synctest.Wait()
		if n, _, _ := target.count(); n != 1 || !c.Connected() {
			t.Fatalf("applies = %d connected = %v", n, c.Connected())
		}

		// The control plane goes away and stays unreachable.
		fc.setRefuse(true)
		s.end <- status.Error(codes.Unavailable, "control plane gone")
		time.Sleep(15*time.Second - time.Millisecond)
		synctest.Wait()
		if _, fo, _ := target.count(); fo != 0 || c.Connected() {
			t.Fatalf("failed open %d times before the stale bound (connected=%v)", fo, c.Connected())
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if _, fo, _ := target.count(); fo != 1 {
			t.Fatalf("failed open %d times at the stale bound, want 1", fo)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if n, fo, _ := target.count(); fo != 1 || n != 1 {
			t.Fatalf("after a minute more: %d fail-opens, %d applies; want 1 and the last snapshot kept", fo, n)
		}

		// It comes back: the client resumes from what it holds and the
		// verdicts return with the first message.
		fc.setRefuse(false)
		s = <-fc.streams
		if h := s.next(t, isHello).GetHello(); h.Epoch != "E" || h.Revision != 5 {
			t.Fatalf("hello = %v, want resume from E/5", h)
		}
		s.toClient <- heartbeatMsg("E", 5)
		synctest.Wait()
		if n, _, _ := target.count(); n != 2 || target.latest().Workers[0].Veto != router.VetoOverload {
			t.Fatalf("applies = %d, latest = %+v: want the vetoes re-applied", n, target.latest())
		}
	})
}

func TestSilentStreamFailsOpen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fc, target := newFakeConn(), newTarget()
		c := New(fc, target, Options{RouterID: "r1", StaleAfter: 15 * time.Second}, nil)
		runBubbled(t, c)
		s := <-fc.streams
		s.toClient <- snapshotMsg("E", 1, overloaded("w1"))
		for range 20 { // heartbeats keep it trusted well past 15s
			time.Sleep(time.Second)
			s.toClient <- heartbeatMsg("E", 1)
		}
		synctest.Wait()
		if _, fo, _ := target.count(); fo != 0 {
			t.Fatalf("failed open while heartbeats arrive")
		}
		// The stream stays open but nothing arrives: a one-way link.
		time.Sleep(15 * time.Second)
		synctest.Wait()
		if _, fo, _ := target.count(); fo != 1 {
			t.Fatalf("fail-opens = %d after 15s of silence, want 1", fo)
		}
	})
}

func TestStaleAfterZeroNeverFailsOpen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fc, target := newFakeConn(), newTarget()
		runBubbled(t, New(fc, target, Options{RouterID: "r1"}, nil))
		s := <-fc.streams
		s.toClient <- snapshotMsg("E", 1, overloaded("w1"))
		fc.setRefuse(true)
		s.end <- status.Error(codes.Unavailable, "gone")
		time.Sleep(time.Hour)
		synctest.Wait()
		if _, fo, _ := target.count(); fo != 0 {
			t.Fatalf("failed open with StaleAfter 0")
		}
	})
}

func TestGoodbyeReconnectsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fc, target := newFakeConn(), newTarget()
		c := New(fc, target, Options{RouterID: "r1"}, nil)
		runBubbled(t, c)
		s := <-fc.streams
		s.toClient <- snapshotMsg("E", 7)
		synctest.Wait()

		before := time.Now()
		s.toClient <- goodbyeMsg()
		s = <-fc.streams
		if waited := time.Since(before); waited != 0 {
			t.Fatalf("reconnected %v after goodbye, want at once", waited)
		}
		if h := s.next(t, isHello).GetHello(); h.Epoch != "E" || h.Revision != 7 {
			t.Fatalf("hello = %v, want resume from E/7", h)
		}

		// A goodbye before anything else is a control plane still closing:
		// that one is followed by the backoff, not a tight loop.
		before = time.Now()
		s.toClient <- goodbyeMsg()
		<-fc.streams
		if waited := time.Since(before); waited < 80*time.Millisecond {
			t.Fatalf("redialed %v after a bare goodbye, want the backoff (>= 80ms)", waited)
		}
	})
}

// Reconnects back off exponentially up to the shared 1 s cap, so a control
// plane that comes back is found within a second however long it was gone.
func TestBackoffDoublesUpToOneSecond(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fc := newFakeConn()
		fc.setRefuse(true)
		mid := func() float64 { return 0.5 } // no spread: exact waits
		runBubbled(t, New(fc, newTarget(), Options{RouterID: "r1", Rand: mid}, nil))
		time.Sleep(time.Minute)
		synctest.Wait()
		fc.mu.Lock()
		dials := append([]time.Time(nil), fc.dials...)
		fc.mu.Unlock()
		if len(dials) < 50 {
			t.Fatalf("%d dials in a minute, want about one a second", len(dials))
		}
		want := 100 * time.Millisecond
		for i := 1; i < len(dials); i++ {
			if gap := dials[i].Sub(dials[i-1]); gap != want {
				t.Fatalf("gap %d = %v, want %v", i, gap, want)
			}
			want = min(want*2, time.Second)
		}
	})
}

func TestAcksAndReports(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fc, target := newFakeConn(), newTarget()
		progress := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
		target.obs = router.Observations{Workers: []router.WorkerObservation{{
			WorkerID: "w1", StreamsInFlight: 3, LastProgress: progress, PromptTokensInFlight: 900, ConnectionFailures: 2,
			Contact: true, PrefillTokensPerSec: 5000,
		}, {WorkerID: "w2"}}}
		runBubbled(t, New(fc, target, Options{RouterID: "r1"}, nil))
		s := <-fc.streams
		s.toClient <- snapshotMsg("E", 3, overloaded("w1"))
		synctest.Wait()
		if a := s.next(t, isAck).GetAck(); a.Revision != 3 {
			t.Fatalf("ack = %v, want 3", a)
		}
		// A second apply within ReportInterval is acked with the next report.
		s.toClient <- deltaMsg("E", 4, overloaded("w2"))
		synctest.Wait()
		for len(s.sent) > 0 {
			if r := <-s.sent; r.GetAck() != nil {
				t.Fatalf("ack %v sent at once; want it held for the report tick", r)
			}
		}
		time.Sleep(250 * time.Millisecond)
		synctest.Wait()
		if a := s.next(t, isAck).GetAck(); a.Revision != 4 {
			t.Fatalf("ack = %v, want 4", a)
		}
		rep := s.next(t, isReport).GetReport()
		want := &smgv1.RouterReport{Workers: []*smgv1.WorkerObservation{{
			WorkerId: "w1", StreamsInFlight: 3, LastProgress: timestamppb.New(progress),
			PromptTokensInFlight: 900, ConnectionFailures: 2, Contact: true, PrefillTokensPerSec: 5000,
		}, {WorkerId: "w2"}}}
		if !proto.Equal(rep, want) {
			t.Fatalf("report = %v\nwant %v", rep, want)
		}

	})
}

// Acks held by the throttle are never lost: applies and heartbeats that
// arrive while one is held fold into it, and the next report tick acks the
// latest revision applied (an ack stuck a revision behind would show the
// router lagging on GET /routers, and window shares wait for acks).
func TestHeldAckNamesTheLatestRevision(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fc, target := newFakeConn(), newTarget()
		runBubbled(t, New(fc, target, Options{RouterID: "r1"}, nil))
		s := <-fc.streams
		s.toClient <- snapshotMsg("E", 3, overloaded("w1"))
		if a := s.next(t, isAck).GetAck(); a.Revision != 3 {
			t.Fatalf("ack = %v, want 3", a)
		}
		time.Sleep(50 * time.Millisecond)
		s.toClient <- deltaMsg("E", 4, overloaded("w2"))
		s.toClient <- heartbeatMsg("E", 4)
		s.toClient <- deltaMsg("E", 5, overloaded("w3"))
		s.toClient <- heartbeatMsg("E", 5)
		synctest.Wait()
		for len(s.sent) > 0 {
			if r := <-s.sent; r.GetAck() != nil {
				t.Fatalf("ack %v within the report interval", r)
			}
		}
		time.Sleep(200 * time.Millisecond) // the report tick
		if a := s.next(t, isAck).GetAck(); a.Revision != 5 {
			t.Fatalf("ack = %v, want 5", a)
		}
		// Quiet from then on: heartbeats at the revision held ack nothing new.
		for range 3 {
			time.Sleep(time.Second)
			s.toClient <- heartbeatMsg("E", 5)
		}
		synctest.Wait()
		for len(s.sent) > 0 {
			if r := <-s.sent; r.GetAck() != nil {
				t.Fatalf("ack %v again for the revision already acked", r)
			}
		}
	})
}

func TestContactSeenOnContactSeqIncrease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fc, target := newFakeConn(), newTarget()
		runBubbled(t, New(fc, target, Options{RouterID: "r1"}, nil))
		s := <-fc.streams
		w := func(id string, seq uint64) *smgv1.RoutingWorker {
			return &smgv1.RoutingWorker{WorkerId: id, ContactSeq: seq}
		}
		s.toClient <- snapshotMsg("E", 1, w("w1", 1), w("w2", 0)) // first sight: no contact news
		s.toClient <- deltaMsg("E", 2, w("w1", 2), w("w2", 0))
		s.toClient <- snapshotMsg("E", 3, w("w1", 2), w("w2", 1)) // a re-sync counts too
		synctest.Wait()
		if _, _, contacts := target.count(); len(contacts) != 2 || contacts[0] != "w1" || contacts[1] != "w2" {
			t.Fatalf("ContactSeen calls = %v, want [w1 w2]", contacts)
		}
	})
}

func TestDeltaUnderAnotherEpochResnapshots(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fc, target := newFakeConn(), newTarget()
		c := New(fc, target, Options{RouterID: "r1"}, nil)
		runBubbled(t, c)
		s := <-fc.streams
		s.toClient <- snapshotMsg("E", 4, overloaded("w1"))
		s.toClient <- deltaMsg("F", 5, overloaded("w2"))
		s = <-fc.streams
		if h := s.next(t, isHello).GetHello(); h.Epoch != "" {
			t.Fatalf("hello = %v, want a fresh snapshot asked for", h)
		}
		if n, _, _ := target.count(); n != 1 {
			t.Fatalf("applies = %d: the foreign delta must not be applied", n)
		}
	})
}

// The stale bound comes from the control plane: a router whose own
// --worker-stale-secs says 15 fails open after the 3 s its control plane
// sends with the snapshot, and hands the settings to the router.
func TestControlPlaneStaleBoundReplacesTheFlag(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fc, target := newFakeConn(), newTarget()
		runBubbled(t, New(fc, target, Options{RouterID: "r1", StaleAfter: 15 * time.Second}, nil))
		s := <-fc.streams
		snap := snapshotMsg("E", 5, overloaded("w1"))
		snap.GetSnapshot().Settings = &smgv1.FleetSettings{LoadMonitorIntervalSecs: 1, WorkerStaleSecs: 3}
		s.toClient <- snap
		synctest.Wait()
		if got := target.latest().Settings; got == nil || *got != (router.FleetSettings{LoadMonitorIntervalSecs: 1, WorkerStaleSecs: 3}) {
			t.Fatalf("settings handed to the router = %+v, want the control plane's", got)
		}
		// A delta keeps them.
		s.toClient <- deltaMsg("E", 6, overloaded("w2"))
		synctest.Wait()
		if got := target.latest().Settings; got == nil || got.LoadMonitorIntervalSecs != 1 {
			t.Fatalf("settings after a delta = %+v", got)
		}
		fc.setRefuse(true)
		s.end <- status.Error(codes.Unavailable, "control plane gone")
		time.Sleep(3*time.Second - time.Millisecond)
		synctest.Wait()
		if _, fo, _ := target.count(); fo != 0 {
			t.Fatalf("failed open before the control plane's 3 s bound")
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if _, fo, _ := target.count(); fo != 1 {
			t.Fatalf("failed open %d times at the control plane's 3 s bound, want 1 (the flag says 15 s)", fo)
		}
	})
}
