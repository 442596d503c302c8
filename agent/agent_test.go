package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/backoff"
	"github.com/smg-project/smg/sim"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// clock is a manual clock for engine silence.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Unix(1_000_000, 0)} }

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

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

// fakeCP is an AgentService that records what agents send and can cut them off.
type fakeCP struct {
	smgv1.UnimplementedAgentServiceServer
	addr string
	msgs chan *smgv1.ReportRequest

	mu      sync.Mutex
	cut     bool          // refuse streams
	breakCh chan struct{} // closed to break the current streams
	goodbye chan struct{} // closed to say goodbye on the current streams
}

func startFakeCP(t *testing.T) *fakeCP {
	t.Helper()
	f := &fakeCP{msgs: make(chan *smgv1.ReportRequest, 4096), breakCh: make(chan struct{}), goodbye: make(chan struct{})}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.addr = lis.Addr().String()
	gs := newGRPCServer()
	smgv1.RegisterAgentServiceServer(gs, f)
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	return f
}

// newGRPCServer accepts the agent's keepalive pings like the real control plane.
func newGRPCServer() *grpc.Server {
	return grpc.NewServer(grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 2 * time.Second, PermitWithoutStream: true}))
}

func (f *fakeCP) Report(stream grpc.BidiStreamingServer[smgv1.ReportRequest, smgv1.ReportResponse]) error {
	f.mu.Lock()
	cut, brk, bye := f.cut, f.breakCh, f.goodbye
	f.mu.Unlock()
	if cut {
		return status.Error(codes.Unavailable, "cut off")
	}
	if err := stream.Send(&smgv1.ReportResponse{Msg: &smgv1.ReportResponse_Assignment{Assignment: &smgv1.Assignment{}}}); err != nil {
		return err
	}
	recvErr := make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			f.msgs <- m
		}
	}()
	select {
	case err := <-recvErr:
		if errors.Is(err, io.EOF) {
			return nil
		}
		return err
	case <-brk:
		return status.Error(codes.Unavailable, "link lost")
	case <-bye:
		return stream.Send(&smgv1.ReportResponse{Msg: &smgv1.ReportResponse_Goodbye{Goodbye: &smgv1.Goodbye{Reason: "test"}}})
	case <-stream.Context().Done():
		return stream.Context().Err()
	}
}

// cutOff breaks the current streams and refuses new ones until restore.
func (f *fakeCP) cutOff() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cut = true
	close(f.breakCh)
	f.breakCh = make(chan struct{})
}

func (f *fakeCP) restore() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cut = false
}

func (f *fakeCP) sayGoodbye() {
	f.mu.Lock()
	defer f.mu.Unlock()
	close(f.goodbye)
	f.goodbye = make(chan struct{})
}

// next returns the next message matching pred, skipping others; fails after 5 s.
func (f *fakeCP) next(t *testing.T, what string, pred func(*smgv1.ReportRequest) bool) *smgv1.ReportRequest {
	t.Helper()
	m := f.nextWithin(5*time.Second, pred)
	if m == nil {
		t.Fatalf("timed out waiting for %s", what)
	}
	return m
}

// nextWithin returns the first message matching pred within d, or nil.
func (f *fakeCP) nextWithin(d time.Duration, pred func(*smgv1.ReportRequest) bool) *smgv1.ReportRequest {
	wait := time.NewTimer(d)
	defer wait.Stop()
	for {
		select {
		case m := <-f.msgs:
			if pred(m) {
				return m
			}
		case <-wait.C:
			return nil
		}
	}
}

func isHello(m *smgv1.ReportRequest) bool { return m.GetHello() != nil }

func recordOf(url string) func(*smgv1.ReportRequest) bool {
	return func(m *smgv1.ReportRequest) bool { return m.GetRecord().GetWorkerUrl() == url }
}

func eventOf(url string, kind smgv1.EngineEventKind) func(*smgv1.ReportRequest) bool {
	return func(m *smgv1.ReportRequest) bool {
		return m.GetEvent().GetWorkerUrl() == url && m.GetEvent().GetKind() == kind
	}
}

// runAgent runs an agent until the test ends and checks that Run returned nil.
func runAgent(t *testing.T, opts Options) *Agent {
	t.Helper()
	return runAgentWith(t, opts, prometheus.NewRegistry())
}

