package e2e

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// One engine with a small KV cache (20,000 tokens, a running window of 16)
// behind a router with --worker-token-budget: a closed loop of six clients
// sending 6,000-token prompts would fill the KV three times over, and a
// stream of short requests runs beside it. The router admits the long
// prompts by the tokens they will hold (three at a time), so the engine
// never queues a request for KV nor preempts one, the short requests keep
// flowing past the long ones that wait, and a request larger than the whole
// KV is a 400 before it reaches the engine.
func TestTokenBudgetAdmitsLongPromptsByTokens(t *testing.T) {
	if testing.Short() {
		t.Skip("an 8 s load run")
	}
	sims := startSims(t, 1, "--flavor", "sglang", "--max-running-requests", "16", "--kv-capacity-tokens", "20000",
		"--itl-ms", "10", "--prefill-tokens-per-sec", "40000")
	engine := sims[0]
	cp := newControlPlane(t, sims, "--load-monitor-interval", "1", "--health-success-threshold", "1", "--worker-token-budget")
	cp.admin.waitReady(t, engine)
	router := startRouter(t, "r0", cp.grpcPort, "--worker-token-budget", "--worker-admission-wait-secs", "30")
	waitFor(t, 20*time.Second, "the engine's 20,000 KV tokens as the router's budget", func() (bool, string) {
		ws, err := cp.admin.workers()
		if err != nil {
			return false, err.Error()
		}
		a := ws[engine].Admission
		return a != nil && a.TokenBudget == 20000 && a.TokenSource == "engine" && a.TokenShares["r0"] == 20000, fmt.Sprintf("admission %+v", a)
	})
	cp.admin.waitRoutersApplied(t, 1)

	huge := streamTimed(router, strings.Repeat("word ", 20000), 16, 10*time.Second) // about 25,000 tokens
	if huge.status != http.StatusBadRequest || huge.header.Get("X-SMG-Error-Code") != "context_length_exceeded" ||
		!strings.Contains(string(huge.body), "20000 tokens at most") {
		t.Fatalf("a prompt over the whole KV: %d %v %s, want 400 context_length_exceeded", huge.status, huge.header, huge.body)
	}
	getSimStats(t, engine, true)

	long := strings.Repeat("word ", 4800) // 24,000 characters: about 6,000 tokens
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var longOK atomic.Int64
	longErrs := make(chan string, 64)
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				a := streamTimed(router, long, 32, 60*time.Second)
				if err := a.completeStream(); err != nil {
					select {
					case longErrs <- err.Error():
					default:
					}
					continue
				}
				longOK.Add(1)
			}
		}()
	}
	time.Sleep(time.Second) // the long prompts fill the budget
	const n = 60
	shorts := make([]timedAnswer, n)
	var sw sync.WaitGroup
	for i := range n {
		sw.Add(1)
		go func() {
			defer sw.Done()
			shorts[i] = streamTimed(router, "hello there", 8, 30*time.Second)
		}()
		time.Sleep(100 * time.Millisecond)
	}
	sw.Wait()
	close(stop)
	wg.Wait()
	close(longErrs)
	for e := range longErrs {
		t.Errorf("long request: %s", e)
	}

	var ttft []time.Duration
	for i, a := range shorts {
		if err := a.completeStream(); err != nil {
			t.Errorf("short %d: %v", i, err)
			continue
		}
		ttft = append(ttft, a.ttft)
	}
	slices.Sort(ttft)
	st := getSimStats(t, engine, false)
	t.Logf("long: %d answered; short: %d answered, TTFT p50 %v p90 %v max %v; engine peak running %d, peak waiting %d, preemptions %d",
		longOK.Load(), len(ttft), pick(ttft, 0.5), pick(ttft, 0.9), pick(ttft, 1), st.PeakRunning, st.PeakWaiting, st.Preemptions)
	if longOK.Load() < 6 {
		t.Errorf("only %d long requests answered", longOK.Load())
	}
	if st.PeakWaiting > 1 || st.Preemptions > 0 {
		t.Errorf("engine peak waiting %d, preemptions %d: the budget let the KV overflow", st.PeakWaiting, st.Preemptions)
	}
	// A short request mostly waits behind nothing: its TTFT is a prefill
	// step or two beside the long prompts, not a long prompt's turn.
	if p50 := pick(ttft, 0.5); p50 > 500*time.Millisecond {
		t.Errorf("short TTFT p50 %v: the short requests did not flow past the long ones", p50)
	}
}

// pick is the q-quantile of sorted durations (0: none).
func pick(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[min(len(d)-1, int(q*float64(len(d))))]
}

// A vLLM engine tells its KV capacity only as labels of
// vllm:cache_config_info (num_gpu_blocks × block_size): the control plane
// reads it off /metrics and gives the worker that budget.
func TestTokenBudgetFromVLLMCacheConfig(t *testing.T) {
	sims := startSims(t, 1, "--flavor", "vllm", "--kv-capacity-tokens", "20008") // 1250 blocks of 16, rounded down
	engine := sims[0]
	cp := newControlPlane(t, sims, "--load-monitor-interval", "1", "--health-success-threshold", "1", "--worker-token-budget")
	cp.admin.waitReady(t, engine)
	waitFor(t, 20*time.Second, "1250 blocks of 16 tokens as the worker's budget", func() (bool, string) {
		ws, err := cp.admin.workers()
		if err != nil {
			return false, err.Error()
		}
		a := ws[engine].Admission
		return a != nil && a.TokenBudget == 20000 && a.TokenSource == "engine", fmt.Sprintf("admission %+v", a)
	})
}

// A gRPC engine tells its KV capacity in GetLoads (max_total_num_tokens per
// rank): the control plane polls it and gives the worker that budget,
// summed over its two DP ranks.
func TestTokenBudgetFromGRPCGetLoads(t *testing.T) {
	fields := strings.Fields(startSims(t, 1, "--grpc-port", "0", "--dp-size", "2", "--kv-capacity-tokens", "12000")[0])
	if len(fields) != 2 || !strings.HasPrefix(fields[1], "grpc://") {
		t.Fatalf("sim line %q has no gRPC URL", fields)
	}
	engine := fields[1]
	cp := newControlPlane(t, []string{engine}, "--load-monitor-interval", "1", "--health-success-threshold", "1", "--worker-token-budget")
	cp.admin.waitReady(t, engine)
	waitFor(t, 20*time.Second, "two ranks of 12,000 KV tokens as the gRPC worker's budget", func() (bool, string) {
		ws, err := cp.admin.workers()
		if err != nil {
			return false, err.Error()
		}
		a := ws[engine].Admission
		return a != nil && a.TokenBudget == 24000 && a.TokenSource == "engine", fmt.Sprintf("admission %+v", a)
	})
}
