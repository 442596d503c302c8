package controlplane_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/smg-project/smg/controlplane/admin"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	vllmpb "github.com/smg-project/smg/gen/vllm/grpc/engine"
	"github.com/smg-project/smg/internal/engine"
	"github.com/smg-project/smg/internal/enginegrpc"
	"github.com/smg-project/smg/sim"
)

func grpcSim(flavor string, dp int) func(*sim.Options) {
	return func(o *sim.Options) {
		o.Flavor, o.GRPC, o.DPSize = flavor, true, dp
		o.ITL = time.Millisecond
		o.MaxRunningRequests = 24
	}
}

// TestGRPCWorkerRegistered: a grpc:// worker registers over POST /workers
// and --worker-urls, with its model read over gRPC, is health-checked and
// polled over gRPC (the window in its load report), and GET /workers shows
// its connection mode.
func TestGRPCWorkerRegistered(t *testing.T) {
	sg := startSim(t, grpcSim(sim.FlavorSGLang, 2))
	vl := startSim(t, grpcSim(sim.FlavorVLLM, 1))
	opts := fastOptions()
	opts.WorkerURLs = []string{vl.GRPCURL()}
	h := startCP(t, opts)
	if err := h.cp.SubmitStatic(); err != nil {
		t.Fatal(err)
	}

	id := h.register(t, fmt.Sprintf(`{"url":%q}`, sg.GRPCURL()))
	w := h.reg.Snapshot().Get(id)
	if w.Model != "sim-model" || w.Load.GetSource() != string(engine.SourceGRPCSGLang) || len(w.Load.GetRanks()) != 2 ||
		w.Load.GetRanks()[1].GetMaxRunningRequests() != 24 || w.Load.GetMaxRunningRequests() != 48 {
		t.Fatalf("worker %+v load %v", w, w.Load)
	}
	r := h.do(t, http.MethodGet, "/workers/"+id, "")
	wv, _ := r.json(t)["worker"].(map[string]any)
	spec, _ := wv["spec"].(map[string]any)
	if r.status != http.StatusOK || spec["connection_mode"] != "grpc" || spec["url"] != sg.GRPCURL() {
		t.Fatalf("GET /workers/%s = %d %s", id, r.status, r.body)
	}

	vid := admin.WorkerID(vl.GRPCURL())
	h.waitFor(t, "the --worker-urls gRPC worker Ready with a load", func(s *registry.Snapshot) bool {
		w := s.Get(vid)
		return w != nil && w.Ready() && w.Load.GetSource() == string(engine.SourceGRPCVLLM)
	})
}

// TestGRPCWorkerRegistrationFailures: a grpc:// URL at an HTTP port fails
// at once with a message naming the worker; one where nothing listens fails
// at the registration timeout; both leave the registry as it was.
func TestGRPCWorkerRegistrationFailures(t *testing.T) {
	s := startSim(t, nil)
	h := startCP(t, fastOptions())
	before := len(h.reg.Snapshot().Workers())

	httpAsGRPC := "grpc://" + strings.TrimPrefix(s.URL(), "http://")
	r := h.do(t, http.MethodPost, "/workers", fmt.Sprintf(`{"url":%q}`, httpAsGRPC))
	if r.status != http.StatusAccepted {
		t.Fatalf("POST = %d %s", r.status, r.body)
	}
	start := time.Now()
	job := h.waitJob(t, admin.WorkerID(httpAsGRPC))
	if job.State != "failed" || !strings.Contains(job.Message, httpAsGRPC) || !strings.Contains(job.Message, "answers HTTP") {
		t.Fatalf("job %+v", job)
	}
	if time.Since(start) > 2*time.Second { // well before the 3 s registration timeout: not retried
		t.Fatalf("an HTTP answer was retried until the timeout (%s)", time.Since(start))
	}

	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := "grpc://" + ln.Addr().String()
	ln.Close()
	h.do(t, http.MethodPost, "/workers", fmt.Sprintf(`{"url":%q}`, dead))
	job = h.waitJob(t, admin.WorkerID(dead))
	if job.State != "failed" || !strings.Contains(job.Message, dead) || !strings.Contains(job.Message, "not reachable") {
		t.Fatalf("job %+v", job)
	}
	if n := len(h.reg.Snapshot().Workers()); n != before {
		t.Fatalf("%d workers after failed registrations, %d before", n, before)
	}
}

