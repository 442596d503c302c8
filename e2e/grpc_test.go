package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	sglangpb "github.com/smg-project/smg/gen/sglang/grpc/scheduler"
	vllmpb "github.com/smg-project/smg/gen/vllm/grpc/engine"
)

// Liveness settings of the gRPC runs: the stall and wedge bounds shortened,
// the stale bound above the 1 s poll interval as the spec asks.
const (
	grpcStall = 1 * time.Second // --worker-stall-secs
	grpcWedge = 2 * time.Second // --worker-wedge-secs
	grpcStale = 3 * time.Second // --worker-stale-secs
	// grpcSlack is the tolerance on a loaded, shared machine.
	grpcSlack = 3 * time.Second
)

// grpcCPArgs are the control plane's flags of the gRPC runs: 1 s polls, and
// a health checker that never demotes a worker within a test (liveness, not
// the health checker, must exclude it).
func grpcCPArgs() []string {
	return argsf("--load-monitor-interval 1 --health-success-threshold 1 --health-failure-threshold 1000 "+
		"--worker-stall-secs %d --worker-wedge-secs %d --worker-stale-secs %d",
		int(grpcStall/time.Second), int(grpcWedge/time.Second), int(grpcStale/time.Second))
}

// grpcSims is one `smg sim --grpc-port 0` process with a control port.
type grpcSims struct {
	http, grpc []string // engine i's URLs
	ctl        string   // the control listener: faults reach killed and resetting engines
	p          *proc
}

func startGRPCSims(t *testing.T, name string, count int, extra ...string) *grpcSims {
	t.Helper()
	ctl := freePort(t)
	args := append([]string{"sim", "--count", strconv.Itoa(count), "--port", "0", "--grpc-port", "0",
		"--control-port", strconv.Itoa(ctl), "--itl-ms", "5", "--kv-heartbeat-ms", "200", "--log-level", "warn"}, extra...)
	p := startSMG(t, name, args...)
	s := &grpcSims{ctl: fmt.Sprintf("http://127.0.0.1:%d", ctl), p: p}
	for _, l := range p.lines(count, 20*time.Second) {
		f := strings.Fields(l)
		if len(f) != 2 || !strings.HasPrefix(f[1], "grpc://") {
			t.Fatalf("sim line %q: want an HTTP and a gRPC URL", l)
		}
		s.http, s.grpc = append(s.http, f[0]), append(s.grpc, f[1])
	}
	return s
}

func (s *grpcSims) fault(t *testing.T, engine int, body string) {
	t.Helper()
	simFault(t, s.ctl, engine, body)
}

// kvStats reads an engine's open KV event streams and the GetLoads calls
// it received.
func kvStats(t *testing.T, httpURL string) (kvStreams int, getLoads int64) {
	t.Helper()
	st := getSimStats(t, httpURL, false)
	return st.KVStreams, st.GetLoads
}

// worker reads url's entry of GET /workers.
func (a admin) worker(url string) (workerView, string) {
	ws, err := a.workers()
	if err != nil {
		return workerView{}, err.Error()
	}
	w, ok := ws[url]
	if !ok {
		return w, url + " not registered"
	}
	return w, fmt.Sprintf("%s: liveness %q (%s), agent node %q", url, w.Verdict.Liveness, w.Verdict.LivenessReason, w.AgentNode)
}

// awaitLiveness waits until url's liveness verdict is want ("": none) and
// returns how long that took and the worker.
func (a admin) awaitLiveness(t *testing.T, url, want string, within time.Duration) (time.Duration, workerView) {
	t.Helper()
	t0 := time.Now()
	var w workerView
	waitFor(t, within, fmt.Sprintf("liveness %q", want), func() (bool, string) {
		var detail string
		w, detail = a.worker(url)
		return w.Verdict.Liveness == want, detail
	})
	return time.Since(t0), w
}

