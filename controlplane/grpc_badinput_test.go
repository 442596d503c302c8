package controlplane_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/smg-project/smg/agent"
	"github.com/smg-project/smg/controlplane"
	"github.com/smg-project/smg/controlplane/admin"
	"github.com/smg-project/smg/controlplane/registry"
	commonpb "github.com/smg-project/smg/gen/smg/grpc/common"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/enginegrpc"
	"github.com/smg-project/smg/internal/enginegrpc/enginegrpctest"
	"github.com/smg-project/smg/internal/testutil"
	"github.com/smg-project/smg/sim"
)

// TestGRPCRegistrationBadInput: a servicer that never answers fails its
// registration at the registration timeout, an endless or malformed
// GetTokenizer stream fails it at once (bounded), each job message naming
// the worker; none of them is added, and a good gRPC worker registered
// beside them is Ready and fed as usual.
func TestGRPCRegistrationBadInput(t *testing.T) {
	good := startSim(t, grpcSim(sim.FlavorSGLang, 1))
	h := startCP(t, fastOptions())
	gid := h.register(t, fmt.Sprintf(`{"url":%q}`, good.GRPCURL()))
	for _, tc := range []struct {
		name string
		f    *enginegrpctest.Servicer
		want string
	}{
		{"never answers", &enginegrpctest.Servicer{Hang: true}, "not reachable within"},
		{"endless tokenizer", &enginegrpctest.Servicer{Tokenizer: func(st grpc.ServerStreamingServer[commonpb.GetTokenizerChunk]) error {
			for {
				if err := st.Send(&commonpb.GetTokenizerChunk{Data: []byte("x")}); err != nil {
					return err
				}
			}
		}}, "tokenizer unusable"},
		{"malformed tokenizer", &enginegrpctest.Servicer{Tokenizer: func(st grpc.ServerStreamingServer[commonpb.GetTokenizerChunk]) error {
			return st.Send(&commonpb.GetTokenizerChunk{Data: []byte("not a zip"), Sha256: "00"})
		}}, "tokenizer unusable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := enginegrpctest.Serve(t, tc.f)
			if r := h.do(t, http.MethodPost, "/workers", fmt.Sprintf(`{"url":%q}`, url)); r.status != http.StatusAccepted {
				t.Fatalf("POST = %d %s", r.status, r.body)
			}
			job := h.waitJob(t, admin.WorkerID(url))
			if job.State != "failed" || !strings.Contains(job.Message, url) || !strings.Contains(job.Message, tc.want) {
				t.Fatalf("job %+v, want failed naming %s: %q", job, url, tc.want)
			}
			if w := h.reg.Snapshot().GetByURL(url); w != nil {
				t.Fatalf("the failed worker was added: %+v", w)
			}
		})
	}
	rev := h.reg.Snapshot().Get(gid).LoadRevision
	h.waitFor(t, "the good worker Ready and fed", func(s *registry.Snapshot) bool {
		w := s.Get(gid)
		return w.Ready() && w.LoadRevision > rev && w.Liveness == smgv1.Veto_VETO_UNSPECIFIED
	})
	if n := len(h.reg.Snapshot().Workers()); n != 1 {
		t.Fatalf("%d workers, want the good one alone", n)
	}
}

// TestGRPCReceiveLimitFlag: --grpc-engine-max-message-mib sets the control
// plane's receive limit: a 2 MiB answer fails the registration under a
// 1 MiB limit (it fits the 16 MiB default), with a message naming the
// worker, counted in smg_grpc_engine_oversized_messages_total. Values out
// of range are refused naming the flag.
func TestGRPCReceiveLimitFlag(t *testing.T) {
	url := enginegrpctest.Serve(t, &enginegrpctest.Servicer{BigModel: true})

	opts := fastOptions()
	opts.GRPCEngineMaxMessageMiB = 1
	h := startCP(t, opts)
	if r := h.do(t, http.MethodPost, "/workers", fmt.Sprintf(`{"url":%q}`, url)); r.status != http.StatusAccepted {
		t.Fatalf("POST = %d %s", r.status, r.body)
	}
	job := h.waitJob(t, admin.WorkerID(url))
	if job.State != "failed" || !strings.Contains(job.Message, url) || !strings.Contains(job.Message, "larger than max") {
		t.Fatalf("job %+v", job)
	}
	if n := counter(t, h, "smg_grpc_engine_oversized_messages_total"); n != 1 {
		t.Fatalf("smg_grpc_engine_oversized_messages_total = %v, want 1", n)
	}
	if !strings.Contains(h.logs.String(), "gRPC worker sent a message over the receive limit") {
		t.Fatal("the oversized message was not logged")
	}

	for _, mib := range []int{0, -1, 1025} {
		o := controlplane.DefaultOptions()
		o.GRPCEngineMaxMessageMiB = mib
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "--grpc-engine-max-message-mib") {
			t.Errorf("%d MiB: %v", mib, err)
		}
	}
}

