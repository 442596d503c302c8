package suite

import (
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