// holdLive checks that url carries no liveness veto for hold, failing at
// the first one; cond, when set, must hold by the end too.
func (a admin) holdLive(t *testing.T, url string, hold time.Duration, cond func() (bool, string)) {
	t.Helper()
	t0 := time.Now()
	waitFor(t, hold+10*time.Second, fmt.Sprintf("%s of no liveness veto", hold), func() (bool, string) {
		w, detail := a.worker(url)
		if w.Verdict.Liveness != "" {
			t.Fatalf("vetoed %s after the fault: %s", time.Since(t0).Round(time.Millisecond), detail)
		}
		if time.Since(t0) < hold {
			return false, detail
		}
		if cond != nil {
			return cond()
		}
		return true, ""
	})
}

// generate opens a streaming Generate on a gRPC engine of the flavor
// ("vllm" or "sglang"), read until the test ends, and waits until the
// engine holds it (its HTTP side's stats).
func generate(t *testing.T, flavor, grpcURL, httpURL string) {
	t.Helper()
	conn, err := grpc.NewClient(strings.TrimPrefix(grpcURL, "grpc://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); conn.Close() })
	max := uint32(10000) // within the cache: ~50 s of output at 5 ms a step
	ids := []uint32{3, 4, 5}
	var recv func() error
	if flavor == "sglang" {
		st, err := sglangpb.NewSglangSchedulerClient(conn).Generate(ctx, &sglangpb.GenerateRequest{Stream: true,
			SamplingParams: &sglangpb.SamplingParams{MaxNewTokens: &max}, Tokenized: &sglangpb.TokenizedInput{InputIds: ids}})
		if err != nil {
			t.Fatalf("Generate on %s: %v", grpcURL, err)
		}
		recv = func() error { _, err := st.Recv(); return err }
	} else {
		st, err := vllmpb.NewVllmEngineClient(conn).Generate(ctx, &vllmpb.GenerateRequest{Stream: true,
			SamplingParams: &vllmpb.SamplingParams{MaxTokens: &max},
			Input:          &vllmpb.GenerateRequest_Tokenized{Tokenized: &vllmpb.TokenizedInput{InputIds: ids}}})
		if err != nil {
			t.Fatalf("Generate on %s: %v", grpcURL, err)
		}
		recv = func() error { _, err := st.Recv(); return err }
	}
	go func() {
		for recv() == nil {
		}
	}()
	waitFor(t, 10*time.Second, "the engine holding the request", func() (bool, string) {
		st := getSimStats(t, httpURL, false)
		return st.Waiting+st.Running > 0, fmt.Sprintf("%+v", st)
	})
}

// End to end with real binaries, a gRPC worker no agent covers (the control
// plane's load monitor streams its KV events and polls it): the spec's
// rules on gRPC workers and every fault of docs/sim.md over gRPC.
func TestGRPCWorkerLivenessEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("injects faults into real processes for about a minute")
	}
	const (
		eStall, eKill, eReset, eFreeze, eSlow = 0, 1, 2, 3, 4
	)
	sims := startGRPCSims(t, "sim-grpc", 5)
	older := startGRPCSims(t, "sim-grpc-older", 1, "--grpc-extensions", "load")
	solo := startGRPCSims(t, "sim-grpc-solo", 1)
	sg := startGRPCSims(t, "sim-grpc-sglang", 1, "--flavor", "sglang")
	urls := append(append(append(append([]string{}, sims.grpc...), older.grpc...), solo.grpc...), sg.grpc...)
	cp := newControlPlane(t, urls, grpcCPArgs()...)
	cp.admin.waitReady(t, urls...)
	// Every worker pushes: its load comes from its KV event stream.
	for _, u := range urls {
		waitFor(t, 20*time.Second, u+" fed over gRPC", func() (bool, string) {
			w, detail := cp.admin.worker(u)
			return w.EngineLoad != nil && strings.HasPrefix(w.EngineLoad.Source, "grpc_"), detail
		})
	}

	t.Run("pushing_ranks_skip_the_poll_and_the_poll_takes_over", func(t *testing.T) {
		u, h := sims.grpc[eStall], sims.http[eStall]
		waitFor(t, 10*time.Second, "one KV event stream", func() (bool, string) {
			n, _ := kvStats(t, h)
			return n == 1, fmt.Sprintf("%d streams", n)
		})
		// Heartbeats every 200 ms keep every rank within the 1 s interval:
		// over 4 ticks, the poll is skipped (one poll in flight at the start
		// is allowed).
		_, polls0 := kvStats(t, h)
		cp.admin.holdLive(t, u, 4*time.Second, nil)
		if _, polls := kvStats(t, h); polls > polls0+1 {
			t.Fatalf("%d GetLoads calls in 4 s while the stream pushed records, want at most 1", polls-polls0)
		}
		// The stream stalls: the poll takes over, and its answers keep the
		// worker from going stale (the stale bound is past the interval).
		sims.fault(t, eStall, `{"stall_kv_events":true}`)
		_, polls1 := kvStats(t, h)
		cp.admin.holdLive(t, u, grpcStale+2*time.Second, func() (bool, string) {
			_, polls := kvStats(t, h)
			return polls >= polls1+3, fmt.Sprintf("%d GetLoads calls since the stall", polls-polls1)
		})
		sims.fault(t, eStall, `{"clear":true}`)
	})

	// A connection failure on the poll or the KV event stream arms
	// unreachable once nothing is heard for the stall bound.
	for _, c := range []struct {
		name   string
		engine int
		fault  string
	}{{"kill_arms_unreachable", eKill, `{"kill":true}`}, {"reset_arms_unreachable", eReset, `{"reset":true}`}} {
		t.Run(c.name, func(t *testing.T) {
			u := sims.grpc[c.engine]
			sims.fault(t, c.engine, c.fault)
			took, w := cp.admin.awaitLiveness(t, u, "unreachable", grpcStall+grpcSlack+5*time.Second)
			t.Logf("%s: unreachable after %s (%s)", c.fault, took.Round(time.Millisecond), w.Verdict.LivenessReason)
			sims.fault(t, c.engine, `{"clear":true}`)
			took, _ = cp.admin.awaitLiveness(t, u, "", 10*time.Second)
			t.Logf("cleared: re-admitted after %s", took.Round(time.Millisecond))
		})
	}

	t.Run("freeze_is_wedged_by_the_servicers_silence", func(t *testing.T) {
		u := sims.grpc[eFreeze]
		sims.fault(t, eFreeze, `{"freeze":true}`)
		generate(t, "vllm", u, sims.http[eFreeze])
		took, w := cp.admin.awaitLiveness(t, u, "wedged", grpcWedge+grpcSlack)
		t.Logf("frozen with a stream in hand: wedged after %s (%s)", took.Round(time.Millisecond), w.Verdict.LivenessReason)
		sims.fault(t, eFreeze, `{"clear":true}`)
		took, _ = cp.admin.awaitLiveness(t, u, "", 10*time.Second)
		t.Logf("unfrozen: re-admitted after %s", took.Round(time.Millisecond))
	})

	t.Run("older_servicer_without_the_figure_stays_quiet", func(t *testing.T) {
		u := older.grpc[0]
		older.fault(t, 0, `{"freeze":true}`)
		generate(t, "vllm", u, older.http[0])
		// Its records still come (not stale), without a silence figure:
		// frozen past the wedge bound, it is not wedged.
		cp.admin.holdLive(t, u, grpcWedge+grpcSlack, nil)
		older.fault(t, 0, `{"clear":true}`)
	})

	// SGLang's wire carries token batches only: its silence figure may be
	// a long prefill's, so it passes no verdict before a prefill rate is
	// measured on the worker (no router has measured one here).
	t.Run("token_batch_wire_no_verdict_before_a_rate", func(t *testing.T) {
		u := sg.grpc[0]
		sg.fault(t, 0, `{"freeze":true}`)
		generate(t, "sglang", u, sg.http[0])
		cp.admin.holdLive(t, u, grpcWedge+grpcSlack, nil)
		sg.fault(t, 0, `{"clear":true}`)
	})

	t.Run("slow_streams_on", func(t *testing.T) {
		u := sims.grpc[eSlow]
		sims.fault(t, eSlow, `{"slow":20}`)
		generate(t, "vllm", u, sims.http[eSlow])
		cp.admin.holdLive(t, u, grpcWedge+grpcSlack, nil)
		sims.fault(t, eSlow, `{"clear":true}`)
	})

	t.Run("pushed_records_go_silent_stale", func(t *testing.T) {
		u := solo.grpc[0]
		lvSignal(t, solo.p, syscall.SIGSTOP)
		took, w := cp.admin.awaitLiveness(t, u, "unreachable", grpcStale+grpcSlack)
		if took < grpcStale-time.Second {
			t.Errorf("unreachable %s after the engine stopped, before the stale bound %s: %s", took, grpcStale, w.Verdict.LivenessReason)
		}
		t.Logf("stopped: unreachable after %s (%s)", took.Round(time.Millisecond), w.Verdict.LivenessReason)
		lvSignal(t, solo.p, syscall.SIGCONT)
		took, _ = cp.admin.awaitLiveness(t, u, "", 10*time.Second)
		t.Logf("continued: re-admitted after %s", took.Round(time.Millisecond))
	})
}

