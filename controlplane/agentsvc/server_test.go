package agentsvc

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/smg-project/smg/controlplane/evidence"
	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// clock is a manual clock shared by the server and the tests.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

type harness struct {
	reg   *registry.Registry
	srv   *Server
	tr    *evidence.Inbox
	conn  *grpc.ClientConn
	clock *clock

	mu        sync.Mutex
	submitted []*smgv1.WorkerSpec
}

type config struct {
	token    string
	liveness judge.LivenessConfig
	opts     Options // Auth, Registration, Remove, GoneAfter, AfterFunc
}

func defaultConfig() config { return config{liveness: judge.DefaultLivenessConfig()} }

// start serves AgentService over a real loopback listener, on a real
// registry, ingester and liveness tracker.
func start(t testing.TB, cfg config) *harness {
	t.Helper()
	h := &harness{reg: registry.New("epoch", 0), clock: &clock{now: time.Unix(1_000_000, 0)}}
	tr := evidence.New(h.reg, evidence.Options{Rules: cfg.liveness, Now: h.clock.Now}, discard(), prometheus.NewRegistry())
	submit := func(spec *smgv1.WorkerSpec) (string, error) {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.submitted = append(h.submitted, spec)
		return "w-new", nil
	}
	opts := cfg.opts
	opts.Now = h.clock.Now
	if cfg.token != "" {
		opts.Auth = TokenAuth{Shared: cfg.token}
	}
	h.tr = tr
	h.srv = New(h.reg, tr, submit, opts, discard())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	smgv1.RegisterAgentServiceServer(gs, h.srv)
	go gs.Serve(lis)
	h.conn, err = grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.conn.Close()
		h.srv.Close()
		gs.Stop()
	})
	return h
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

