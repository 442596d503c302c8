package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// heldLoads is the part of a router's GET /loads the hold test reads.
type heldLoads struct {
	Epoch   string `json:"epoch"`
	Workers []struct {
		URL     string `json:"url"`
		Model   string `json:"model"`
		Healthy bool   `json:"healthy"`
		Held    bool   `json:"held"`
	} `json:"workers"`
}

// timedOutcome is one request of the hold test.
type timedOutcome struct {
	outcome
	model string
	start time.Time
}

// The measured failure, without --data-dir: two routers under steady
// load, an in-memory control plane killed with SIGKILL and restarted 2 s
// later. Before the fix the routers took the restarted control plane's empty,
// then half-built snapshot as the truth (48 of 508 requests failed: 404
// model_not_found, then 503 no_available_workers). Now its snapshots say it
// is warming up (for --worker-stale-secs) and the routers keep the workers
// they had until it lists them healthy again:
//   - the agent-fed engine comes back (the agent re-registers it) and its
//     model never fails;
//   - the admin-registered engine cannot come back (nothing kept it): its
//     model is served from the held copy until the warm-up ends, then answers
//     404 model_not_found. --data-dir (or three replicas) is the answer.
//
// With the warm-up off (--worker-stale-secs 0) the same restart fails
// requests for the agent's model too: the test's own baseline, which proves it
// can fail.
func TestInMemoryRestartHoldsTheFleet(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("restarts a control plane under load for about 15 s")
	}
	for _, tc := range []struct {
		name    string
		warmUp  time.Duration
		baseErr bool // the baseline: no warm-up, errors expected
	}{{"warm-up 8s", 8 * time.Second, false}, {"no warm-up (baseline)", 0, true}} {
		t.Run(tc.name, func(t *testing.T) { restartHold(t, tc.warmUp, tc.baseErr) })
	}
}

func restartHold(t *testing.T, warmUp time.Duration, baseline bool) {
	agentSim := startSims(t, 1, "--itl-ms", "5", "--model", "agent-model")[0]
	adminSim := startSims(t, 1, "--itl-ms", "5", "--model", "admin-model")[0]
	cp := newControlPlane(t, nil, "--load-monitor-interval", "1", "--agent-models", "agent-model",
		"--worker-stale-secs", strconv.Itoa(int(warmUp/time.Second)))
	startSMG(t, "agent", "agent", "--port", "0", "--controlplane", fmt.Sprintf("127.0.0.1:%d", cp.grpcPort),
		"--node", "n1", "--poll-interval", "200ms", "--register", "--engine-urls", agentSim)
	if code, b, err := cp.admin.do(http.MethodPost, "/workers", []byte(`{"url":"`+adminSim+`"}`)); err != nil || code != http.StatusAccepted {
		t.Fatalf("register %s: %d %s %v", adminSim, code, b, err)
	}
	routers := map[string]string{}
	for i := range 2 {
		id := fmt.Sprintf("hold-router-%d", i)
		routers[id] = startRouter(t, id, cp.grpcPort, "--load-monitor-interval", "1")
	}
	bases := []string{routers["hold-router-0"], routers["hold-router-1"]}
	cp.admin.waitReady(t, agentSim, adminSim)
	waitConverged(t, cp.admin, routers)
	before, err := getRouterLoads(bases[0])
	if err != nil {
		t.Fatal(err)
	}

	var (
		mu      sync.Mutex
		results []timedOutcome
	)
	stop := untilStopped(6, func(w, i int) {
		m := "agent-model"
		if w%3 == 2 {
			m = "admin-model"
		}
		stream := (w+i)%2 == 1
		start := time.Now()
		o := classify(chatModel(bases[(w+i)%2], m, 8, stream, 30*time.Second), stream)
		mu.Lock()
		results = append(results, timedOutcome{o, m, start})
		mu.Unlock()
		time.Sleep(50 * time.Millisecond) // pacing: about 10 requests/s per router, as measured in the issue
	})
	time.Sleep(2 * time.Second) // steady load before the kill (pacing)
	cp.proc.kill()
	time.Sleep(2 * time.Second) // the outage
	restarting := time.Now()
	cp.start(t)

	// The routers reach the new epoch. While it warms up they hold the
	// admin-registered engine it does not have.
	var sawHeld bool
	waitFor(t, 10*time.Second, "router on the new epoch", func() (bool, string) {
		var l heldLoads
		if err := getJSON(bases[0]+"/loads", &l); err != nil || l.Epoch == before.Epoch || l.Epoch == "" {
			return false, fmt.Sprint(l.Epoch, err)
		}
		for _, w := range l.Workers {
			sawHeld = sawHeld || (w.URL == adminSim && w.Held && w.Healthy)
		}
		return true, ""
	})
	if !baseline && !sawHeld {
		t.Error("router on the warming epoch does not hold the admin-registered engine")
	}
	cp.admin.waitReady(t, agentSim)
	// Past the warm-up, and 2 s more of load.
	time.Sleep(time.Until(restarting.Add(warmUp + 2*time.Second)))
	stop()

	counts := map[string]map[string]int{"agent-model": {}, "admin-model": {}}
	var early []string // admin-model failures before the warm-up could have ended
	for _, r := range results {
		key := "full"
		switch {
		case r.full:
		case r.code != "":
			key = r.code
		default:
			key = "lost: " + r.problem
		}
		counts[r.model][key]++
		if r.model == "admin-model" && !r.full && r.start.Before(restarting.Add(warmUp)) {
			early = append(early, fmt.Sprintf("%s at +%s", key, r.start.Sub(restarting).Round(time.Millisecond)))
		}
	}
	t.Logf("agent-fed model: %v; admin-registered model: %v", counts["agent-model"], counts["admin-model"])
	agentFailed := len(results) > 0 && len(counts["agent-model"]) > 1
	if baseline {
		// What the issue measured: the restarted control plane's snapshot
		// is taken as the truth at once.
		if len(counts["agent-model"])+len(counts["admin-model"]) == 2 {
			t.Errorf("without a warm-up the restart failed nothing: the baseline no longer shows the defect the test guards against")
		}
		return
	}
	if agentFailed {
		t.Errorf("requests for the agent-fed model failed across the restart: %v", counts["agent-model"])
	}
	if len(early) > 0 {
		t.Errorf("admin-registered model failed during the warm-up: %s", strings.Join(early, ", "))
	}
	for code, n := range counts["admin-model"] {
		if code != "full" && code != "model_not_found" {
			t.Errorf("admin-registered model: %d x %q, want full answers, then model_not_found once the warm-up is over", n, code)
		}
	}
	// Without --data-dir the admin-registered engine is gone for good once
	// the warm-up is over: documented (docs/ha.md), the answer is --data-dir.
	if a := chatModel(bases[0], "admin-model", 8, false, 10*time.Second); a.errorCode() != "model_not_found" {
		t.Errorf("after the warm-up the admin-registered model answers %d %s; want 404 model_not_found (it was never re-registered)", a.status, a.body)
	}
	waitConverged(t, cp.admin, routers)
}

// getJSON decodes the 200 answer of GET url into v.
func getJSON(url string, v any) error {
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %d", url, resp.StatusCode)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// untilStopped runs each(w, i) in n goroutines (w the goroutine, i its
// iteration) until stop is called; stop waits for the calls in flight.
func untilStopped(n int, each func(w, i int)) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for w := range n {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				each(w, i)
			}
		})
	}
	return func() { close(done); wg.Wait() }
}
