package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// spillCounter sums smg_router_spillover_total (or _refused_total) over a
// router's /metrics.
func spillCounter(t *testing.T, base, name string) float64 {
	t.Helper()
	resp, err := client.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		b.WriteString(string(buf[:n]))
		if err != nil {
			break
		}
	}
	sum := 0.0
	re := regexp.MustCompile(`(?m)^` + name + `\{[^}]*\} (\S+)$`)
	for _, m := range re.FindAllStringSubmatch(b.String(), -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		sum += v
	}
	return sum
}

// Spill-over at 2x capacity with real binaries: a control plane, two
// routers with --spill-over and running windows, two engines with a window
// of 4, and a fake provider with a fleet budget of 4 requests/s that the
// control plane splits between the routers. The engines never run more than
// their window; the excess is served by the provider up to the budget
// (fleet-wide, not per router); the rest gets the spec's shed answer; every
// request ends in a whole answer or that answer.
func TestSpillOverAtTwiceCapacity(t *testing.T) {
	t.Parallel()
	const key, budget, duration = "sk-spill-e2e-4b1d", 4.0, 5 * time.Second
	locals := startSims(t, 2, "--flavor", "sglang", "--max-running-requests", "4", "--itl-ms", "20", "--default-max-tokens", "40")
	psim := startSMG(t, "provider", "sim", "--port", "0", "--model", "gpt-provider", "--api-key", key,
		"--itl-ms", "20", "--log-level", "warn")
	provider := psim.lines(1, 20*time.Second)[0]
	cp := newControlPlane(t, locals, "--load-monitor-interval", "1", "--health-success-threshold", "1",
		"--worker-admission-window", "--worker-admission-queue", "0", "--provider-allow-insecure-loopback")
	cp.admin.waitReady(t, locals...)
	body := fmt.Sprintf(`{"url":%q,"model_id":%q,"provider":{"model":"gpt-provider","api_key_ref":"file:%s","spill_requests_per_sec":%g}}`,
		provider+"/v1", model, e2eKeyFile(t, key), budget)
	if code, resp, err := cp.admin.do(http.MethodPost, "/workers", []byte(body)); err != nil || code != http.StatusAccepted {
		t.Fatalf("POST provider = %d %s %v", code, resp, err)
	}
	var routers []string
	for i := range 2 {
		routers = append(routers, startRouter(t, fmt.Sprintf("r%d", i), cp.grpcPort, "--spill-over",
			"--worker-admission-window", "--worker-admission-wait-secs", "0", "--policy", "round_robin"))
	}
	waitFor(t, 20*time.Second, "the spill budget split between two routers and the windows shared", func() (bool, string) {
		_, b, err := cp.admin.do(http.MethodGet, "/workers", nil)
		if err != nil {
			return false, err.Error()
		}
		var list struct {
			Workers []struct {
				Kind        string         `json:"kind"`
				SpillShares map[string]u64 `json:"spill_shares"`
				Admission   *struct {
					Shares map[string]u64 `json:"shares"`
				} `json:"admission"`
			} `json:"workers"`
		}
		if err := json.Unmarshal(b, &list); err != nil {
			return false, err.Error()
		}
		for _, w := range list.Workers {
			if w.Kind == "external" && (len(w.SpillShares) != 2 || w.SpillShares["r0"] != 500000) {
				return false, fmt.Sprintf("spill shares %v", w.SpillShares)
			}
			if w.Kind == "engine" && (w.Admission == nil || len(w.Admission.Shares) != 2) {
				return false, "engine windows not shared yet"
			}
		}
		return len(list.Workers) == 3, string(b)
	})
	cp.admin.waitRoutersApplied(t, 2)
	for _, u := range locals {
		getSimStats(t, u, true)
	}

	// 2x: an engine request lasts about 40 x 20 ms, so the two windows of 4
	// serve about 10 requests/s; 20 requests/s are offered, open loop.
	const rate = 20
	n := int(rate * duration.Seconds())
	answers := make([]answer, n)
	var wg sync.WaitGroup
	began := time.Now()
	for i := range n {
		time.Sleep(time.Until(began.Add(time.Duration(i) * time.Second / rate)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i] = chat(routers[i%2], 40, i%2 == 1, 60*time.Second)
		}()
	}
	wg.Wait()
	offered := time.Since(began).Seconds()

	for _, u := range locals {
		if st := getSimStats(t, u, false); st.PeakRunning > 4 || st.PeakWaiting > 0 {
			t.Errorf("engine %s peaks: running %d (window 4), waiting %d (allowance 0)", u, st.PeakRunning, st.PeakWaiting)
		}
	}
	ok, shed := 0, 0
	for i, a := range answers {
		if a.status == http.StatusServiceUnavailable {
			shed++
			if a.header.Get("X-SMG-Error-Code") != "worker_overload_protection_shed" || a.header.Get("Retry-After") == "" {
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
	spilled := spillCounter(t, routers[0], "smg_router_spillover_total") + spillCounter(t, routers[1], "smg_router_spillover_total")
	refused := spillCounter(t, routers[0], "smg_router_spillover_refused_total") + spillCounter(t, routers[1], "smg_router_spillover_refused_total")
	// Each router's bucket starts full at its part of the rate (2): the
	// fleet may spill the budget over the run plus those two bursts.
	most := budget*offered + budget
	t.Logf("%d requests in %.1f s: %d answered (%v by the provider), %d shed; %v refused spill-over", n, offered, ok, spilled, shed, refused)
	if spilled > most+1 || spilled < budget*offered/2 {
		t.Errorf("spilled %v in %.1f s, want about %v/s fleet-wide (at most %.0f)", spilled, offered, budget, most)
	}
	if shed == 0 || refused == 0 {
		t.Errorf("at 2x with the budget spent, nothing was shed (%d) or refused spill-over (%v)", shed, refused)
	}
	if st := getSimStats(t, provider, false); st.PeakRunning == 0 {
		t.Error("the provider ran nothing")
	}
}
