package controlplane_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/smg-project/smg/controlplane"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/testutil"
	"github.com/smg-project/smg/sim"
)

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer = testutil.SyncBuffer

// harness is a running control plane: REST on an httptest server, gRPC on a
// loopback listener, background loops running.
type harness struct {
	cp      *controlplane.ControlPlane
	reg     *registry.Registry
	metrics *prometheus.Registry
	http    *httptest.Server
	grpc    smgv1.WorkerServiceClient
	conn    *grpc.ClientConn
	logs    *syncBuffer
	key     string // sent as the bearer admin key by do
	addr    string // the gRPC port (agents, routers)
	stop    func() // ends Run and waits for it (a replica stops leading)
}

// fastOptions keep tests quick: 1 s load polls, one probe to admit.
func fastOptions() controlplane.Options {
	o := controlplane.DefaultOptions()
	o.LoadMonitorInterval = 1
	o.Health.SuccessThreshold = 1
	o.Health.FailureThreshold = 1
	o.Health.IntervalSecs = 1
	o.Health.StartupInterval = 100 * time.Millisecond
	o.RegistrationTimeout = 3 * time.Second
	return o
}

func startCP(t *testing.T, opts controlplane.Options) *harness {
	t.Helper()
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	metrics := prometheus.NewRegistry()
	cp, err := controlplane.New(opts, log, metrics)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{cp: cp, reg: cp.Registry, metrics: metrics, logs: logs, key: opts.AdminAPIKey}

	h.http = httptest.NewServer(cp.HTTPHandler())
	t.Cleanup(h.http.Close)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := cp.GRPCServer()
	go func() { _ = gs.Serve(ln) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	h.grpc = smgv1.NewWorkerServiceClient(conn)
	h.addr = ln.Addr().String()
	h.conn = conn

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { cp.Run(ctx); close(done) }()
	h.stop = sync.OnceFunc(func() { cancel(); <-done })
	t.Cleanup(func() {
		h.stop()
		conn.Close()
		gs.Stop()
		if t.Failed() {
			t.Logf("control plane log:\n%s", logs)
		}
	})
	return h
}

// startSim starts a simulated engine; mutate adjusts its options.
func startSim(t *testing.T, mutate func(*sim.Options)) *sim.Server {
	t.Helper()
	o := sim.DefaultOptions()
	if mutate != nil {
		mutate(&o)
	}
	s, err := sim.Start("127.0.0.1:0", o, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

type response struct {
	status int
	header http.Header
	body   []byte
}

// json decodes the body into a generic value.
func (r response) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("body is not a JSON object: %v\n%s", err, r.body)
	}
	return m
}

// errorCode returns error.code of an error answer.
func (r response) errorCode(t *testing.T) string {
	t.Helper()
	e, _ := r.json(t)["error"].(map[string]any)
	code, _ := e["code"].(string)
	return code
}

func (r response) errorField(t *testing.T, field string) any {
	t.Helper()
	e, _ := r.json(t)["error"].(map[string]any)
	return e[field]
}

// do sends a REST request with h.key as the admin key.
func (h *harness) do(t *testing.T, method, path, body string) response {
	t.Helper()
	return h.doKey(t, method, path, body, h.key)
}

func (h *harness) doKey(t *testing.T, method, path, body, key string) response {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, h.http.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := h.http.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// waitFor re-checks cond at every registry commit until it holds, failing
// the test after a generous deadline. The deadline is a safety net, not a
// pacing: conditions turn true on a commit.
func (h *harness) waitFor(t *testing.T, what string, cond func(*registry.Snapshot) bool) {
	t.Helper()
	deadline := time.NewTimer(20 * time.Second)
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

// waitJob waits for a worker's registration job to reach a final state.
func (h *harness) waitJob(t *testing.T, id string) *registry.Job {
	t.Helper()
	var job *registry.Job
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	for {
		// Job updates do not bump the revision; poll them on a short tick.
		if j := h.reg.Snapshot().Job(id); j != nil && (j.State == "done" || j.State == "failed") {
			job = j
			return job
		}
		select {
		case <-h.reg.Changed():
		case <-time.After(20 * time.Millisecond):
		case <-deadline.C:
			t.Fatalf("timed out waiting for the registration job of %s", id)
		}
	}
}

func ready(id string) func(*registry.Snapshot) bool {
	return func(s *registry.Snapshot) bool { w := s.Get(id); return w != nil && w.Ready() }
}

func overloaded(id string, want bool) func(*registry.Snapshot) bool {
	return func(s *registry.Snapshot) bool { w := s.Get(id); return w != nil && w.Overloaded == want }
}

// register POSTs a spec and waits for the worker to be Ready with a load report.
func (h *harness) register(t *testing.T, body string) string {
	t.Helper()
	r := h.do(t, http.MethodPost, "/workers", body)
	if r.status != http.StatusAccepted {
		t.Fatalf("POST /workers = %d %s", r.status, r.body)
	}
	id, _ := r.json(t)["worker_id"].(string)
	h.waitFor(t, "worker "+id+" Ready with a load report", func(s *registry.Snapshot) bool {
		w := s.Get(id)
		return w != nil && w.Ready() && w.Load != nil
	})
	return id
}

// gauge reads one series of a gathered metric; ok=false when absent.
func (h *harness) gauge(t *testing.T, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := h.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue next
				}
			}
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// queue sends n chat requests to a (frozen) engine so they wait in its queue;
// they end when the engine unfreezes or closes, or at test cleanup.
func queue(t *testing.T, engine *sim.Server, n int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":1}`
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, engine.URL()+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
}

// timeAfter is a short pause for polling state outside the registry (an
// engine's own metrics).
func timeAfter(ms int) <-chan time.Time { return time.After(time.Duration(ms) * time.Millisecond) }
