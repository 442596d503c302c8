package watchclient

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/smg-project/smg/controlplane/registry"
	"github.com/smg-project/smg/controlplane/watch"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/backoff"
	"github.com/smg-project/smg/router"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var _ Target = (*router.Router)(nil)

// fakeTarget records what the client tells the router.
type fakeTarget struct {
	mu        sync.Mutex
	snaps     []*router.Snapshot
	failOpens int
	contacts  []string
	obs       router.Observations
	notify    chan struct{} // closed and replaced on every call
}

func newTarget() *fakeTarget { return &fakeTarget{notify: make(chan struct{})} }

func (f *fakeTarget) event() { close(f.notify); f.notify = make(chan struct{}) }

func (f *fakeTarget) Apply(s *router.Snapshot) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.snaps = append(f.snaps, s)
	f.event()
}

func (f *fakeTarget) FailOpen() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failOpens++
	f.event()
}

func (f *fakeTarget) ContactSeen(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.contacts = append(f.contacts, id)
	f.event()
}

func (f *fakeTarget) Observations() router.Observations {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.obs
}

func (f *fakeTarget) latest() *router.Snapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.snaps) == 0 {
		return nil
	}
	return f.snaps[len(f.snaps)-1]
}

// waitFor blocks until cond holds of the latest snapshot (real-time tests;
// the deadline only guards against a hang).
func (f *fakeTarget) waitFor(t testing.TB, what string, cond func(*router.Snapshot) bool) *router.Snapshot {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		f.mu.Lock()
		ch := f.notify
		var s *router.Snapshot
		if n := len(f.snaps); n > 0 {
			s = f.snaps[n-1]
		}
		f.mu.Unlock()
		if s != nil && cond(s) {
			return s
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s; latest snapshot %+v", what, s)
		}
	}
}

func atRevision(rev uint64) func(*router.Snapshot) bool {
	return func(s *router.Snapshot) bool { return s.Revision == rev }
}

func workerIDs(s *router.Snapshot) string {
	var ids []string
	for _, w := range s.Workers {
		ids = append(ids, w.ID)
	}
	return strings.Join(ids, ",")
}

func newWorker(id string) *registry.Worker {
	return &registry.Worker{Registered: registry.Registered{ID: id, Spec: &smgv1.WorkerSpec{Url: "http://" + id}, Model: "m", Type: "regular"}, State: registry.State{Health: registry.HealthHealthy}}
}