// TestGRPCWorkerHealthAndPoll: a killed gRPC worker fails its probes and
// polls; revived, it is Ready and reporting again.
func TestGRPCWorkerHealthAndPoll(t *testing.T) {
	s := startSim(t, grpcSim(sim.FlavorVLLM, 1))
	h := startCP(t, fastOptions())
	id := h.register(t, fmt.Sprintf(`{"url":%q}`, s.GRPCURL()))
	if err := s.SetFault(sim.Fault{Kill: true}); err != nil {
		t.Fatal(err)
	}
	h.waitFor(t, "the killed worker unhealthy", func(snap *registry.Snapshot) bool {
		w := snap.Get(id)
		return w != nil && w.Health == registry.HealthUnhealthy
	})
	if err := s.SetFault(sim.Fault{}); err != nil {
		t.Fatal(err)
	}
	rev := h.reg.Snapshot().Get(id).LoadRevision
	h.waitFor(t, "the revived worker Ready and polled", func(snap *registry.Snapshot) bool {
		w := snap.Get(id)
		return w != nil && w.Ready() && w.LoadRevision > rev
	})
}

// TestGRPCWorkerPushedEvidence: with no agent, the control plane streams a
// gRPC worker's KV events: a frozen engine holding a streaming request is
// vetoed wedged from the servicer's silence figure and re-admitted when it
// produces again; a killed one is vetoed unreachable from the connection
// failure on its channels and re-admitted by the first contact after.
func TestGRPCWorkerPushedEvidence(t *testing.T) {
	s := startSim(t, func(o *sim.Options) {
		grpcSim(sim.FlavorVLLM, 1)(o)
		o.KVHeartbeat = 200 * time.Millisecond
	})
	opts := fastOptions()
	opts.LoadMonitorInterval = 60       // the stream, not the poll, must bring the evidence
	opts.Health.FailureThreshold = 1000 // liveness, not the health checker, must exclude the killed worker
	h := startCP(t, opts)
	id := h.register(t, fmt.Sprintf(`{"url":%q}`, s.GRPCURL()))
	h.waitFor(t, "a pushed record", func(snap *registry.Snapshot) bool {
		w := snap.Get(id)
		return w != nil && !w.Evidence.PushedAt.IsZero()
	})

	if err := s.SetFault(sim.Fault{Freeze: true}); err != nil {
		t.Fatal(err)
	}
	c, err := enginegrpc.New(s.GRPCURL(), enginegrpc.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	conn := vllmpb.NewVllmEngineClient(c.Conn())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := conn.Generate(ctx, &vllmpb.GenerateRequest{Stream: true,
		Input: &vllmpb.GenerateRequest_Tokenized{Tokenized: &vllmpb.TokenizedInput{InputIds: []uint32{3, 4, 5}}}}); err != nil {
		t.Fatal(err)
	}
	h.waitFor(t, "wedged from the engine's silence", func(snap *registry.Snapshot) bool {
		w := snap.Get(id)
		return w != nil && w.Liveness == smgv1.Veto_VETO_WEDGED
	})
	if err := s.SetFault(sim.Fault{}); err != nil {
		t.Fatal(err)
	}
	h.waitFor(t, "re-admitted once the engine produces", func(snap *registry.Snapshot) bool {
		w := snap.Get(id)
		return w != nil && w.Liveness == smgv1.Veto_VETO_UNSPECIFIED
	})

	if err := s.SetFault(sim.Fault{Kill: true}); err != nil {
		t.Fatal(err)
	}
	h.waitFor(t, "unreachable after the stream's connection failure", func(snap *registry.Snapshot) bool {
		w := snap.Get(id)
		return w != nil && w.Liveness == smgv1.Veto_VETO_UNREACHABLE
	})
	if err := s.SetFault(sim.Fault{}); err != nil {
		t.Fatal(err)
	}
	h.waitFor(t, "re-admitted by contact", func(snap *registry.Snapshot) bool {
		w := snap.Get(id)
		return w != nil && w.Liveness == smgv1.Veto_VETO_UNSPECIFIED
	})
}
