package watch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testEpoch = "epoch-A"

func newWorker(id string) *registry.Worker {
	return &registry.Worker{Registered: registry.Registered{ID: id, Spec: &smgv1.WorkerSpec{Url: "http://" + id + ":8000"}, Model: "m", Type: "regular"}, State: registry.State{Health: registry.HealthHealthy}}
}

func put(t testing.TB, reg *registry.Registry, workers ...*registry.Worker) uint64 {
	t.Helper()
	rev, err := reg.Update(func(tx *registry.Txn) error {
		for _, w := range workers {
			tx.Insert(w)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

// setOverloaded commits a verdict change on one worker: a load over or
// under its waiting threshold of 10 (the registry decides the verdict).
func setOverloaded(t testing.TB, reg *registry.Registry, id string, on bool) uint64 {
	t.Helper()
	rev, err := reg.Update(func(tx *registry.Txn) error {
		w := tx.Get(id).Clone()
		w.Thresholds.WaitingRequests = 10
		w.Load = &smgv1.EngineLoad{WaitingRequests: 1}
		if on {
			w.Load = &smgv1.EngineLoad{WaitingRequests: 12}
		}
		w.LoadRevision++
		tx.Insert(w)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

func remove(t testing.TB, reg *registry.Registry, id string) uint64 {
	t.Helper()
	rev, err := reg.Update(func(tx *registry.Txn) error { tx.Delete(id); return nil })
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

type harness struct {
	srv     *Server
	conn    *grpc.ClientConn
	metrics *prometheus.Registry
}

// start serves WatchService over a real loopback listener.
func start(t testing.TB, reg *registry.Registry, opts Options) *harness {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pr := prometheus.NewRegistry()
	srv := NewServer(reg, opts, nil, pr)
	gs := grpc.NewServer()
	smgv1.RegisterWatchServiceServer(gs, srv)
	go gs.Serve(lis)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		srv.Close()
		gs.Stop()
	})
	return &harness{srv: srv, conn: conn, metrics: pr}
}

type stream = grpc.BidiStreamingClient[smgv1.WatchRequest, smgv1.WatchResponse]

func (h *harness) watch(t testing.TB, ctx context.Context, hello *smgv1.WatchHello) stream {
	t.Helper()
	st, err := smgv1.NewWatchServiceClient(h.conn).Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// io.EOF: the server already ended the stream; Recv returns its status.
	if err := st.Send(&smgv1.WatchRequest{Msg: &smgv1.WatchRequest_Hello{Hello: hello}}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	return st
}

func recv(t testing.TB, st stream) *smgv1.WatchResponse {
	t.Helper()
	m, err := st.Recv()
	if err != nil {
		t.Fatalf("recv: %v", err)
	}
	return m
}

func ids(ws []*smgv1.RoutingWorker) string {
	var out []string
	for _, w := range ws {
		out = append(out, w.GetWorkerId())
	}
	return strings.Join(out, ",")
}

func TestSnapshotFirstThenDeltas(t *testing.T) {
	reg := registry.New(testEpoch, 0)
	put(t, reg, newWorker("w1"), newWorker("w2"))
	h := start(t, reg, Options{HeartbeatInterval: time.Hour})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	st := h.watch(t, ctx, &smgv1.WatchHello{RouterId: "r1"})

	m := recv(t, st)
	if m.GetSnapshot() == nil || m.Epoch != testEpoch || m.Revision != reg.Revision() {
		t.Fatalf("first message = %v, want snapshot at %s/%d", m, testEpoch, reg.Revision())
	}
	if got := ids(m.GetSnapshot().GetWorkers()); got != "w1,w2" {
		t.Fatalf("snapshot workers = %s", got)
	}

	rev := setOverloaded(t, reg, "w1", true)
	m = recv(t, st)
	d := m.GetDelta()
	if d == nil || m.Revision != rev || m.Epoch != testEpoch {
		t.Fatalf("after a commit got %v, want delta at %d", m, rev)
	}
	if len(d.Upserts) != 1 || d.Upserts[0].GetVeto() != smgv1.Veto_VETO_OVERLOAD ||
		d.Upserts[0].GetVetoReason() != "waiting_requests 12 >= 10" {
		t.Fatalf("delta upserts = %v, want w1 vetoed for overload", d.Upserts)
	}

	rev = remove(t, reg, "w2")
	m = recv(t, st)
	if m.GetDelta() == nil || m.Revision != rev || len(m.GetDelta().Removed) != 1 || m.GetDelta().Removed[0] != "w2" {
		t.Fatalf("after delete got %v, want w2 removed at %d", m, rev)
	}
}

func TestRoutingWorkerFields(t *testing.T) {
	prio, cost := int32(7), 2.5
	w := newWorker("d1")
	w.Type = "decode"
	w.Spec = &smgv1.WorkerSpec{Url: "http://d1", ApiKey: "k", BootstrapPort: ptr(int32(8998)),
		MaxRunningRequests: ptr(int32(64))}
	w.Load = &smgv1.EngineLoad{WaitingRequests: 3, RunningRequests: 5, TokenUsage: 0.4}
	w.LoadRevision, w.ContactSeq = 9, 4
	w.Liveness, w.LivenessReason = smgv1.Veto_VETO_WEDGED, "queue without progress"
	w.Overloaded, w.OverloadReason = true, "waiting_requests 9 >= 8" // both causes travel
	w.WindowShare = map[string]int64{"r1": 16, "r2": 48}

	rw := RoutingWorker(w, "r1")
	want := &smgv1.RoutingWorker{WorkerId: "d1", Url: "http://d1", Model: "m", WorkerType: "decode",
		Priority: 50, Cost: 1, Healthy: true, Veto: smgv1.Veto_VETO_WEDGED, VetoReason: "queue without progress",
		WaitingRequests: 3, RunningRequests: 5, TokenUsage: 0.4, MaxRunningRequests: 64, LoadRevision: 9,
		BootstrapPort: 8998, ContactSeq: 4, ApiKey: "k", WindowShare: 16,
		Overloaded: true, OverloadReason: "waiting_requests 9 >= 8"}
	if rw.String() != want.String() {
		t.Fatalf("RoutingWorker =\n %v\nwant\n %v", rw, want)
	}

	w.Spec = &smgv1.WorkerSpec{Url: "http://d1", Priority: &prio, Cost: &cost, MaxRunningRequests: ptr(int32(64))}
	w.Load.MaxRunningRequests = 128 // the engine's own window wins
	w.Health = registry.HealthPending
	rw = RoutingWorker(w, "r3")
	// r3 holds no share of a gated decode window: -1 (hold no room), not 0
	// (which would let it count against the whole window alone).
	if rw.Priority != 7 || rw.Cost != 2.5 || rw.MaxRunningRequests != 128 || rw.Healthy || rw.WindowShare != -1 {
		t.Fatalf("RoutingWorker = %v", rw)
	}
}

// A regular worker's admission window travels as rooms (window + queue);
// a router without a share yet holds none (-1), one with a share gets it.
func TestRoutingWorkerAdmissionRooms(t *testing.T) {
	w := newWorker("w1")
	w.Admission = &registry.Admission{Window: 8, Source: "engine", Queue: 2}
	w.WindowShare = map[string]int64{"r1": 6, "r2": 4}
	if rw := RoutingWorker(w, "r1"); rw.AdmissionRooms != 10 || rw.WindowShare != 6 {
		t.Fatalf("r1: rooms %d share %d, want 10 and 6", rw.AdmissionRooms, rw.WindowShare)
	}
	if rw := RoutingWorker(w, "r3"); rw.WindowShare != -1 {
		t.Fatalf("r3 without a share: %d, want -1 (hold no room)", rw.WindowShare)
	}
	w.Admission = &registry.Admission{} // windows on, none known: never gated
	w.WindowShare = nil
	if rw := RoutingWorker(w, "r1"); rw.AdmissionRooms != 0 || rw.WindowShare != 0 {
		t.Fatalf("no window: rooms %d share %d, want 0 and 0", rw.AdmissionRooms, rw.WindowShare)
	}
}

func ptr[T any](v T) *T { return &v }

func TestResume(t *testing.T) {
	reg := registry.New(testEpoch, 3)
	put(t, reg, newWorker("w1"), newWorker("w2"))
	h := start(t, reg, Options{HeartbeatInterval: time.Hour})
	held := reg.Revision()
	rev := setOverloaded(t, reg, "w1", true)

	t.Run("retained revision gets only the deltas", func(t *testing.T) {
		st := h.watch(t, t.Context(), &smgv1.WatchHello{RouterId: "r1", Epoch: testEpoch, Revision: held})
		m := recv(t, st)
		if m.GetDelta() == nil || m.Revision != rev || ids(m.GetDelta().Upserts) != "w1" {
			t.Fatalf("resume got %v, want a delta of w1 at %d", m, rev)
		}
	})
	t.Run("current revision gets a heartbeat confirming it", func(t *testing.T) {
		st := h.watch(t, t.Context(), &smgv1.WatchHello{RouterId: "r1", Epoch: testEpoch, Revision: rev})
		m := recv(t, st)
		if m.GetHeartbeat() == nil || m.Revision != rev {
			t.Fatalf("resume at current got %v, want heartbeat at %d", m, rev)
		}
	})
	t.Run("other epoch gets a snapshot", func(t *testing.T) {
		st := h.watch(t, t.Context(), &smgv1.WatchHello{RouterId: "r1", Epoch: "epoch-old", Revision: rev})
		if m := recv(t, st); m.GetSnapshot() == nil || m.Revision != rev {
			t.Fatalf("got %v, want snapshot", m)
		}
	})
	t.Run("revision ahead of the control plane gets a snapshot", func(t *testing.T) {
		st := h.watch(t, t.Context(), &smgv1.WatchHello{RouterId: "r1", Epoch: testEpoch, Revision: rev + 10})
		if m := recv(t, st); m.GetSnapshot() == nil || m.Revision != rev {
			t.Fatalf("got %v, want snapshot", m)
		}
	})
	t.Run("revision older than the history gets a snapshot", func(t *testing.T) {
		for range 4 { // history holds 3 changes
			setOverloaded(t, reg, "w2", true)
			setOverloaded(t, reg, "w2", false)
		}
		st := h.watch(t, t.Context(), &smgv1.WatchHello{RouterId: "r1", Epoch: testEpoch, Revision: held})
		m := recv(t, st)
		if m.GetSnapshot() == nil || m.Revision != reg.Revision() || ids(m.GetSnapshot().Workers) != "w1,w2" {
			t.Fatalf("got %v, want snapshot at %d", m, reg.Revision())
		}
	})
}

func TestToken(t *testing.T) {
	reg := registry.New(testEpoch, 0)
	h := start(t, reg, Options{Token: "s3cret"})
	for _, tc := range []struct {
		name, header string
		want         codes.Code
	}{
		{"missing", "", codes.Unauthenticated},
		{"wrong", "Bearer nope", codes.Unauthenticated},
		{"not bearer", "s3cret", codes.Unauthenticated},
		{"right", "Bearer s3cret", codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			if tc.header != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, "authorization", tc.header)
			}
			st := h.watch(t, ctx, &smgv1.WatchHello{RouterId: "r1"})
			m, err := st.Recv()
			if got := status.Code(err); got != tc.want {
				t.Fatalf("code = %v (%v), want %v", got, err, tc.want)
			}
			if tc.want == codes.OK && m.GetSnapshot() == nil {
				t.Fatalf("got %v, want snapshot", m)
			}
			if tc.want == codes.Unauthenticated && !strings.Contains(status.Convert(err).Message(), "--watch-token") {
				t.Fatalf("message %q does not say which token", status.Convert(err).Message())
			}
		})
	}
}

func TestFirstMessageMustBeHello(t *testing.T) {
	h := start(t, registry.New(testEpoch, 0), Options{})
	st, err := smgv1.NewWatchServiceClient(h.conn).Watch(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	st.Send(&smgv1.WatchRequest{Msg: &smgv1.WatchRequest_Ack{Ack: &smgv1.WatchAck{Revision: 1}}})
	if _, err := st.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("err = %v, want InvalidArgument", err)
	}
}

type sinkCall struct {
	router string
	report *smgv1.RouterReport // nil: RouterGone
}

type recordingSink struct{ calls chan sinkCall }

func (s recordingSink) RouterObservations(id string, r *smgv1.RouterReport, _ time.Time) {
	s.calls <- sinkCall{id, r}
}
func (s recordingSink) RouterGone(id string) { s.calls <- sinkCall{router: id} }

func TestRoutersLagAndObservations(t *testing.T) {
	reg := registry.New(testEpoch, 0)
	put(t, reg, newWorker("w1"))
	sink := recordingSink{calls: make(chan sinkCall, 10)}
	h := start(t, reg, Options{HeartbeatInterval: time.Hour, Sink: sink})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	st := h.watch(t, ctx, &smgv1.WatchHello{RouterId: "r1"})
	snap := recv(t, st)

	// An ack, then a report: the report reaching the sink proves the ack
	// was processed (one receiver per stream, in order).
	st.Send(&smgv1.WatchRequest{Msg: &smgv1.WatchRequest_Ack{Ack: &smgv1.WatchAck{Revision: snap.Revision}}})
	rep := &smgv1.RouterReport{Workers: []*smgv1.WorkerObservation{{WorkerId: "w1", StreamsInFlight: 3}}}
	st.Send(&smgv1.WatchRequest{Msg: &smgv1.WatchRequest_Report{Report: rep}})
	c := <-sink.calls
	if c.router != "r1" || c.report.GetWorkers()[0].GetStreamsInFlight() != 3 {
		t.Fatalf("sink got %+v", c)
	}

	setOverloaded(t, reg, "w1", true)
	setOverloaded(t, reg, "w1", false) // the router has not acked these two
	routers := h.srv.Routers()
	if len(routers) != 1 || routers[0].RouterId != "r1" || routers[0].AppliedRevision != snap.Revision ||
		routers[0].Lag != 2 || routers[0].Peer == "" {
		t.Fatalf("Routers() = %v, want r1 at %d with lag 2", routers, snap.Revision)
	}
	want := `
# HELP smg_router_watch_lag Revisions a watching router is behind the control plane (current revision minus the revision it acknowledged).
# TYPE smg_router_watch_lag gauge
smg_router_watch_lag{router="r1"} 2
# HELP smg_watch_streams Watch streams open from routers.
# TYPE smg_watch_streams gauge
smg_watch_streams 1
`
	if err := testutil.GatherAndCompare(h.metrics, strings.NewReader(want), "smg_router_watch_lag", "smg_watch_streams"); err != nil {
		t.Fatal(err)
	}

	cancel() // the router goes away
	if c := <-sink.calls; c.router != "r1" || c.report != nil {
		t.Fatalf("sink got %+v, want RouterGone(r1)", c)
	}
	if n := len(h.srv.Routers()); n != 0 {
		t.Fatalf("%d routers listed after disconnect", n)
	}
	if v := testutil.ToFloat64(h.srv.metrics.streams); v != 0 {
		t.Fatalf("smg_watch_streams = %v after disconnect", v)
	}
}

func TestCloseSaysGoodbye(t *testing.T) {
	reg := registry.New(testEpoch, 0)
	put(t, reg, newWorker("w1"))
	h := start(t, reg, Options{HeartbeatInterval: time.Hour})
	var streams []stream
	for i := range 3 {
		st := h.watch(t, t.Context(), &smgv1.WatchHello{RouterId: fmt.Sprint("r", i)})
		recv(t, st) // snapshot
		streams = append(streams, st)
	}
	h.srv.Close()
	for _, st := range streams {
		if m := recv(t, st); m.GetGoodbye() == nil {
			t.Fatalf("got %v, want goodbye", m)
		}
		if _, err := st.Recv(); err == nil {
			t.Fatal("stream still open after goodbye")
		}
	}
	// A stream opened after Close is told goodbye at once, without a snapshot.
	st := h.watch(t, t.Context(), &smgv1.WatchHello{RouterId: "late"})
	if m := recv(t, st); m.GetGoodbye() == nil {
		t.Fatalf("late stream got %v, want goodbye", m)
	}
}

// A router that closes its side ends its stream cleanly (an OK status, no
// goodbye), and the stream's loop does not outlive it (goleak).
func TestRouterClosingItsSideEndsTheStream(t *testing.T) {
	reg := registry.New(testEpoch, 0)
	put(t, reg, newWorker("w1"))
	h := start(t, reg, Options{HeartbeatInterval: time.Hour})
	st := h.watch(t, t.Context(), &smgv1.WatchHello{RouterId: "r1"})
	recv(t, st) // snapshot
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if m, err := st.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after CloseSend: got %v, %v; want io.EOF (the server ended the stream with OK)", m, err)
	}
}

// fakeStream hands each sent message to the test, blocking like a stream
// whose client does not read.
type fakeStream struct {
	grpc.ServerStream
	ctx  context.Context
	sent chan *smgv1.WatchResponse
}

func (f *fakeStream) Context() context.Context { return f.ctx }

// SendMsg hands the test the message sent, decoded from its wire bytes as a
// router decodes it.
func (f *fakeStream) SendMsg(m any) error {
	got, err := decodeSent(m)
	if err != nil {
		return err
	}
	select {
	case f.sent <- got:
		return nil
	case <-f.ctx.Done():
		return f.ctx.Err()
	}
}

// decodeSent is a message sent, decoded from its wire bytes as a router
// decodes it.
func decodeSent(m any) (*smgv1.WatchResponse, error) {
	raw, err := proto.Marshal(m.(proto.Message))
	if err != nil {
		return nil, err
	}
	got := &smgv1.WatchResponse{}
	return got, proto.Unmarshal(raw, got)
}

// serveFake runs the serving loop over a fakeStream until the test ends.
func serveFake(t *testing.T, s *Server, hello *smgv1.WatchHello) *fakeStream {
	ctx, cancel := context.WithCancel(t.Context())
	fs := &fakeStream{ctx: ctx, sent: make(chan *smgv1.WatchResponse)}
	var wg sync.WaitGroup
	wg.Go(func() { s.serve(ctx, fs, &routerRecord{id: hello.GetRouterId()}, hello) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	return fs
}

// These two run in a synctest bubble so that synctest.Wait can tell when the
// serving loop is blocked sending to a router that does not read.

func TestSlowStreamMergesByWorker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := registry.New(testEpoch, 0)
		put(t, reg, newWorker("w1"), newWorker("w2"))
		s := NewServer(reg, Options{HeartbeatInterval: time.Hour}, nil, nil)
		fs := serveFake(t, s, &smgv1.WatchHello{RouterId: "r1"})
		synctest.Wait() // blocked sending the snapshot: the router does not read

		// 200 verdict changes land on w1 and one on w2 meanwhile.
		for i := range 200 {
			setOverloaded(t, reg, "w1", i%2 == 0)
		}
		final := setOverloaded(t, reg, "w2", true)

		if m := <-fs.sent; m.GetSnapshot() == nil || m.Revision != 1 {
			t.Fatalf("first message %v, want the snapshot at 1", m)
		}
		// Nothing was queued behind it: one delta carries everything
		// pending, each worker once, in its latest state.
		m := <-fs.sent
		if m.GetDelta() == nil || m.Revision != final || ids(m.GetDelta().Upserts) != "w1,w2" && ids(m.GetDelta().Upserts) != "w2,w1" {
			t.Fatalf("second message %v, want one delta of w1 and w2 at %d", m, final)
		}
		for _, w := range m.GetDelta().Upserts {
			if w.WorkerId == "w1" && w.Veto != smgv1.Veto_VETO_UNSPECIFIED {
				t.Fatalf("w1 = %v, want its latest state (not overloaded)", w)
			}
		}
		synctest.Wait()
		if len(fs.sent) != 0 {
			t.Fatal("more messages pending")
		}
	})
}

// TestTooFarBehindGetsSnapshot: a stream behind by at most MaxPending
// workers, or by at most half the fleet (a storm of verdicts on a large
// fleet must not send every router a full snapshot at every wake-up), gets a
// delta; further behind, a snapshot.
func TestTooFarBehindGetsSnapshot(t *testing.T) {
	for _, c := range []struct {
		fleet, delta, snapshot int // fleet size; a delta of; a snapshot after
	}{
		{fleet: 10, delta: 3, snapshot: 6},   // > MaxPending (3) and > half the fleet
		{fleet: 20, delta: 10, snapshot: 11}, // > MaxPending: still a delta up to half
	} {
		t.Run(fmt.Sprint(c.fleet), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				reg := registry.New(testEpoch, 0)
				var ws []*registry.Worker
				for i := range c.fleet {
					ws = append(ws, newWorker(fmt.Sprintf("w%02d", i)))
				}
				put(t, reg, ws...)
				s := NewServer(reg, Options{HeartbeatInterval: time.Hour, MaxPending: 3}, nil, nil)
				fs := serveFake(t, s, &smgv1.WatchHello{RouterId: "r1"})
				synctest.Wait() // blocked sending the first snapshot
				for _, w := range ws[:c.delta] {
					setOverloaded(t, reg, w.ID, true)
				}
				<-fs.sent
				if m := <-fs.sent; m.GetDelta() == nil || len(m.GetDelta().Upserts) != c.delta {
					t.Fatalf("got %v, want a delta of %d workers", m, c.delta)
				}
				last := ws[c.fleet-1].ID
				setOverloaded(t, reg, last, true)
				synctest.Wait() // blocked sending the delta of the last worker
				for _, w := range ws[c.fleet-1-c.snapshot : c.fleet-1] {
					setOverloaded(t, reg, w.ID, !reg.Snapshot().Get(w.ID).Overloaded)
				}
				if m := <-fs.sent; m.GetDelta() == nil || ids(m.GetDelta().Upserts) != last {
					t.Fatalf("got %v, want the delta of %s", m, last)
				}
				if m := <-fs.sent; m.GetSnapshot() == nil || m.Revision != reg.Revision() || len(m.GetSnapshot().Workers) != c.fleet {
					t.Fatalf("got %v, want a snapshot of %d workers at %d", m, c.fleet, reg.Revision())
				}
			})
		})
	}
}

// TestSentHearsEveryDeltaAndSnapshot: Options.Sent hears each delta and
// snapshot written to a router, with the revision it brings the router to
// (heartbeats are not news).
func TestSentHearsEveryDeltaAndSnapshot(t *testing.T) {
	type sent struct {
		router string
		rev    uint64
	}
	heard := make(chan sent, 8)
	reg := registry.New(testEpoch, 0)
	put(t, reg, newWorker("w1"))
	h := start(t, reg, Options{HeartbeatInterval: time.Hour, Sent: func(id string, rev uint64) { heard <- sent{id, rev} }})
	st := h.watch(t, t.Context(), &smgv1.WatchHello{RouterId: "r1"})
	m := recv(t, st)
	if got := <-heard; got != (sent{"r1", m.Revision}) || m.GetSnapshot() == nil {
		t.Fatalf("heard %v for %v, want r1 at the snapshot's revision", got, m)
	}
	rev := setOverloaded(t, reg, "w1", true)
	recv(t, st)
	if got := <-heard; got != (sent{"r1", rev}) {
		t.Fatalf("heard %v, want r1 at %d (the delta)", got, rev)
	}
}