func put(t testing.TB, reg *registry.Registry, ws ...*registry.Worker) uint64 {
	t.Helper()
	rev, err := reg.Update(func(tx *registry.Txn) error {
		for _, w := range ws {
			tx.Insert(w)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

func setOverloaded(t testing.TB, reg *registry.Registry, id string, on bool) uint64 {
	t.Helper()
	rev, err := reg.Update(func(tx *registry.Txn) error {
		w := tx.Get(id).Clone() // the registry decides the verdict from the load
		w.Thresholds.TokenUsage = 0.95
		w.Load = &smgv1.EngineLoad{TokenUsage: 0.5}
		if on {
			w.Load = &smgv1.EngineLoad{TokenUsage: 0.97}
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

// switchable serves WatchService through whichever watch.Server is current,
// so a test can retire one (goodbye) and let the router reconnect to the next.
type switchable struct {
	smgv1.UnimplementedWatchServiceServer
	cur atomic.Pointer[watch.Server]
}

func (s *switchable) Watch(st grpc.BidiStreamingServer[smgv1.WatchRequest, smgv1.WatchResponse]) error {
	return s.cur.Load().Watch(st)
}

type plane struct {
	svc  *switchable
	conn *grpc.ClientConn
}

// startPlane serves srv on a real loopback listener and dials it.
func startPlane(t testing.TB, srv *watch.Server) *plane {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	svc := &switchable{}
	svc.cur.Store(srv)
	gs := grpc.NewServer()
	smgv1.RegisterWatchServiceServer(gs, svc)
	go gs.Serve(lis)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		svc.cur.Load().Close()
		gs.Stop()
	})
	return &plane{svc: svc, conn: conn}
}

// run starts c.Run until the test ends.
func run(t testing.TB, c *Client) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { c.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
}

func TestAppliesSnapshotThenDeltas(t *testing.T) {
	reg := registry.New("A", 0)
	decode := newWorker("w2")
	decode.Type, decode.WindowShare = "decode", map[string]int64{"r1": 16, "r2": 48}
	put(t, reg, decode, newWorker("w1"))
	p := startPlane(t, watch.NewServer(reg, watch.Options{}, nil, nil))
	target := newTarget()
	c := New(p.conn, target, Options{RouterID: "r1"}, nil)
	run(t, c)

	s := target.waitFor(t, "snapshot", atRevision(reg.Revision()))
	if s.Epoch != "A" || workerIDs(s) != "w1,w2" || s.Workers[0].Priority != 50 || !s.Workers[0].Healthy ||
		s.Workers[1].Type != "decode" || s.Workers[1].WindowShare != 16 {
		t.Fatalf("snapshot = %+v", s)
	}
	rev := setOverloaded(t, reg, "w2", true)
	s = target.waitFor(t, "delta", atRevision(rev))
	if w := s.Workers[1]; w.ID != "w2" || w.Veto != router.VetoOverload || w.VetoReason != "token_usage 0.97 >= 0.95" {
		t.Fatalf("w2 = %+v, want overload veto", w)
	}
	if s.Workers[0].Veto != router.VetoNone || workerIDs(s) != "w1,w2" {
		t.Fatalf("snapshot after delta = %+v", s)
	}
	// The client records the revision just after publishing it (an ack
	// must name an applied revision), so the target can see it first.
	for deadline := time.Now().Add(5 * time.Second); ; runtime.Gosched() {
		e, r := c.Revision()
		if e == "A" && r == rev && c.Connected() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Revision() = %s/%d connected=%v", e, r, c.Connected())
		}
	}
}

func TestGoodbyeReconnectsAtOnceAndResumes(t *testing.T) {
	reg := registry.New("A", 0)
	put(t, reg, newWorker("w1"))
	first := watch.NewServer(reg, watch.Options{}, nil, nil)
	p := startPlane(t, first)
	target := newTarget()
	// A backoff of an hour: only the goodbye's immediate reconnect can pass.
	c := New(p.conn, target, Options{RouterID: "r1", Backoff: backoff.Policy{Initial: time.Hour, Max: time.Hour}}, nil)
	run(t, c)
	target.waitFor(t, "snapshot", atRevision(reg.Revision()))

	metrics := prometheus.NewRegistry()
	next := watch.NewServer(reg, watch.Options{}, nil, metrics)
	p.svc.cur.Store(next)
	first.Close()
	rev := setOverloaded(t, reg, "w1", true)

	s := target.waitFor(t, "resumed delta", atRevision(rev))
	if s.Workers[0].Veto != router.VetoOverload {
		t.Fatalf("w1 = %+v", s.Workers[0])
	}
	if n := testutil.ToFloat64(mustCounter(t, metrics, "snapshot")); n != 0 {
		t.Fatalf("the resumed router was sent %v snapshots, want 0 (deltas only)", n)
	}
}

func mustCounter(t testing.TB, g prometheus.Gatherer, kind string) prometheus.Collector {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "smg_watch_messages_sent_total" {
			continue
		}
		for _, m := range mf.Metric {
			if m.Label[0].GetValue() == kind {
				return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "x"}, func() float64 { return m.Counter.GetValue() })
			}
		}
	}
	t.Fatalf("no smg_watch_messages_sent_total{kind=%q}", kind)
	return nil
}

func TestNewEpochReplacesEverything(t *testing.T) {
	regA := registry.New("A", 0)
	put(t, regA, newWorker("w1"), newWorker("w2"))
	first := watch.NewServer(regA, watch.Options{}, nil, nil)
	p := startPlane(t, first)
	target := newTarget()
	c := New(p.conn, target, Options{RouterID: "r1"}, nil)
	run(t, c)
	target.waitFor(t, "snapshot", atRevision(regA.Revision()))

	// The control plane restarts with a new epoch; its revisions start over.
	regB := registry.New("B", 0)
	put(t, regB, newWorker("w3"))
	p.svc.cur.Store(watch.NewServer(regB, watch.Options{}, nil, nil))
	first.Close()
	s := target.waitFor(t, "snapshot of epoch B", func(s *router.Snapshot) bool { return s.Epoch == "B" })
	if workerIDs(s) != "w3" || s.Revision != regB.Revision() {
		t.Fatalf("snapshot = %+v, want only w3 at B/%d", s, regB.Revision())
	}
}

func TestThreeRoutersConverge(t *testing.T) {
	reg := registry.New("A", 0)
	for i := range 5 {
		put(t, reg, newWorker(fmt.Sprint("w", i)))
	}
	// Loads at once: a router at the final revision then holds every load
	// (paced, a revision can name loads not sent yet, docs/watch.md).
	srv := watch.NewServer(reg, watch.Options{LoadInterval: -1}, nil, nil)
	p := startPlane(t, srv)
	var targets []*fakeTarget
	var clients []*Client
	for i := range 3 {
		target := newTarget()
		c := New(p.conn, target, Options{RouterID: fmt.Sprint("r", i)}, nil)
		run(t, c)
		targets, clients = append(targets, target), append(clients, c)
	}
	for i := range 50 { // commits race the three streams
		setOverloaded(t, reg, fmt.Sprint("w", i%5), i%3 == 0)
	}
	final := reg.Revision()
	want := fmt.Sprintf("%+v", snapshotOf(t, reg))
	for i, target := range targets {
		s := target.waitFor(t, "final revision", atRevision(final))
		if got := fmt.Sprintf("%+v", s.Workers); got != want {
			t.Fatalf("router %d holds\n %s\nwant\n %s", i, got, want)
		}
		// The client records the revision right after publishing, under
		// applyMu: wait for that message to be done with.
		clients[i].applyMu.Lock()
		//lint:ignore SA2001 an empty critical section is the barrier
		clients[i].applyMu.Unlock()
		if e, r := clients[i].Revision(); e != "A" || r != final {
			t.Fatalf("router %d Revision() = %s/%d", i, e, r)
		}
	}
}

// snapshotOf is what a router should hold for the registry's current state.
func snapshotOf(t testing.TB, reg *registry.Registry) []router.Worker {
	var out []router.Worker
	for _, w := range reg.Snapshot().Workers() {
		out = append(out, routerWorker(watch.RoutingWorker(w, "")))
	}
	return out
}

func TestWrongTokenIsRefused(t *testing.T) {
	reg := registry.New("A", 0)
	p := startPlane(t, watch.NewServer(reg, watch.Options{Token: "right"}, nil, nil))
	for _, tc := range []struct {
		token string
		want  codes.Code
	}{{"wrong", codes.Unauthenticated}, {"", codes.Unauthenticated}} {
		c := New(p.conn, newTarget(), Options{RouterID: "r1", Token: tc.token}, nil)
		_, err := c.session(t.Context())
		if status.Code(err) != tc.want {
			t.Fatalf("token %q: err = %v, want %v", tc.token, err, tc.want)
		}
	}
	target := newTarget()
	run(t, New(p.conn, target, Options{RouterID: "r1", Token: "right"}, nil))
	target.waitFor(t, "snapshot with the right token", atRevision(0))
}

// applyNotifier forwards to a real router and says when a snapshot landed.
type applyNotifier struct {
	*router.Router
	applied chan uint64
}

func (a applyNotifier) Apply(s *router.Snapshot) {
	a.Router.Apply(s)
	a.applied <- s.Revision
}

func TestFeedsARealRouter(t *testing.T) {
	reg := registry.New("A", 0)
	w := newWorker("w1")
	w.Thresholds.WaitingRequests, w.Load = 10, &smgv1.EngineLoad{WaitingRequests: 12} // overloaded
	rev := put(t, reg, w, newWorker("w2"))
	p := startPlane(t, watch.NewServer(reg, watch.Options{}, nil, nil))
	rt, err := router.New(router.DefaultOptions(), nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	if rt.Ready() {
		t.Fatal("router ready before any snapshot")
	}
	target := applyNotifier{rt, make(chan uint64, 16)}
	run(t, New(p.conn, target, Options{RouterID: "r1"}, nil))
	if got := <-target.applied; got != rev {
		t.Fatalf("applied revision %d, want %d", got, rev)
	}

	web := httptest.NewServer(rt.Handler())
	defer web.Close()
	resp, err := http.Get(web.URL + "/loads")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var loads router.LoadsResponse
	if err := json.NewDecoder(resp.Body).Decode(&loads); err != nil {
		t.Fatal(err)
	}
	if loads.Epoch != "A" || loads.Revision != rev || len(loads.Workers) != 2 ||
		loads.Workers[0].Veto != "overload" || loads.Workers[0].VetoReason != "waiting_requests 12 >= 10" ||
		loads.Workers[1].Veto != "" {
		t.Fatalf("/loads = %+v", loads)
	}
}

// A split router whose own --load-monitor-interval (7) differs from its
// control plane's (1) answers a shed with the control plane's Retry-After
// once connected; its flag applies only before the first snapshot.
func TestSplitRouterTakesRetryAfterFromTheControlPlane(t *testing.T) {
	reg := registry.New("A", 0)
	w := newWorker("w1")
	w.Thresholds.WaitingRequests, w.Load = 10, &smgv1.EngineLoad{WaitingRequests: 12} // overloaded
	rev := put(t, reg, w)
	settings := &smgv1.FleetSettings{LoadMonitorIntervalSecs: 1, WorkerStaleSecs: 15}
	p := startPlane(t, watch.NewServer(reg, watch.Options{Settings: settings}, nil, nil))
	opts := router.DefaultOptions()
	opts.LoadMonitorInterval, opts.WorkerOverloadShed = 7, true
	shedRetryAfter := func(rt *router.Router) string {
		t.Helper()
		web := httptest.NewServer(rt.Handler())
		defer web.Close()
		resp, err := http.Post(web.URL+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("status %d %s, want the shed answer", resp.StatusCode, b)
		}
		return resp.Header.Get("Retry-After")
	}

	// Before any snapshot from a control plane: the router's own flag.
	alone, err := router.New(opts, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	alone.Apply(&router.Snapshot{Epoch: "A", Revision: 1, Workers: []router.Worker{{ID: "w1", URL: "http://w1", Model: "m",
		Healthy: true, Veto: router.VetoOverload}}})
	if got := shedRetryAfter(alone); got != "7" {
		t.Fatalf("Retry-After before the control plane's settings = %q, want the flag's 7", got)
	}

	rt, err := router.New(opts, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	target := applyNotifier{rt, make(chan uint64, 16)}
	run(t, New(p.conn, target, Options{RouterID: "r1", StaleAfter: 15 * time.Second}, nil))
	if got := <-target.applied; got != rev {
		t.Fatalf("applied revision %d, want %d", got, rev)
	}
	if got := shedRetryAfter(rt); got != "1" {
		t.Fatalf("Retry-After = %q, want the control plane's --load-monitor-interval 1 (the router's flag says 7)", got)
	}
}
