package scale

import (
	"os"
	"testing"
	"time"
)

// TestMain lets the test binary double as the harness's child processes.
func TestMain(m *testing.M) {
	MaybeChild()
	os.Exit(m.Run())
}

// TestScaleShort is the harness's CI mode: small N and R, every process
// real (a control plane here, agents and routers in children over loopback
// gRPC). It asserts shapes, never timings: every flip reaches every router,
// reports flow, a joining router gets the whole fleet, and the watch server
// marshals fewer messages than it sends.
func TestScaleShort(t *testing.T) {
	cfg := Config{Name: "short", Workers: 200, Agents: 4, AgentProcs: 1, ReportRate: 5,
		Routers: 20, RouterProcs: 2, FlipRate: 10, Joins: 2, Warmup: 2 * time.Second, Duration: 3 * time.Second}
	if testing.Verbose() {
		cfg.Log = os.Stderr
	}
	res, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Errors) > 0 {
		t.Fatalf("errors: %v", res.Errors)
	}
	t.Logf("%+v", res)
	if res.Reports == 0 || res.AllocsPerReport <= 0 {
		t.Errorf("reports %d, allocations per report %.1f: want reports counted", res.Reports, res.AllocsPerReport)
	}
	if res.Flips == 0 || res.Delivered != res.Flips {
		t.Errorf("flips committed %d, delivered to all %d routers %d: want every flip delivered", res.Flips, cfg.Routers, res.Delivered)
	}
	if res.VerdictSentAll.N != res.Delivered {
		t.Errorf("control plane's side of the fan-out timed for %d of %d flips delivered", res.VerdictSentAll.N, res.Delivered)
	}
	if res.ReportToVerdict.N != res.Flips || res.VerdictToRouters.N != res.Delivered {
		t.Errorf("latency samples %d and %d for %d flips", res.ReportToVerdict.N, res.VerdictToRouters.N, res.Flips)
	}
	if res.Join.N != cfg.Joins || res.SnapshotKiB <= 0 {
		t.Errorf("joins timed %d of %d, snapshot %.1f KiB", res.Join.N, cfg.Joins, res.SnapshotKiB)
	}
	if res.CPUCores <= 0 || res.HeapMiB <= 0 || res.Revisions == 0 {
		t.Errorf("cpu %.3f cores, heap %.1f MiB, revisions %d: want all measured", res.CPUCores, res.HeapMiB, res.Revisions)
	}
	if res.AgentCPUCores <= 0 || res.RouterCPUCores <= 0 || res.ReportsDuePerSec <= 0 {
		t.Errorf("agents %.3f cores, routers %.3f cores, %.0f records due a second: want the clients measured", res.AgentCPUCores, res.RouterCPUCores, res.ReportsDuePerSec)
	}
	if res.Encoded <= 0 || res.Encoded >= res.Sent/2 {
		t.Errorf("watch messages encoded %.0f for %.0f sent to %d routers: want each encoded once for many", res.Encoded, res.Sent, cfg.Routers)
	}
}