// End to end with real binaries, a gRPC worker on an agent's node: the
// agent streams and polls it, the control plane's monitor keeps no stream
// of its own (one stream per engine), a stalled stream hands the worker to
// the agent's poll, a killed engine is unreachable, and when the agent
// goes the monitor streams the worker again.
func TestGRPCWorkerCoveredByAnAgentEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real processes for about half a minute")
	}
	sims := startGRPCSims(t, "sim-grpc", 1)
	u, h := sims.grpc[0], sims.http[0]
	cp := newControlPlane(t, nil, grpcCPArgs()...)
	body := fmt.Sprintf(`{"url":%q,"node":"n1"}`, u)
	if code, b, err := cp.admin.do(http.MethodPost, "/workers", []byte(body)); err != nil || code != http.StatusAccepted {
		t.Fatalf("POST /workers: %d %s %v", code, b, err)
	}
	cp.admin.waitReady(t, u)
	streams := func(want int) func() (bool, string) {
		return func() (bool, string) {
			n, _ := kvStats(t, h)
			return n == want, fmt.Sprintf("%d KV event streams", n)
		}
	}
	waitFor(t, 10*time.Second, "the monitor's stream", streams(1))

	agent := startSMG(t, "agent", argsf("agent --controlplane 127.0.0.1:%d --node n1 --poll-interval 250ms --port %d", cp.grpcPort, freePort(t))...)
	waitFor(t, 10*time.Second, "the agent feeding the worker", func() (bool, string) {
		w, detail := cp.admin.worker(u)
		return w.AgentNode == "n1", detail
	})
	waitFor(t, 10*time.Second, "one stream: the agent's", streams(1))

	// The agent's stream stalls: its poll takes over and keeps the worker live.
	sims.fault(t, 0, `{"stall_kv_events":true}`)
	_, polls0 := kvStats(t, h)
	cp.admin.holdLive(t, u, grpcStale+2*time.Second, func() (bool, string) {
		_, polls := kvStats(t, h)
		return polls >= polls0+4, fmt.Sprintf("%d GetLoads calls since the stall", polls-polls0)
	})
	if n, _ := kvStats(t, h); n != 1 {
		t.Fatalf("%d KV event streams with an agent covering the engine, want 1 (the agent's)", n)
	}
	sims.fault(t, 0, `{"clear":true}`)

	sims.fault(t, 0, `{"kill":true}`)
	took, w := cp.admin.awaitLiveness(t, u, "unreachable", grpcStall+grpcSlack+5*time.Second)
	t.Logf("killed: unreachable after %s (%s)", took.Round(time.Millisecond), w.Verdict.LivenessReason)
	sims.fault(t, 0, `{"clear":true}`)
	cp.admin.awaitLiveness(t, u, "", 10*time.Second)
	waitFor(t, 15*time.Second, "the agent's stream again", streams(1))

	// The agent goes: the monitor takes the stream back.
	agent.kill()
	waitFor(t, 10*time.Second, "the worker back with the control plane", func() (bool, string) {
		w, detail := cp.admin.worker(u)
		return w.AgentNode == "", detail
	})
	waitFor(t, 10*time.Second, "the monitor's stream again", streams(1))
	cp.admin.holdLive(t, u, grpcStale+time.Second, nil)
}
