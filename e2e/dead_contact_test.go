package e2e

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestKilledEngineStaysOut: an engine killed with SIGKILL under load
// (vLLM-flavor sims, an agent polling every 50 ms, one router, the stall
// bound 0) is vetoed as unreachable and stays out while it is dead: the
// answers that reached the router just before the kill, reported to the
// control plane after the agent's failure, are older than the failure and
// re-admit nothing.
func TestKilledEngineStaysOut(t *testing.T) {
	simArgs := []string{"sim", "--count", "1", "--port", "0", "--flavor", "vllm", "--log-level", "warn",
		"--max-running-requests", "4", "--itl-ms", "10"}
	fixed := startSMG(t, "sim-fixed", simArgs...).lines(1, 20*time.Second)[0]
	victim := startSMG(t, "sim-victim", simArgs...)
	dead := victim.lines(1, 20*time.Second)[0]
	engines := []string{fixed, dead}
	cp := newControlPlane(t, engines, "--load-monitor-interval", "1", "--health-success-threshold", "1",
		"--worker-stall-secs", "0", "--log-level", "debug")
	startSMG(t, "agent", append(argsf("agent --controlplane 127.0.0.1:%d --node n1 --poll-interval 50ms --port %d --engine-urls",
		cp.grpcPort, freePort(t)), engines...)...)
	t.Cleanup(func() { logLiveness(t, cp) })
	cp.admin.waitReady(t, engines...)
	router := startRouter(t, "r1", cp.grpcPort, "--policy", "round_robin")
	cp.admin.waitRoutersApplied(t, 1)
	load := startClosedLoop(t, router, 8)
	defer load.end()
	waitFor(t, 20*time.Second, "answers through both engines", func() (bool, string) {
		n := load.ok.Load()
		return n >= 40, strconv.FormatInt(n, 10) + " answered"
	})
	victim.kill()
	killedAt := time.Now()
	if _, w := cp.admin.awaitLiveness(t, dead, "unreachable", 5*time.Second); w.Verdict.Liveness != "unreachable" {
		t.Fatalf("killed engine not vetoed: %+v", w)
	}
	vetoedAt := time.Since(killedAt)
	// Dead from here on: sample its verdict for 3 s.
	for time.Since(killedAt) < vetoedAt+3*time.Second {
		w, detail := cp.admin.worker(dead)
		if w.Verdict.Liveness != "unreachable" {
			t.Fatalf("dead engine re-admitted %s after the kill (vetoed at %s): %s",
				time.Since(killedAt).Round(time.Millisecond), vetoedAt.Round(time.Millisecond), detail)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("vetoed %s after the kill and held out for 3 s", vetoedAt.Round(time.Millisecond))
}

func logLiveness(t *testing.T, cp *controlPlane) {
	for _, line := range strings.Split(cp.proc.Log(), "\n") {
		if strings.Contains(line, "liveness") || strings.Contains(line, "transport failure") {
			t.Log(line)
		}
	}
}
