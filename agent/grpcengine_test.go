package agent

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"

	"github.com/smg-project/smg/controlplane/registry"
	commonpb "github.com/smg-project/smg/gen/smg/grpc/common"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/enginegrpc"
	"github.com/smg-project/smg/internal/enginegrpc/enginegrpctest"
	"github.com/smg-project/smg/internal/testutil"
	"github.com/smg-project/smg/sim"
)

// TestGRPCEngineCoveredByTheAgent: the agent streams a gRPC engine's KV
// events and pushes their load records (the control plane holds the worker
// to the push cadence); killing the engine fails its channels, which the
// control plane turns into an unreachable veto.
func TestGRPCEngineCoveredByTheAgent(t *testing.T) {
	cp := startControlPlane(t, cpConfig{})
	o := sim.DefaultOptions()
	o.Flavor, o.GRPC, o.ITL, o.KVHeartbeat = sim.FlavorSGLang, true, time.Millisecond, 100*time.Millisecond
	eng, err := sim.Start("127.0.0.1:0", o, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	cp.put(t, "w1", eng.GRPCURL(), "n1")
	runAgent(t, fastOpts(cp.addr))
	cp.waitFor(t, "a pushed gRPC load record", func(s *registry.Snapshot) bool {
		w := s.Get("w1")
		return w.AgentNode == "n1" && w.Load.GetSource() == "grpc_sglang" && !w.Evidence.PushedAt.IsZero()
	})
	if err := eng.SetFault(sim.Fault{Kill: true}); err != nil {
		t.Fatal(err)
	}
	cp.waitFor(t, "unreachable after the engine's channels failed", func(s *registry.Snapshot) bool {
		return s.Get("w1").Liveness == smgv1.Veto_VETO_UNREACHABLE
	})
}

// TestGRPCEngineOnTheCommandLine: a gRPC engine given with --engine-urls
// (not assigned by the control plane) is covered as an assigned one is: its
// KV events stream and their load records reach the control plane.
func TestGRPCEngineOnTheCommandLine(t *testing.T) {
	cp := startControlPlane(t, cpConfig{})
	o := sim.DefaultOptions()
	o.Flavor, o.GRPC, o.ITL, o.KVHeartbeat = sim.FlavorVLLM, true, time.Millisecond, 100*time.Millisecond
	eng, err := sim.Start("127.0.0.1:0", o, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	cp.put(t, "w1", eng.GRPCURL(), "")
	flags := DefaultOptions() // as smg agent --engine-urls grpc://... checks them
	flags.Node, flags.ControlPlane, flags.EngineURLs = "n1", cp.addr, []string{eng.GRPCURL()}
	if err := flags.Validate(); err != nil {
		t.Fatal(err)
	}
	runAgent(t, fastOpts(cp.addr, eng.GRPCURL()))
	cp.waitFor(t, "a pushed gRPC load record", func(s *registry.Snapshot) bool {
		w := s.Get("w1")
		return w.AgentNode == "n1" && w.Load.GetSource() == "grpc_vllm" && !w.Evidence.PushedAt.IsZero()
	})
}

// TestGRPCEngineAbsurdLoadsDropped: an engine whose KV event batches carry
// absurd loads (rank 2^31-1, negative counts, NaN usage) has them dropped
// and counted; the control plane never receives one, and the engine is not
// overloaded by them.
func TestGRPCEngineAbsurdLoadsDropped(t *testing.T) {
	cp := startControlPlane(t, cpConfig{})
	o := sim.DefaultOptions()
	o.Flavor, o.GRPC, o.ITL, o.KVHeartbeat = sim.FlavorVLLM, true, time.Millisecond, 20*time.Millisecond
	eng, err := sim.Start("127.0.0.1:0", o, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	cp.put(t, "w1", eng.GRPCURL(), "n1")
	a := runAgent(t, fastOpts(cp.addr))
	cp.waitFor(t, "a pushed gRPC load record", func(s *registry.Snapshot) bool { return s.Get("w1").AgentNode == "n1" })
	if err := eng.SetFault(sim.Fault{GarbageMetrics: true}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "absurd records counted", func() (bool, string) {
		n := promtest.ToFloat64(a.m.badPushes)
		return n >= 3, fmt.Sprintf("%v dropped", n)
	})
	w := cp.reg.Snapshot().Get("w1")
	for _, r := range w.Load.GetRanks() {
		if r.GetDpRank() >= enginegrpc.MaxRanks || r.GetWaitingRequests() < 0 {
			t.Fatalf("an absurd load reached the control plane: %v", w.Load)
		}
	}
	if w.Overloaded {
		t.Fatal("overloaded by an absurd load")
	}
}

// TestGRPCEngineOversizedKVBatch: a KV event batch over
// --grpc-engine-max-message-mib ends the agent's stream (reopened with
// backoff) and is counted in smg_grpc_engine_oversized_messages_total.
func TestGRPCEngineOversizedKVBatch(t *testing.T) {
	cp := startControlPlane(t, cpConfig{})
	big := &commonpb.KvEventBatch{Events: []*commonpb.KvCacheEvent{{Data: &commonpb.KvCacheEvent_Removed{
		Removed: &commonpb.KvBlocksRemoved{BlockHashes: make([]int64, 400_000)}}}}}
	for i := range big.Events[0].GetRemoved().BlockHashes {
		big.Events[0].GetRemoved().BlockHashes[i] = int64(i) << 20 // 3-6 bytes each: about 2 MiB
	}
	url := enginegrpctest.Serve(t, &enginegrpctest.Servicer{KVEvents: func(st grpc.ServerStreamingServer[commonpb.KvEventBatch]) error {
		return st.Send(big)
	}})
	cp.put(t, "w1", url, "n1")
	opts := fastOpts(cp.addr)
	opts.GRPCEngineMaxMessageMiB = 1
	reg := prometheus.NewRegistry()
	runAgentWith(t, opts, reg)
	testutil.WaitFor(t, 10*time.Second, "oversized batches counted", func() (bool, string) {
		n, err := promtest.GatherAndCount(reg, "smg_grpc_engine_oversized_messages_total")
		if err != nil || n != 1 {
			return false, fmt.Sprintf("%d series, %v", n, err)
		}
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() == "smg_grpc_engine_oversized_messages_total" {
				v := mf.GetMetric()[0].GetCounter().GetValue()
				return v >= 2, fmt.Sprintf("%v counted", v) // the stream was reopened and refused again
			}
		}
		return false, "no counter"
	})
}