// counter reads a counter without labels from the control plane's registry.
func counter(t *testing.T, h *harness, name string) float64 {
	t.Helper()
	mfs, err := h.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no counter %s", name)
	return 0
}

// TestGRPCKVStreamHandOver: a gRPC worker has exactly one KV event stream
// at steady state. With no agent on its node the control plane's monitor
// streams it; once the node's agent is assigned the worker, the agent's
// stream is the only one (the monitor's is handed over, with no registry
// change but the agent's); when the agent leaves, the monitor streams it
// again, and the pushed records keep coming.
func TestGRPCKVStreamHandOver(t *testing.T) {
	s := startSim(t, func(o *sim.Options) {
		grpcSim(sim.FlavorVLLM, 1)(o)
		o.KVHeartbeat = 100 * time.Millisecond
	})
	h := startCP(t, fastOptions())
	id := h.register(t, fmt.Sprintf(`{"url":%q,"node":"n1"}`, s.GRPCURL()))
	streams := func(monitor, engine int) func() (bool, string) {
		return func() (bool, string) {
			m, e := h.cp.Monitor.KVStreams(), s.KVStreams()
			return m == monitor && e == engine, fmt.Sprintf("monitor streams %d, engine serves %d", m, e)
		}
	}
	testutil.WaitFor(t, 10*time.Second, "the monitor's stream, alone", streams(1, 1))
	pushedAt := func() time.Time { return h.reg.Snapshot().Get(id).Evidence.PushedAt }
	before := pushedAt()
	testutil.WaitFor(t, 10*time.Second, "a record pushed on the monitor's stream", func() (bool, string) {
		return pushedAt().After(before), "none"
	})

	opts := agent.DefaultOptions()
	opts.ControlPlane, opts.Node, opts.PollInterval = h.addr, "n1", 100*time.Millisecond
	stop := runAgent(t, opts)
	testutil.WaitFor(t, 10*time.Second, "the agent feeding the worker", func() (bool, string) {
		n := h.reg.Snapshot().Get(id).AgentNode
		return n == "n1", "agent node " + n
	})
	testutil.WaitFor(t, 10*time.Second, "the agent's stream, alone", streams(0, 1))

	stop()
	testutil.WaitFor(t, 10*time.Second, "the monitor's stream again, alone", streams(1, 1))
	before = pushedAt()
	testutil.WaitFor(t, 10*time.Second, "records pushed on the monitor's stream again", func() (bool, string) {
		w := h.reg.Snapshot().Get(id)
		return w.AgentNode == "" && w.Evidence.PushedAt.After(before), "agent node " + w.AgentNode
	})
}

// runAgent runs an agent until stop is called or the test ends.
func runAgent(t *testing.T, opts agent.Options) (stop func()) {
	t.Helper()
	a, err := agent.New(opts, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	stop = sync.OnceFunc(func() { cancel(); <-done })
	t.Cleanup(stop)
	return stop
}

// TestGRPCWorkerAbsurdLoads: a servicer whose KV event batches and
// GetLoads answers carry absurd loads (rank 2^31-1, negative counts, NaN
// usage, infinite throughput, a negative silence) has every pushed record
// dropped and logged and every poll taken as no report: the worker is
// neither overloaded nor vetoed and no absurd load is stored, and its
// neighbour is fed as usual.
func TestGRPCWorkerAbsurdLoads(t *testing.T) {
	bad := startSim(t, func(o *sim.Options) {
		grpcSim(sim.FlavorVLLM, 1)(o)
		o.KVHeartbeat = 100 * time.Millisecond
	})
	good := startSim(t, grpcSim(sim.FlavorVLLM, 1))
	h := startCP(t, fastOptions())
	bid := h.register(t, fmt.Sprintf(`{"url":%q}`, bad.GRPCURL()))
	gid := h.register(t, fmt.Sprintf(`{"url":%q}`, good.GRPCURL()))
	h.waitFor(t, "a pushed record", func(s *registry.Snapshot) bool { return !s.Get(bid).Evidence.PushedAt.IsZero() })
	if err := bad.SetFault(sim.Fault{GarbageMetrics: true}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "absurd records dropped and logged", func() (bool, string) {
		return strings.Contains(h.logs.String(), "KV event batch with a load record that cannot be believed; dropped"), "not logged"
	})
	rev := h.reg.Snapshot().Get(gid).LoadRevision
	h.waitFor(t, "the neighbour fed after the fault", func(s *registry.Snapshot) bool { return s.Get(gid).LoadRevision > rev })
	w := h.reg.Snapshot().Get(bid)
	if w.Overloaded || w.Liveness != smgv1.Veto_VETO_UNSPECIFIED || !w.Ready() {
		t.Fatalf("worker with absurd loads: overloaded %v liveness %v ready %v", w.Overloaded, w.Liveness, w.Ready())
	}
	for _, r := range w.Load.GetRanks() {
		if r.GetDpRank() >= enginegrpc.MaxRanks || r.GetWaitingRequests() < 0 || r.GetTokenUsage() != r.GetTokenUsage() {
			t.Fatalf("an absurd load was stored: %v", w.Load)
		}
	}
}