// put registers Ready workers with a waiting-requests ceiling of 4.
func (h *harness) put(t testing.TB, workers ...*registry.Worker) {
	t.Helper()
	_, err := h.reg.Update(func(tx *registry.Txn) error {
		for _, w := range workers {
			tx.Insert(w)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func worker(id, url, node string) *registry.Worker {
	return &registry.Worker{Registered: registry.Registered{ID: id, Spec: &smgv1.WorkerSpec{Url: url, Node: node}, Model: "m", Type: "regular", Thresholds: judge.Thresholds{WaitingRequests: 4, TokenUsage: 0.9}}, State: registry.State{Health: registry.HealthHealthy}}
}

// waitFor waits, on registry commits, until cond holds for the registry.
func (h *harness) waitFor(t *testing.T, what string, cond func(s *registry.Snapshot) bool) {
	t.Helper()
	deadline := time.NewTimer(5 * time.Second)
	defer deadline.Stop()
	for {
		changed := h.reg.Changed()
		if cond(h.reg.Snapshot()) {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

type clientStream = grpc.BidiStreamingClient[smgv1.ReportRequest, smgv1.ReportResponse]

// open opens a stream, sends the hello and reads the first assignment.
func (h *harness) open(t *testing.T, ctx context.Context, hello *smgv1.AgentHello) (clientStream, []string) {
	t.Helper()
	st, err := smgv1.NewAgentServiceClient(h.conn).Report(ctx)
	if err != nil {
		t.Fatal(err)
	}
	send(t, st, &smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Hello{Hello: hello}})
	return st, nextAssignment(t, st)
}

func send(t *testing.T, st clientStream, m *smgv1.ReportRequest) {
	t.Helper()
	if err := st.Send(m); err != nil {
		t.Fatal(err)
	}
}

func nextAssignment(t *testing.T, st clientStream) []string {
	t.Helper()
	resp, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	a := resp.GetAssignment()
	if a == nil {
		t.Fatalf("got %v, want an assignment", resp)
	}
	return a.GetEngineUrls()
}

func record(url string, waiting int32) *smgv1.ReportRequest {
	return &smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Record{Record: &smgv1.LoadRecord{
		WorkerUrl: url,
		Load: &smgv1.EngineLoad{Source: "vllm", WaitingRequests: waiting, RunningRequests: 1,
			Ranks: []*smgv1.RankLoad{{WaitingRequests: waiting, RunningRequests: 1}}},
	}}}
}

func event(url string, kind smgv1.EngineEventKind) *smgv1.ReportRequest {
	return &smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Event{Event: &smgv1.EngineEvent{WorkerUrl: url, Kind: kind}}}
}

// closeCleanly closes the agent's side and waits for the server's end.
func closeCleanly(t *testing.T, st clientStream) {
	t.Helper()
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	for {
		_, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatalf("stream ended with %v, want a clean end", err)
		}
	}
}

func TestRecordsDriveOverloadVerdictAndAgentNode(t *testing.T) {
	h := start(t, defaultConfig())
	h.put(t, worker("w1", "http://127.0.0.1:8001", ""))
	st, _ := h.open(t, t.Context(), &smgv1.AgentHello{Node: "n1"})

	send(t, st, record("http://127.0.0.1:8001", 6))
	h.waitFor(t, "w1 overloaded by the pushed record", func(s *registry.Snapshot) bool {
		w := s.Get("w1")
		return w.Overloaded && w.AgentNode == "n1" && w.Load.GetWaitingRequests() == 6
	})
	send(t, st, record("http://127.0.0.1:8001", 1))
	h.waitFor(t, "w1 back under its ceiling", func(s *registry.Snapshot) bool {
		return !s.Get("w1").Overloaded && s.Get("w1").Load.GetWaitingRequests() == 1
	})
	// A record about an engine no worker has is ignored.
	send(t, st, record("http://unknown:8000", 9))

	closeCleanly(t, st)
	w := h.reg.Snapshot().Get("w1")
	if w.AgentNode != "" {
		t.Errorf("AgentNode %q after the agent left, want empty", w.AgentNode)
	}
	if w.Liveness != smgv1.Veto_VETO_UNSPECIFIED {
		t.Errorf("a clean close vetoed the worker: %v", w.Liveness)
	}
}

func TestNoReportClearsOverloadAndFailureVetoes(t *testing.T) {
	cfg := defaultConfig()
	cfg.liveness.StallSecs = 0 // the first transport failure vetoes
	h := start(t, cfg)
	h.put(t, worker("w1", "http://127.0.0.1:8001", ""))
	st, _ := h.open(t, t.Context(), &smgv1.AgentHello{Node: "n1"})

	send(t, st, record("http://127.0.0.1:8001", 6))
	h.waitFor(t, "overloaded", func(s *registry.Snapshot) bool { return s.Get("w1").Overloaded })
	send(t, st, event("http://127.0.0.1:8001", smgv1.EngineEventKind_ENGINE_EVENT_KIND_NO_REPORT))
	h.waitFor(t, "overload cleared by no report (fail open)", func(s *registry.Snapshot) bool { return !s.Get("w1").Overloaded })

	send(t, st, event("http://127.0.0.1:8001", smgv1.EngineEventKind_ENGINE_EVENT_KIND_TRANSPORT_FAILURE))
	h.waitFor(t, "unreachable after a transport failure", func(s *registry.Snapshot) bool {
		return s.Get("w1").Liveness == smgv1.Veto_VETO_UNREACHABLE
	})
	send(t, st, event("http://127.0.0.1:8001", smgv1.EngineEventKind_ENGINE_EVENT_KIND_CONTACT))
	h.waitFor(t, "re-admitted by contact", func(s *registry.Snapshot) bool {
		return s.Get("w1").Liveness == smgv1.Veto_VETO_UNSPECIFIED
	})
	closeCleanly(t, st)
}

func TestTimeoutClearsOverloadWithoutContact(t *testing.T) {
	cfg := defaultConfig()
	cfg.liveness.StallSecs = 0
	h := start(t, cfg)
	h.put(t, worker("w1", "http://127.0.0.1:8001", ""))
	st, _ := h.open(t, t.Context(), &smgv1.AgentHello{Node: "n1"})

	send(t, st, event("http://127.0.0.1:8001", smgv1.EngineEventKind_ENGINE_EVENT_KIND_TRANSPORT_FAILURE))
	h.waitFor(t, "unreachable after a transport failure", func(s *registry.Snapshot) bool {
		return s.Get("w1").Liveness == smgv1.Veto_VETO_UNREACHABLE
	})
	send(t, st, record("http://127.0.0.1:8001", 6)) // contact, and over the threshold
	h.waitFor(t, "overloaded and re-admitted", func(s *registry.Snapshot) bool {
		w := s.Get("w1")
		return w.Overloaded && w.Liveness == smgv1.Veto_VETO_UNSPECIFIED
	})
	send(t, st, event("http://127.0.0.1:8001", smgv1.EngineEventKind_ENGINE_EVENT_KIND_TRANSPORT_FAILURE))
	h.waitFor(t, "unreachable again", func(s *registry.Snapshot) bool {
		return s.Get("w1").Liveness == smgv1.Veto_VETO_UNREACHABLE
	})
	send(t, st, event("http://127.0.0.1:8001", smgv1.EngineEventKind_ENGINE_EVENT_KIND_TIMEOUT))
	h.waitFor(t, "overload cleared by a timed-out poll (fail open)", func(s *registry.Snapshot) bool { return !s.Get("w1").Overloaded })
	if w := h.reg.Snapshot().Get("w1"); w.Liveness != smgv1.Veto_VETO_UNREACHABLE {
		t.Fatalf("a timeout counted as contact: liveness %v", w.Liveness)
	}
	closeCleanly(t, st)
}

func TestStreamBreakIsAConnectionFailure(t *testing.T) {
	cfg := defaultConfig()
	cfg.liveness.StallSecs = 0
	h := start(t, cfg)
	h.put(t, worker("w1", "http://127.0.0.1:8001", ""), worker("w2", "http://e2:8000", "n1"), worker("w3", "http://e3:8000", "n2"))
	ctx, cancel := context.WithCancel(t.Context())
	st, urls := h.open(t, ctx, &smgv1.AgentHello{Node: "n1"})
	if want := []string{"http://e2:8000"}; !slices.Equal(urls, want) {
		t.Fatalf("assignment %v, want %v", urls, want)
	}
	send(t, st, record("http://127.0.0.1:8001", 0))
	// The record's liveness side is applied last: wait for it, or the
	// break's failure could precede the record's contact at the same instant.
	// It changes evidence alone, which wakes no watcher: w2's record, applied
	// after it, sets w2's agent node, which does.
	send(t, st, record("http://e2:8000", 0))
	h.waitFor(t, "record applied", func(s *registry.Snapshot) bool {
		return s.Get("w1").AgentNode == "n1" && !s.Get("w1").Evidence.PushedAt.IsZero() && s.Get("w2").AgentNode == "n1"
	})

	cancel() // the agent vanishes without closing its side
	h.waitFor(t, "every covered worker unreachable", func(s *registry.Snapshot) bool {
		return s.Get("w1").Liveness == smgv1.Veto_VETO_UNREACHABLE && s.Get("w2").Liveness == smgv1.Veto_VETO_UNREACHABLE &&
			s.Get("w1").AgentNode == ""
	})
	if v := h.reg.Snapshot().Get("w3").Liveness; v != smgv1.Veto_VETO_UNSPECIFIED {
		t.Errorf("w3 belongs to another node but got %v", v)
	}
}

func TestReplacedStreamEndingRecordsNoFailure(t *testing.T) {
	cfg := defaultConfig()
	cfg.liveness.StallSecs = 0
	h := start(t, cfg)
	ended := make(chan string, 2)
	h.srv.ended = func(node string) { ended <- node }
	h.put(t, worker("w1", "http://127.0.0.1:8001", ""))
	oldCtx, cancelOld := context.WithCancel(t.Context())
	old, _ := h.open(t, oldCtx, &smgv1.AgentHello{Node: "n1"})
	send(t, old, record("http://127.0.0.1:8001", 0))
	h.waitFor(t, "record applied", func(s *registry.Snapshot) bool { return s.Get("w1").AgentNode == "n1" })

	st, _ := h.open(t, t.Context(), &smgv1.AgentHello{Node: "n1"}) // the agent reconnected
	cancelOld()
	if _, err := old.Recv(); status.Code(err) != codes.Canceled {
		t.Fatalf("old stream: %v", err)
	}
	<-ended // the old stream's end has been applied
	if w := h.reg.Snapshot().Get("w1"); w.Liveness != smgv1.Veto_VETO_UNSPECIFIED || w.AgentNode != "n1" {
		t.Errorf("replaced stream's end touched the worker: liveness %v, agent node %q", w.Liveness, w.AgentNode)
	}
	closeCleanly(t, st)
}

func TestHeartbeatAgesEngineSilenceUntilWedged(t *testing.T) {
	h := start(t, defaultConfig()) // wedge bound 3 s
	h.put(t, worker("w1", "http://127.0.0.1:8001", ""))
	st, _ := h.open(t, t.Context(), &smgv1.AgentHello{Node: "n1"})
	rec := record("http://127.0.0.1:8001", 0)
	rec.GetRecord().StepWire = true
	rec.GetRecord().EngineSilence = durationpb.New(time.Second)
	send(t, st, rec)
	h.waitFor(t, "record applied", func(s *registry.Snapshot) bool { return s.Get("w1").AgentNode == "n1" })
	if v := h.reg.Snapshot().Get("w1").Liveness; v != smgv1.Veto_VETO_UNSPECIFIED {
		t.Fatalf("1 s of silence vetoed: %v", v)
	}
	// Nothing changed on the engine for 2.5 s more: the heartbeat vouches
	// for the last record, whose silence has grown to 3.5 s.
	h.clock.Advance(2500 * time.Millisecond)
	send(t, st, &smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Heartbeat{Heartbeat: &smgv1.AgentHeartbeat{WorkerUrls: []string{"http://127.0.0.1:8001"}}}})
	h.waitFor(t, "wedged by the engine's own silence", func(s *registry.Snapshot) bool {
		return s.Get("w1").Liveness == smgv1.Veto_VETO_WEDGED
	})
	// The engine steps again: a record without silence re-admits it.
	rec = record("http://127.0.0.1:8001", 0)
	rec.GetRecord().StepWire = true
	rec.GetRecord().EngineSilence = durationpb.New(0)
	send(t, st, rec)
	h.waitFor(t, "re-admitted when the engine resumed", func(s *registry.Snapshot) bool {
		return s.Get("w1").Liveness == smgv1.Veto_VETO_UNSPECIFIED
	})
	closeCleanly(t, st)
}

func TestAssignmentFollowsTheRegistry(t *testing.T) {
	h := start(t, defaultConfig())
	h.put(t, worker("w2", "http://e2:8000", "n1"), worker("w3", "http://e3:8000", "n2"))
	st, urls := h.open(t, t.Context(), &smgv1.AgentHello{Node: "n1", EngineUrls: []string{"http://127.0.0.1:8001", "http://127.0.0.1:8001"}})
	if want := []string{"http://127.0.0.1:8001", "http://e2:8000"}; !slices.Equal(urls, want) {
		t.Fatalf("assignment %v, want %v (own engines plus workers registered with the node)", urls, want)
	}
	h.put(t, worker("w4", "http://e4:8000", "n1"))
	if got, want := nextAssignment(t, st), []string{"http://127.0.0.1:8001", "http://e2:8000", "http://e4:8000"}; !slices.Equal(got, want) {
		t.Fatalf("after a registration: %v, want %v", got, want)
	}
	// A load change elsewhere sends nothing; removing w2 does.
	h.put(t, worker("w3", "http://e3:8000", "n2"))
	if _, err := h.reg.Update(func(tx *registry.Txn) error { tx.Delete("w2"); return nil }); err != nil {
		t.Fatal(err)
	}
	if got, want := nextAssignment(t, st), []string{"http://127.0.0.1:8001", "http://e4:8000"}; !slices.Equal(got, want) {
		t.Fatalf("after a removal: %v, want %v", got, want)
	}
	closeCleanly(t, st)
}

func TestTokenGuardsTheStream(t *testing.T) {
	h := start(t, config{token: "s3cret", liveness: judge.DefaultLivenessConfig()})
	for name, md := range map[string]metadata.MD{
		"missing": nil,
		"wrong":   metadata.Pairs("authorization", "Bearer nope"),
	} {
		ctx := metadata.NewOutgoingContext(t.Context(), md)
		st, err := smgv1.NewAgentServiceClient(h.conn).Report(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = st.Send(&smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Hello{Hello: &smgv1.AgentHello{Node: "n1"}}})
		_, err = st.Recv()
		if status.Code(err) != codes.Unauthenticated || status.Convert(err).Message() == "" {
			t.Errorf("%s token: %v, want Unauthenticated with a message", name, err)
		}
	}
	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer s3cret")
	st, _ := h.open(t, ctx, &smgv1.AgentHello{Node: "n1"})
	closeCleanly(t, st)
}

func TestHelloRequired(t *testing.T) {
	h := start(t, defaultConfig())
	for name, first := range map[string]*smgv1.ReportRequest{
		"heartbeat first": {Msg: &smgv1.ReportRequest_Heartbeat{Heartbeat: &smgv1.AgentHeartbeat{}}},
		"no node":         {Msg: &smgv1.ReportRequest_Hello{Hello: &smgv1.AgentHello{}}},
	} {
		st, err := smgv1.NewAgentServiceClient(h.conn).Report(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		send(t, st, first)
		if _, err := st.Recv(); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
}

func TestCloseSaysGoodbyeWithoutFailures(t *testing.T) {
	cfg := defaultConfig()
	cfg.liveness.StallSecs = 0
	h := start(t, cfg)
	h.put(t, worker("w1", "http://127.0.0.1:8001", "n1"))
	st, _ := h.open(t, t.Context(), &smgv1.AgentHello{Node: "n1"})
	h.srv.Close()
	resp, err := st.Recv()
	if err != nil || resp.GetGoodbye() == nil {
		t.Fatalf("got %v, %v; want a goodbye", resp, err)
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the goodbye: %v, want the end of the stream", err)
	}
	if v := h.reg.Snapshot().Get("w1").Liveness; v != smgv1.Veto_VETO_UNSPECIFIED {
		t.Errorf("our own goodbye vetoed the worker: %v", v)
	}
}

// BenchmarkRecords pushes load records for 8 engines over one stream and
// reports how many the control plane ingests per second (overload check,
// registry commit, liveness evidence). One b.N is one record.
func BenchmarkRecords(b *testing.B) {
	h := start(b, defaultConfig())
	const engines = 8
	urls := make([]string, engines)
	for i := range urls {
		urls[i] = "http://e" + string(rune('a'+i)) + ":8000"
		h.put(b, worker("w"+string(rune('a'+i)), urls[i], ""))
	}
	st, err := smgv1.NewAgentServiceClient(h.conn).Report(b.Context())
	if err != nil {
		b.Fatal(err)
	}
	if err := st.Send(&smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Hello{Hello: &smgv1.AgentHello{Node: "n1"}}}); err != nil {
		b.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		if err := st.Send(record(urls[i%engines], int32(i%7))); err != nil {
			b.Fatal(err)
		}
	}
	// A marker record on the last engine shows everything before it landed.
	last := urls[(b.N-1)%engines]
	if err := st.Send(record(last, 99)); err != nil {
		b.Fatal(err)
	}
	for {
		changed := h.reg.Changed()
		if h.reg.Snapshot().GetByURL(last).Load.GetWaitingRequests() == 99 {
			break
		}
		<-changed
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "records/s")
	_ = st.CloseSend()
}

// A stream remembers which worker a URL named (as the agent spells it), and
// forgets it when the worker is registered again: a record then follows the
// new registration, whichever node it is on.
func TestKnownURLsFollowRegistrations(t *testing.T) {
	h := start(t, defaultConfig())
	h.put(t, worker("w1", "http://e1:8000", "n1"), worker("w2", "http://e2:8000", "n1"))
	st, _ := h.open(t, t.Context(), &smgv1.AgentHello{Node: "n1"})
	// synced waits until the stream has applied everything sent before it.
	seq := int32(0)
	synced := func() {
		t.Helper()
		seq++
		want := seq
		send(t, st, record("http://e2:8000", want))
		h.waitFor(t, "the stream applied its records", func(s *registry.Snapshot) bool {
			return s.Get("w2").Load.GetWaitingRequests() == want
		})
	}

	send(t, st, record("http://e1:8000/", 6)) // another spelling of w1's URL
	h.waitFor(t, "w1 overloaded", func(s *registry.Snapshot) bool { return s.Get("w1").Overloaded })

	// w1 moves to node n2: this agent no longer speaks for it.
	moved := worker("w1", "http://e1:8000", "n2")
	h.put(t, moved)
	send(t, st, record("http://e1:8000/", 1))
	synced()
	if w := h.reg.Get("w1"); w.Load != nil || w.AgentNode != "" {
		t.Fatalf("a record about a worker now on another node was applied: load %v, agent node %q", w.Load, w.AgentNode)
	}

	// Removed, then registered again under another id on this node: the
	// record goes to the new worker.
	if _, err := h.reg.Update(func(tx *registry.Txn) error { tx.Delete("w1"); return nil }); err != nil {
		t.Fatal(err)
	}
	h.put(t, worker("w1b", "http://e1:8000", "n1"))
	send(t, st, record("http://e1:8000/", 7))
	h.waitFor(t, "the new worker gets the record", func(s *registry.Snapshot) bool {
		return s.Get("w1b").Load.GetWaitingRequests() == 7 && s.Get("w1b").Overloaded
	})
	closeCleanly(t, st)
}

// The control plane says it accepts LoadRecords, and applies every record
// of one as if each came alone, in order (latest wins).
func TestLoadRecordsApplyEveryRecord(t *testing.T) {
	h := start(t, defaultConfig())
	h.put(t, worker("w1", "http://e1:8000", "n1"), worker("w2", "http://e2:8000", "n1"), worker("w3", "http://e3:8000", "n2"))
	st, err := smgv1.NewAgentServiceClient(h.conn).Report(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	send(t, st, &smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Hello{Hello: &smgv1.AgentHello{Node: "n1"}}})
	resp, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if !resp.GetAssignment().GetAcceptsRecords() {
		t.Fatalf("assignment %v does not say the control plane accepts LoadRecords", resp)
	}
	var recs []*smgv1.LoadRecord
	for _, r := range []*smgv1.ReportRequest{
		record("http://e1:8000", 6), record("http://e2:8000", 2), record("http://e1:8000", 7),
		record("http://e3:8000", 9), // another node's: refused, the others still apply
	} {
		recs = append(recs, r.GetRecord())
	}
	send(t, st, &smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Records{Records: &smgv1.LoadRecords{Records: recs}}})
	h.waitFor(t, "every record of the batch applied", func(s *registry.Snapshot) bool {
		w1, w2 := s.Get("w1"), s.Get("w2")
		return w1.Overloaded && w1.Load.GetWaitingRequests() == 7 && w2.Load.GetWaitingRequests() == 2 && w2.AgentNode == "n1"
	})
	if w3 := h.reg.Get("w3"); w3.Load != nil {
		t.Fatalf("another node's worker took a record from the batch: %v", w3.Load)
	}
	closeCleanly(t, st)
}

// An agent sends a load only when it changes: a record that arrived while
// the worker was not Ready (and so was not judged) is judged at the first
// contact after the worker turns Ready, not left out until the load moves.
func TestRecordBeforeReadyIsJudgedAtTheNextContact(t *testing.T) {
	h := start(t, defaultConfig())
	w := worker("w1", "http://127.0.0.1:8001", "")
	w.Health = registry.HealthPending
	h.put(t, w)
	st, _ := h.open(t, t.Context(), &smgv1.AgentHello{Node: "n1"})

	send(t, st, record("http://127.0.0.1:8001", 6))
	h.waitFor(t, "the record seen (agent node set)", func(s *registry.Snapshot) bool { return s.Get("w1").AgentNode == "n1" })
	if got := h.reg.Snapshot().Get("w1"); got.Load != nil || got.Overloaded {
		t.Fatalf("a worker not Ready was judged: load %v, overloaded %v", got.Load, got.Overloaded)
	}
	ready := h.reg.Snapshot().Get("w1").Clone()
	ready.Health = registry.HealthHealthy
	h.put(t, ready)

	send(t, st, event("http://127.0.0.1:8001", smgv1.EngineEventKind_ENGINE_EVENT_KIND_CONTACT))
	h.waitFor(t, "the unchanged load judged at the contact", func(s *registry.Snapshot) bool {
		w := s.Get("w1")
		return w.Load.GetWaitingRequests() == 6 && w.Overloaded
	})
	closeCleanly(t, st)
}

// An agent says "contact" when its engine answers with the load it last
// sent; routers count dispatches since the worker's last load revision, so
// a contact moves the revision (the load as it is), at most once a second.
func TestContactMovesTheLoadRevisionAtMostOnceASecond(t *testing.T) {
	h := start(t, defaultConfig())
	h.put(t, worker("w1", "http://127.0.0.1:8001", ""))
	st, _ := h.open(t, t.Context(), &smgv1.AgentHello{Node: "n1"})

	send(t, st, record("http://127.0.0.1:8001", 1))
	h.waitFor(t, "the record stored", func(s *registry.Snapshot) bool { return s.Get("w1").Load.GetWaitingRequests() == 1 })
	first := h.reg.Snapshot().Get("w1")

	contact := func() {
		t.Helper()
		send(t, st, event("http://127.0.0.1:8001", smgv1.EngineEventKind_ENGINE_EVENT_KIND_CONTACT))
	}
	// Within a second of the record: contact only (the marker below is a
	// record of another engine, applied after the contact on this stream).
	h.clock.Advance(500 * time.Millisecond)
	contact()
	h.put(t, worker("w2", "http://127.0.0.1:8002", ""))
	send(t, st, record("http://127.0.0.1:8002", 1))
	h.waitFor(t, "the marker record", func(s *registry.Snapshot) bool { return s.Get("w2").Load != nil })
	if got := h.reg.Snapshot().Get("w1").LoadRevision; got != first.LoadRevision {
		t.Fatalf("a contact 0.5 s after the record moved the load revision %d -> %d", first.LoadRevision, got)
	}

	h.clock.Advance(600 * time.Millisecond) // 1.1 s after the record
	contact()
	h.waitFor(t, "the load revision moved by the contact", func(s *registry.Snapshot) bool {
		w := s.Get("w1")
		return w.LoadRevision == first.LoadRevision+1 && w.Load.GetWaitingRequests() == 1
	})

	h.clock.Advance(500 * time.Millisecond) // 0.5 s after the last move
	contact()
	send(t, st, record("http://127.0.0.1:8002", 2))
	h.waitFor(t, "the second marker", func(s *registry.Snapshot) bool { return s.Get("w2").Load.GetWaitingRequests() == 2 })
	if got := h.reg.Snapshot().Get("w1").LoadRevision; got != first.LoadRevision+1 {
		t.Fatalf("two moves within a second: load revision %d, want %d", got, first.LoadRevision+1)
	}
	closeCleanly(t, st)
}
