package e2e

import (
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"
)

// SIGTERM drains a router: streams in flight that finish within
// --shutdown-grace-secs end whole, the rest end with an explicit
// router_shutting_down error, and none is dropped without an answer.
func TestRouterDrainsOnSIGTERM(t *testing.T) {
	sims := startSims(t, 1, "--itl-ms", "20", "--max-running-requests", "16")
	cp := newControlPlane(t, sims, "--load-monitor-interval", "1", "--health-success-threshold", "1")
	cp.admin.waitReady(t, sims...)
	const grace = 3
	port := freePort(t)
	r := startSMG(t, "router", argsf("router --port %d --controlplane 127.0.0.1:%d --router-id drain --shutdown-grace-secs %d",
		port, cp.grpcPort, grace)...)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	waitHTTP200(t, r, base+"/readyz")

	// Short streams (~1 s) finish inside the grace; long ones (~10 s) do not.
	type result struct {
		long bool
		a    answer
	}
	results := make(chan result, 6)
	var wg sync.WaitGroup
	for i := range 6 {
		long := i%3 == 0
		tokens := 50
		if long {
			tokens = 500
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			results <- result{long: long, a: chat(base, tokens, true, 30*time.Second)}
		}()
	}
	waitFor(t, 10*time.Second, "six streams running on the engine", func() (bool, string) {
		page, err := scrape(sims[0] + "/metrics")
		if err != nil {
			return false, err.Error()
		}
		n := metricSum(page, "vllm:num_requests_running")
		return n >= 6, fmt.Sprintf("running %v", n)
	})
	sent := time.Now()
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(results)
	select {
	case <-r.exited:
	case <-time.After(grace*time.Second + 5*time.Second):
		t.Fatal("the router did not exit after its shutdown grace")
	}
	if took := time.Since(sent); took > grace*time.Second+5*time.Second {
		t.Fatalf("drain took %s, want about the %d s grace", took, grace)
	}
	for res := range results {
		switch {
		case !res.long:
			if err := res.a.completeStream(); err != nil {
				t.Errorf("a stream that fits in the grace did not finish whole: %v", err)
			}
		case res.a.errorCode() != "router_shutting_down":
			t.Errorf("a stream cut after the grace ended without the explicit error (status %d, err %v): %q",
				res.a.status, res.a.err, tail(string(res.a.body), 300))
		}
	}
}
