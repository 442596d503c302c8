package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"
)

// simStats is a simulated engine's GET /sim/stats.
type simStats struct {
	Waiting     int   `json:"waiting"`
	Running     int   `json:"running"`
	PeakWaiting int   `json:"peak_waiting"`
	PeakRunning int   `json:"peak_running"`
	KVStreams   int   `json:"kv_streams"`     // gRPC SubscribeKvEvents streams open
	GetLoads    int64 `json:"grpc_get_loads"` // gRPC GetLoads calls received
	Preemptions int64 `json:"preemptions"`    // running requests evicted for KV since start
}

func getSimStats(t *testing.T, url string, reset bool) simStats {
	t.Helper()
	q := ""
	if reset {
		q = "?reset=1"
	}
	resp, err := client.Get(url + "/sim/stats" + q)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var s simStats
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// A control plane, three routers and one engine with a running window of 4,
// under --worker-admission-window: a burst of 40 spread over the routers
// never has the engine running more than 4 nor queueing any (the allowance is
// 0), and every request ends in a whole answer or the explicit shed answer.
func TestAdmissionWindowHeldAcrossThreeRouters(t *testing.T) {
	sims := startSims(t, 1, "--flavor", "sglang", "--max-running-requests", "4", "--itl-ms", "10")
	engine := sims[0]
	cp := newControlPlane(t, sims, "--load-monitor-interval", "1", "--health-success-threshold", "1",
		"--worker-admission-window", "--worker-admission-queue", "0")
	cp.admin.waitReady(t, engine)
	var routers []string
	for i := range 3 {
		// One router waits only 1s, so that sheds can happen and their
		// answer is checked; the others wait the default 30s.
		wait := "30"
		if i == 2 {
			wait = "1"
		}
		routers = append(routers, startRouter(t, fmt.Sprintf("r%d", i), cp.grpcPort,
			"--worker-admission-window", "--worker-admission-wait-secs", wait, "--policy", "round_robin"))
	}
	waitFor(t, 20*time.Second, "the engine's window of 4 split over 3 routers", func() (bool, string) {
		ws, err := cp.admin.workers()
		if err != nil {
			return false, err.Error()
		}
		a := ws[engine].Admission
		if a == nil || a.Window != 4 || a.Source != "engine" || len(a.Shares) != 3 {
			return false, fmt.Sprintf("admission %+v", a)
		}
		var sum u64
		for _, s := range a.Shares {
			sum += s
		}
		return sum == 4, fmt.Sprintf("shares %v", a.Shares)
	})
	cp.admin.waitRoutersApplied(t, 3)
	getSimStats(t, engine, true)

	const n = 40
	answers := make([]answer, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i] = chat(routers[i%3], 30, i%2 == 1, 60*time.Second)
		}()
	}
	wg.Wait()

	st := getSimStats(t, engine, false)
	if st.PeakRunning > 4 || st.PeakWaiting > 0 {
		t.Errorf("engine peaks: running %d (window 4), waiting %d (allowance 0)", st.PeakRunning, st.PeakWaiting)
	}
	if st.PeakRunning == 0 {
		t.Error("the engine ran nothing")
	}
	ok, shed := 0, 0
	for i, a := range answers {
		if a.status == http.StatusServiceUnavailable {
			shed++
			// Retry-After is the control plane's --load-monitor-interval (1 s),
			// which routers take over the watch stream.
			want := fmt.Sprintf(`{"error":{"type":"server_error","code":"worker_overload_protection_shed","message":"All workers for model '%s' are overloaded","param":null}}`, model)
			if string(a.body) != want || a.header.Get("Retry-After") != "1" ||
				a.header.Get("X-SMG-Error-Code") != "worker_overload_protection_shed" || a.header.Get("Content-Type") != "application/json" {
				t.Errorf("request %d: 503 %v %s, want the spec's shed answer", i, a.header, a.body)
			}
			continue
		}
		err := a.completeJSON()
		if i%2 == 1 {
			err = a.completeStream()
		}
		if err != nil {
			t.Errorf("request %d: %v", i, err)
		}
		ok++
	}
	t.Logf("%d whole answers, %d shed; engine peak running %d, peak waiting %d", ok, shed, st.PeakRunning, st.PeakWaiting)
	if ok < n/2 {
		t.Errorf("only %d of %d answered: the routers waiting 30s must serve theirs", ok, n)
	}
}
