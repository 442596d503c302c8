package scale

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
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
		Routers: 20, RouterProcs: 2, FlipRate: 10, Joins: 2, Warmup: 2 * time.Second, Duration: 3 * time.Second,
		Trace: filepath.Join(t.TempDir(), "cp.trace")}
	res := runShort(t, cfg)
	// The window's runtime trace, with each flip's commit marked in it.
	if tr, err := os.ReadFile(cfg.Trace); err != nil || !bytes.HasPrefix(tr, []byte("go 1.")) || !bytes.Contains(tr, []byte(" committed ")) {
		t.Errorf("trace %s: %d bytes, %v: want a runtime trace with the flips' commits marked", cfg.Trace, len(tr), err)
	}
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
	if res.Join.N != cfg.Joins || res.JoinAlone.N != cfg.Joins || res.SnapshotKiB <= 0 {
		t.Errorf("joins timed %d and alone %d of %d, snapshot %.1f KiB", res.Join.N, res.JoinAlone.N, cfg.Joins, res.SnapshotKiB)
	}
	// Every join split in its steps, each stamped in order (the wire's
	// step crosses processes: the joiner may read before the control
	// plane's Send has returned).
	for _, ph := range []JoinPhases{res.JoinPhases, res.JoinAlonePhases} {
		for name, q := range map[string]Quantiles{"connect": ph.Connect, "control plane": ph.CP, "wire": ph.Wire, "transfer": ph.Transfer, "decode": ph.Decode} {
			if q.N != cfg.Joins || (name != "wire" && q.P50 < 0) {
				t.Errorf("join phase %s: %+v: want %d samples, none negative", name, q, cfg.Joins)
			}
		}
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
	// The quiet window: the same fleet without flips, so fewer revisions
	// and messages than the window, CPU measured.
	if res.QuietCPUCores <= 0 || res.QuietRouterCPUCores <= 0 || res.QuietRevisions >= res.Revisions || res.QuietSent >= res.Sent {
		t.Errorf("quiet window: cpu %.3f cores, routers %.3f cores, %d revisions of %d, %.0f messages of %.0f: want measured, fewer than the window's",
			res.QuietCPUCores, res.QuietRouterCPUCores, res.QuietRevisions, res.Revisions, res.QuietSent, res.Sent)
	}
	if res.Marginal.WritesPerSent <= 0 {
		t.Errorf("marginal write system calls per message %.2f: want counted", res.Marginal.WritesPerSent)
	}
}

// TestFloorShort runs the floor (a bare gRPC server sending one pre-encoded
// delta per change to every router) in CI: every change reaches every router,
// each is encoded once and sent once to each router, nothing changes in the
// quiet window, and the costs are measured.
func TestFloorShort(t *testing.T) {
	for _, oneWriter := range []bool{false, true} {
		t.Run(fmt.Sprintf("one writer %v", oneWriter), func(t *testing.T) {
			testFloorShort(t, oneWriter)
		})
	}
}

func testFloorShort(t *testing.T, oneWriter bool) {
	cfg := Config{Name: "floor-short", Floor: true, FloorOneWriter: oneWriter, Workers: 200, Agents: 1, AgentProcs: 1,
		Routers: 20, RouterProcs: 2, FlipRate: 10, Warmup: 2 * time.Second, Duration: 3 * time.Second}
	res := runShort(t, cfg)
	if res.Flips == 0 || res.Delivered != res.Flips || res.VerdictToRouters.N != res.Flips || res.VerdictSentAll.N != res.Flips {
		t.Errorf("changes %d, delivered to all %d routers %d, timed %d and %d: want every change delivered and timed",
			res.Flips, cfg.Routers, res.Delivered, res.VerdictToRouters.N, res.VerdictSentAll.N)
	}
	if res.Encoded != float64(res.Revisions) {
		t.Errorf("encoded %.0f for %d changes: want each once", res.Encoded, res.Revisions)
	}
	// Each change of the window goes once to each router; a change made
	// just before the window may be sent in it, one at its end after it.
	if lo, hi := float64(cfg.Routers)*float64(res.Revisions-1), float64(cfg.Routers)*float64(res.Revisions+1); res.Sent < lo || res.Sent > hi {
		t.Errorf("sent %.0f for %d changes to %d routers: want within [%.0f, %.0f]", res.Sent, res.Revisions, cfg.Routers, lo, hi)
	}
	// None in the quiet window but one made as it began (the change and the
	// sample at the window's edge race).
	if res.QuietRevisions > 1 || res.QuietSent > float64(cfg.Routers) {
		t.Errorf("quiet window: %d changes, %.0f messages: want none (one at its edge)", res.QuietRevisions, res.QuietSent)
	}
	if res.CPUCores <= 0 || res.QuietCPUCores <= 0 || res.RouterCPUCores <= 0 || res.CPUPerRouterChangeUs <= 0 || res.Marginal.WritesPerSent <= 0 {
		t.Errorf("cpu %.3f cores (quiet %.3f), routers %.3f cores, %.1f µs per router per change, %.2f writes per message: want all measured",
			res.CPUCores, res.QuietCPUCores, res.RouterCPUCores, res.CPUPerRouterChangeUs, res.Marginal.WritesPerSent)
	}
}

// runShort runs cfg, failing the test on an error.
func runShort(t *testing.T, cfg Config) *Result {
	t.Helper()
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
	return res
}
