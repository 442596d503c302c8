package router

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestRouterCPUPerTokenGRPCvsHTTP measures the router's CPU per streamed
// output token when it proxies an HTTP engine and when it serves a gRPC one
// (template, tokenizer, Generate, detokenizer, SSE), side by side. One
// simulated engine, in its own process, serves both protocols; the router
// and the client run in this process, whose CPU time (getrusage) is read
// per run. The client's own share is measured by runs straight to the
// engine's HTTP surface (the client reads the same SSE bytes either way)
// and subtracted. Runs alternate. Set SMG_BIN to an smg binary to run it:
//
//	go build -o bin/smg ./cmd/smg && SMG_BIN=$PWD/bin/smg go test -run TestRouterCPUPerTokenGRPCvsHTTP -v -count=1 ./router/
func TestRouterCPUPerTokenGRPCvsHTTP(t *testing.T) {
	bin := os.Getenv("SMG_BIN")
	if bin == "" {
		t.Skip("SMG_BIN is not set: a figure, not a check")
	}
	httpPort, grpcPort := freePort(t), freePort(t)
	sim := exec.Command(bin, "sim", "--port", strconv.Itoa(httpPort), "--grpc-port", strconv.Itoa(grpcPort),
		"--model", testModel, "--itl-ms", "0.5", "--prefill-tokens-per-sec", "10000000", "--max-running-requests", "256",
		"--eos-probability", "0", "--log-level", "warn")
	sim.Stderr = os.Stderr
	if err := sim.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Process.Kill(); _ = sim.Wait() })
	httpURL := "http://127.0.0.1:" + strconv.Itoa(httpPort)
	grpcURL := "grpc://127.0.0.1:" + strconv.Itoa(grpcPort)
	pollFor(t, "the engine to listen", func() bool {
		resp, err := http.Get(httpURL + "/health")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})

	const (
		clients   = 16
		maxTokens = 64
		runFor    = 5 * time.Second
		rounds    = 3
	)
	body := `{"model":"` + testModel + `","stream":true,"max_tokens":` + strconv.Itoa(maxTokens) +
		`,"messages":[{"role":"user","content":"Say hello in a few words, please"}]}`
	routers := map[string]string{}
	for mode, url := range map[string]string{"http": httpURL, "grpc": grpcURL} {
		h := newHarness(t, func(o *Options) { o.MaxIdleConnsPerWorker = 64 })
		h.apply(Worker{ID: mode, URL: url, Model: testModel, Healthy: true})
		routers[mode] = h.srv.URL
	}
	routers["direct"] = httpURL
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	run := func(base string, d time.Duration) (cpu time.Duration, tokens int64) {
		var wg sync.WaitGroup
		var n atomic.Int64
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		before := cpuTime()
		for range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
					resp, err := client.Do(req)
					if err != nil {
						t.Error(err)
						return
					}
					sc := bufio.NewScanner(resp.Body)
					got := int64(0)
					for sc.Scan() {
						if strings.Contains(sc.Text(), `"delta":{"content":"`) && !strings.Contains(sc.Text(), `"content":""`) {
							got++
						}
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if got != maxTokens {
						t.Errorf("%s: %d tokens, want %d", base, got, maxTokens)
						return
					}
					n.Add(got)
				}
			}()
		}
		wg.Wait()
		return cpuTime() - before, n.Load()
	}
	for _, mode := range []string{"direct", "http", "grpc"} {
		run(routers[mode], time.Second) // warm-up: connections, the tokenizer
	}
	perToken := map[string][]float64{}
	for round := range rounds {
		order := []string{"direct", "http", "grpc"}
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, mode := range order {
			cpu, tokens := run(routers[mode], runFor)
			perToken[mode] = append(perToken[mode], float64(cpu.Microseconds())/float64(max(tokens, 1)))
			t.Logf("round %d %-6s %7d tokens  %6.2f µs CPU/token (router + client)", round, mode, tokens, perToken[mode][len(perToken[mode])-1])
		}
	}
	router := func(mode string) []float64 {
		out := make([]float64, rounds)
		for i := range out {
			out[i] = perToken[mode][i] - perToken["direct"][i]
		}
		return out
	}
	h, g := router("http"), router("grpc")
	ratios := make([]float64, rounds)
	for i := range ratios {
		ratios[i] = g[i] / h[i]
	}
	t.Logf("router CPU per output token: HTTP %s µs, gRPC %s µs; gRPC/HTTP %s (median %.2f); load average %s",
		fmtAll(h), fmtAll(g), fmtAll(ratios), medianOf(ratios), loadAverage())
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func fmtAll(v []float64) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprintf("%.2f", x)
	}
	return strings.Join(s, ", ")
}

func medianOf(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func loadAverage() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