// runAgentWith is runAgent with the agent's metrics on reg.
func runAgentWith(t *testing.T, opts Options, reg prometheus.Registerer) *Agent {
	t.Helper()
	a, err := New(opts, discard(), reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return a
}

func fastOpts(cp string, urls ...string) Options {
	return Options{ControlPlane: cp, Node: "n1", EngineURLs: urls, PollInterval: 10 * time.Millisecond,
		HeartbeatInterval: 50 * time.Millisecond, Backoff: backoff.Policy{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond}}
}

// engineSim starts a simulated engine of the flavor with one running slot per rank.
func engineSim(t *testing.T, flavor string) *sim.Server {
	t.Helper()
	o := sim.DefaultOptions()
	o.Flavor = flavor
	o.ITL = time.Millisecond
	o.MaxRunningRequests = 1
	o.PrefillTokensPerSec = 1e6
	o.SGLangMetricsInterval = 1
	s, err := sim.Start("127.0.0.1:0", o, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// loadGen sends long streaming completions to engines and cancels them at
// the end of the test.
type loadGen struct {
	ctx    context.Context
	cancel context.CancelFunc
	client *http.Client
	wg     sync.WaitGroup
}

func newLoadGen(t *testing.T) *loadGen {
	ctx, cancel := context.WithCancel(context.Background())
	g := &loadGen{ctx: ctx, cancel: cancel, client: &http.Client{Transport: &http.Transport{}}}
	t.Cleanup(g.stop)
	return g
}

// stop cancels every request and waits for them.
func (g *loadGen) stop() {
	g.cancel()
	g.wg.Wait()
	g.client.CloseIdleConnections()
}

// start sends one request in the background; it runs until the test ends.
func (g *loadGen) start(url string) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		req, _ := http.NewRequestWithContext(g.ctx, http.MethodPost, url+"/v1/completions",
			strings.NewReader(`{"prompt":"x","max_tokens":50000,"stream":true}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := g.client.Do(req)
		if err != nil {
			return
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, bufio.NewReader(resp.Body))
	}()
}

func TestFrozenVLLMEngineReportsGrowingSilence(t *testing.T) {
	cp := startFakeCP(t)
	eng := engineSim(t, sim.FlavorVLLM)
	newLoadGen(t).start(eng.URL())
	clk := newClock()
	opts := fastOpts(cp.addr, eng.URL())
	opts.Now = clk.Now
	runAgent(t, opts)

	rec := cp.next(t, "a record with a running request", func(m *smgv1.ReportRequest) bool {
		return recordOf(eng.URL())(m) && m.GetRecord().GetLoad().GetRunningRequests() == 1
	}).GetRecord()
	if !rec.GetStepWire() || rec.GetEngineSilence() == nil || rec.GetEngineSilence().AsDuration() != 0 {
		t.Fatalf("stepping vLLM engine: step_wire %v, silence %v; want a step wire reporting zero silence",
			rec.GetStepWire(), rec.GetEngineSilence())
	}
	if err := eng.SetFault(sim.Fault{Freeze: true}); err != nil {
		t.Fatal(err)
	}
	// A contact means a poll saw nothing change: the engine is frozen and
	// the agent has seen its last step.
	cp.next(t, "contact from the frozen engine", eventOf(eng.URL(), smgv1.EngineEventKind_ENGINE_EVENT_KIND_CONTACT))
	// Time passes on the agent's clock; the frozen engine takes no step.
	var silent *smgv1.LoadRecord
	for tries := 0; silent == nil; tries++ {
		if tries == 10 {
			t.Fatal("no record reporting silence from the frozen engine")
		}
		clk.Advance(5 * time.Second)
		if m := cp.nextWithin(time.Second, func(m *smgv1.ReportRequest) bool {
			return recordOf(eng.URL())(m) && m.GetRecord().GetEngineSilence().AsDuration() > 0
		}); m != nil {
			silent = m.GetRecord()
		}
	}
	if s := silent.GetEngineSilence().AsDuration(); s%(5*time.Second) != 0 {
		t.Fatalf("silence %v, want whole advances of the agent's clock", s)
	}
	// Further silence is news to nobody: no record while it grows. After a
	// reconnect, the latest record is re-sent aged by the time since.
	clk.Advance(3 * time.Second)
	want := silent.GetEngineSilence().AsDuration() + clk.Now().Sub(silent.GetObservedAt().AsTime())
	cp.cutOff()
	cp.restore()
	hello := cp.next(t, "hello after the reconnect", isHello)
	resent := cp.next(t, "the latest record re-sent", recordOf(eng.URL()))
	again := resent.GetRecord()
	// Every message carries the agent's clock when sent (the control plane
	// measures its own reading lag with it), a re-sent record too, whose
	// observed_at stays the time of its poll.
	for _, m := range []*smgv1.ReportRequest{hello, resent} {
		if m.GetSentAt() == nil || !m.GetSentAt().AsTime().Equal(clk.Now()) {
			t.Fatalf("sent_at %v, want the agent's clock %v", m.GetSentAt(), clk.Now())
		}
	}
	if !again.GetObservedAt().AsTime().Before(clk.Now()) {
		t.Fatalf("re-sent record observed at %v, want its poll's time, before %v", again.GetObservedAt().AsTime(), clk.Now())
	}
	if got := again.GetEngineSilence().AsDuration(); got != want || got < silent.GetEngineSilence().AsDuration()+3*time.Second {
		t.Fatalf("re-sent silence %v, want %v: the figure grows while the engine stays frozen", got, want)
	}
}

// SGLang's wires carry token batches only: the agent measures the engine's
// silence from the KV tokens in use (/v1/loads) and sends it with step_wire
// false, so the control plane stretches the bound for a long prefill.
func TestFrozenSGLangEngineReportsSilenceOnItsTokenBatchWire(t *testing.T) {
	cp := startFakeCP(t)
	eng := engineSim(t, sim.FlavorSGLang)
	newLoadGen(t).start(eng.URL())
	clk := newClock()
	opts := fastOpts(cp.addr, eng.URL())
	opts.Now = clk.Now
	runAgent(t, opts)
	rec := cp.next(t, "an SGLang record with a running request", func(m *smgv1.ReportRequest) bool {
		return recordOf(eng.URL())(m) && m.GetRecord().GetLoad().GetRunningRequests() == 1
	}).GetRecord()
	if rec.GetStepWire() || rec.GetEngineSilence() == nil || rec.GetEngineSilence().AsDuration() != 0 {
		t.Fatalf("producing SGLang engine: step_wire %v, silence %v; want a token-batch wire reporting zero silence",
			rec.GetStepWire(), rec.GetEngineSilence())
	}
	if rec.GetLoad().GetSource() == "" || rec.GetObservedAt() == nil {
		t.Fatalf("record lacks its load or time: %v", rec)
	}
	if err := eng.SetFault(sim.Fault{Freeze: true}); err != nil {
		t.Fatal(err)
	}
	cp.next(t, "contact from the frozen engine", eventOf(eng.URL(), smgv1.EngineEventKind_ENGINE_EVENT_KIND_CONTACT))
	for tries := 0; ; tries++ {
		if tries == 10 {
			t.Fatal("no record reporting silence from the frozen SGLang engine")
		}
		clk.Advance(5 * time.Second)
		m := cp.nextWithin(time.Second, func(m *smgv1.ReportRequest) bool {
			return recordOf(eng.URL())(m) && m.GetRecord().GetEngineSilence().AsDuration() > 0
		})
		if m != nil {
			if r := m.GetRecord(); r.GetStepWire() {
				t.Fatalf("silence sent as a step wire's: %v", r)
			}
			return
		}
	}
}

func TestKilledEngineSendsTransportFailureAtOnce(t *testing.T) {
	cp := startFakeCP(t)
	eng := engineSim(t, sim.FlavorVLLM)
	runAgent(t, fastOpts(cp.addr, eng.URL()))
	cp.next(t, "first record", recordOf(eng.URL()))
	cp.next(t, "contact on an unchanged answer", eventOf(eng.URL(), smgv1.EngineEventKind_ENGINE_EVENT_KIND_CONTACT))

	if err := eng.SetFault(sim.Fault{Kill: true}); err != nil {
		t.Fatal(err)
	}
	ev := cp.next(t, "transport failure", eventOf(eng.URL(), smgv1.EngineEventKind_ENGINE_EVENT_KIND_TRANSPORT_FAILURE)).GetEvent()
	if ev.GetDetail() == "" {
		t.Error("transport failure without a detail")
	}
	// Heartbeats no longer vouch for the dead engine.
	hb := cp.next(t, "heartbeat", func(m *smgv1.ReportRequest) bool { return m.GetHeartbeat() != nil })
	if len(hb.GetHeartbeat().GetWorkerUrls()) != 0 {
		t.Errorf("heartbeat vouches for a dead engine: %v", hb.GetHeartbeat().GetWorkerUrls())
	}
	if err := eng.SetFault(sim.Fault{}); err != nil {
		t.Fatal(err)
	}
	cp.next(t, "a record once the engine is back", recordOf(eng.URL()))
}

func TestCutOffAgentKeepsOnlyTheLatestRecord(t *testing.T) {
	cp := startFakeCP(t)
	busy, idle := engineSim(t, sim.FlavorVLLM), engineSim(t, sim.FlavorVLLM)
	clk := newClock() // never advanced: no silence figure crosses zero
	opts := fastOpts(cp.addr, busy.URL(), idle.URL())
	opts.Now = clk.Now
	reg := prometheus.NewRegistry()
	a, err := New(opts, discard(), reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	cp.next(t, "hello", isHello)
	cp.next(t, "busy engine's first record", recordOf(busy.URL()))

	if err := busy.SetFault(sim.Fault{Freeze: true}); err != nil {
		t.Fatal(err)
	}
	cp.cutOff()
	// While cut off the queue on the frozen engine grows 1, 2, 3.
	gen := newLoadGen(t)
	for range 3 {
		gen.start(busy.URL())
	}
	waitPolls(t, reg, func() bool { return waitingOf(t, busy.URL()) == 3 })
	drain(cp.msgs)
	cp.restore()

	cp.next(t, "hello after the reconnect", isHello)
	var busyRecords []int32
	sawIdle := false
	for !sawIdle || len(busyRecords) == 0 {
		m := cp.next(t, "records of both engines", func(m *smgv1.ReportRequest) bool { return m.GetRecord() != nil })
		switch m.GetRecord().GetWorkerUrl() {
		case busy.URL():
			busyRecords = append(busyRecords, m.GetRecord().GetLoad().GetWaitingRequests())
		case idle.URL():
			sawIdle = true // re-sent although unchanged: the control plane may have lost it
		}
	}
	if busyRecords[0] != 3 {
		t.Fatalf("first record after the reconnect shows %d waiting, want the latest (3); records %v", busyRecords[0], busyRecords)
	}
}

// waitingOf reads the engine's waiting gauge straight from its /metrics.
func waitingOf(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, "vllm:num_requests_waiting{") {
			var v float64
			fmt.Sscan(l[strings.LastIndexByte(l, ' ')+1:], &v)
			return int(v)
		}
	}
	return -1
}

// waitPolls waits until cond holds and then for two more answered polls
// per engine, so the agent has seen the state cond describes.
func waitPolls(t *testing.T, reg *prometheus.Registry, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition never held")
		}
		time.Sleep(5 * time.Millisecond) // polling an engine's state, not timing a rule
	}
	start := polls(t, reg)
	for polls(t, reg) < start+4 {
		if time.Now().After(deadline) {
			t.Fatal("the agent stopped polling")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func polls(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, f := range fams {
		if f.GetName() == "smg_agent_polls_total" {
			for _, m := range f.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

func drain(c chan *smgv1.ReportRequest) {
	for {
		select {
		case <-c:
		default:
			return
		}
	}
}

func TestGoodbyeReconnectsAtOnce(t *testing.T) {
	cp := startFakeCP(t)
	opts := fastOpts(cp.addr)
	opts.Backoff = backoff.Policy{Initial: time.Minute, Max: time.Minute} // a backoff would outlast the test
	runAgent(t, opts)
	cp.next(t, "hello", isHello)
	cp.sayGoodbye()
	cp.next(t, "hello again right after the goodbye", isHello)
}
