package suite

import (
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestParseWrk(t *testing.T) {
	out := `Running 10s test @ http://127.0.0.1:1/v1/chat/completions
  1 threads and 32 connections
  41906 requests in 10.05s, 17.81MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 4
Requests/sec:   4168.01
`
	run, err := parseWrk(out, 2500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if run.Requests != 41906 || run.Seconds != 10.05 || run.Errors != 7 || run.CPUSeconds != 2.5 {
		t.Fatalf("parsed %+v", run)
	}
	if got := run.CPUPerRequest(); got < 59.6 || got > 59.7 {
		t.Fatalf("CPU per request %.2f µs, want 59.66", got)
	}
	if _, err := parseWrk("unable to connect to 127.0.0.1:1 Connection refused", 0); err == nil {
		t.Fatal("no request count parsed without an error")
	}
	if _, err := parseWrk("  0 requests in 1.00s, 0B read", 0); err == nil {
		t.Fatal("a run without requests parsed without an error")
	}
}

func TestParseStat(t *testing.T) {
	// The command may hold spaces and parentheses.
	line := []byte("4242 (nginx: worker (x)) S 4200 4200 4200 0 -1 4194624 120 0 0 0 250 75 0 0 20 0 1 0 100 0 0")
	pg, cpu, ok := parseStat(line)
	if !ok || pg != 4200 || cpu != 3250*time.Millisecond {
		t.Fatalf("parseStat = %d, %s, %v; want 4200, 3.25s, true", pg, cpu, ok)
	}
	if _, _, ok := parseStat([]byte("4242 (short) S 1")); ok {
		t.Fatal("a truncated stat line parsed")
	}
}

func TestProxyRatiosPairRuns(t *testing.T) {
	rep := &ProxyReport{Options: ProxyOptions{Pairs: 2}, Runs: []ProxyRun{
		{Proxy: "nginx", Mode: "chat", Pair: 0, Requests: 1000, Seconds: 1, CPUSeconds: 0.05},
		{Proxy: "smg", Mode: "chat", Pair: 0, Requests: 500, Seconds: 1, CPUSeconds: 0.05},
		{Proxy: "smg", Mode: "chat", Pair: 1, Requests: 1000, Seconds: 1, CPUSeconds: 0.1},
		{Proxy: "nginx", Mode: "chat", Pair: 1, Requests: 1000, Seconds: 1, CPUSeconds: 0.1, Errors: 3},
	}}
	rs := rep.Ratios()
	if len(rs) != 1 {
		t.Fatalf("%d modes, want 1 (no stream runs)", len(rs))
	}
	r := rs[0]
	// Pair 0: CPU/request 100 against 50 µs (2x), req/s 0.5x; pair 1: 1x, 1x.
	if r.Pairs != 2 || r.CPURatioMin != 1 || r.CPURatioMax != 2 || r.CPURatio != 1.5 || r.RPSRatio != 0.75 || r.Errors != 3 {
		t.Fatalf("ratios %+v", r)
	}
}

func TestProxyPlacementNeedsTwoCPUs(t *testing.T) {
	_, err := proxyPlacement(PlacementOwnCPU, []int{0})
	if err == nil || !strings.Contains(err.Error(), "needs 2 CPUs") || !strings.Contains(err.Error(), "--proxy-placements shared") {
		t.Fatalf("own-cpu on 1 CPU: %v, want an error naming the 2 CPUs it needs and the shared placement", err)
	}
	if pl, err := proxyPlacement(PlacementShared, []int{0}); err != nil || pl.proxyPin != nil || pl.restPin != nil || pl.nginxWorkers != 2 {
		t.Fatalf("shared on 1 CPU: %+v, %v", pl, err)
	}
	if _, err := proxyPlacement("elsewhere", []int{0, 1}); err == nil {
		t.Fatal("an unknown placement was accepted")
	}
	if _, err := exec.LookPath("taskset"); err != nil {
		t.Skip("no taskset")
	}
	pl, err := proxyPlacement(PlacementOwnCPU, []int{2, 5, 7})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(pl.proxyPin, " ") != "taskset -c 5" || strings.Join(pl.restPin, " ") != "taskset -c 2" || pl.nginxWorkers != 1 {
		t.Fatalf("own-cpu on CPUs 2, 5, 7: %+v; want the proxy on 5, the rest on 2, one nginx worker", pl)
	}
}

func TestParseCPUStat(t *testing.T) {
	before := parseCPUStat("cpu  10 0 10 80 0 0 0 0 0 0\ncpu0 10 0 0 40 0 0 0 0 0 0\ncpu1 0 0 10 40 0 0 0 0 0 0\nintr 5\n")
	after := parseCPUStat("cpu  100 0 10 170 0 0 0 0 0 0\ncpu0 100 0 0 40 0 0 0 0 0 0\ncpu1 0 0 10 120 10 0 0 0 0 0\n")
	busy := cpuBusy(before, after)
	// CPU 0 busy all 90 ticks; CPU 1 idle or waiting all 90.
	if len(busy) != 2 || busy[0] != 1 || busy[1] != 0 {
		t.Fatalf("busy %v, want [1 0]", busy)
	}
}

func TestBoundBy(t *testing.T) {
	for _, c := range []struct {
		placement           string
		u                   ProxyUse
		restBusy, proxyBusy float64
		want                string
	}{
		{PlacementShared, ProxyUse{ProxyCores: 1.2, RestCores: 0.8}, 1, 1, "the shared cores"},
		{PlacementOwnCPU, ProxyUse{ProxyCores: 0.97, RestCores: 0.95}, 1, 1, "the proxy's CPU"},
		{PlacementOwnCPU, ProxyUse{ProxyCores: 0.6, RestCores: 0.96}, 1, 0.6, "the engines' CPU"},
		{PlacementOwnCPU, ProxyUse{ProxyCores: 0.2, RestCores: 0.4, ProxyPerRequest: 40, RestPerRequest: 100}, 1, 1,
			"the engines' CPU, by demand (other jobs on the CPUs)"},
		{PlacementOwnCPU, ProxyUse{ProxyCores: 0.4, RestCores: 0.4, ProxyPerRequest: 100, RestPerRequest: 90}, 0.95, 0.6,
			"the proxy's CPU, by demand (other jobs on the CPUs)"},
		{PlacementOwnCPU, ProxyUse{ProxyCores: 0.6, RestCores: 0.7}, 0.7, 0.6, "neither CPU full"},
	} {
		if got := boundBy(c.placement, c.u, c.restBusy, c.proxyBusy); got != c.want {
			t.Errorf("boundBy(%s, %+v, %.2f, %.2f) = %q, want %q", c.placement, c.u, c.restBusy, c.proxyBusy, got, c.want)
		}
	}
}
