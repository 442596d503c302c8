package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// PD burst setup: one prefill engine, one decode engine with a window of
// pdWindow, three routers, and a burst of 4x the window spread over them.
const (
	pdWindow    = 4
	pdBurst     = 4 * pdWindow
	pdMaxTokens = 25 // x 40 ms per step: about 1 s of decode per request
)

// pdFleet is the PD deployment of one run.
type pdFleet struct {
	prefill, decode string
	cpGRPC          int
	routers         []string
}

// pdStart serves a prefill and a decode engine, a control plane that
// registers them, and three PD routers with the extra flags.
func pdStart(t *testing.T, routerFlags ...string) pdFleet {
	t.Helper()
	f := pdEngines(t)
	f.startRouters(t, append([]string{"--policy", "round_robin"}, routerFlags...)...)
	return f
}

// pdEngines serves a prefill and a decode engine and a control plane that
// registers them, with no router yet.
func pdEngines(t *testing.T) pdFleet {
	t.Helper()
	// vLLM flavor on the prefill: its abort counter counts bootstrap expiries.
	prefill := pdSim(t, "prefill", "--flavor", "vllm", "--role", "prefill", "--max-running-requests", "64",
		"--bootstrap-timeout-secs", "2", "--seed", "1")
	// SGLang flavor on the decode: /v1/loads advertises the running window.
	decode := pdSim(t, "decode", "--flavor", "sglang", "--role", "decode", "--max-running-requests", fmt.Sprint(pdWindow),
		"--itl-ms", "40", "--seed", "2")
	port := prefill[strings.LastIndexByte(prefill, ':')+1:]
	cp := newControlPlane(t, nil, "--load-monitor-interval", "1", "--prefill", prefill, port, "--decode", decode)
	return pdFleet{prefill: prefill, decode: decode, cpGRPC: cp.grpcPort}
}

// startRouters starts three PD routers with the extra flags (replacing any
// before them), stopped when t ends, and waits until each sees both workers.
func (f *pdFleet) startRouters(t *testing.T, routerFlags ...string) {
	t.Helper()
	prefill, decode := f.prefill, f.decode
	f.routers = nil
	for i := range 3 {
		args := append([]string{"--pd-disaggregation", "--load-monitor-interval", "1"}, routerFlags...)
		f.routers = append(f.routers, startRouter(t, fmt.Sprintf("pd-r%d", i), f.cpGRPC, args...))
	}
	// Every router must see both workers healthy and the decode window.
	for _, base := range f.routers {
		waitFor(t, 20*time.Second, "PD workers ready on "+base, func() (bool, string) {
			var l struct {
				Workers []struct {
					URL        string `json:"url"`
					Healthy    bool   `json:"healthy"`
					MaxRunning int64  `json:"max_running"`
				} `json:"workers"`
			}
			resp, err := client.Get(base + "/loads")
			if err != nil {
				return false, err.Error()
			}
			defer resp.Body.Close()
			if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
				return false, err.Error()
			}
			ready := 0
			for _, w := range l.Workers {
				if w.Healthy && (w.URL == prefill || w.URL == decode && w.MaxRunning == pdWindow) {
					ready++
				}
			}
			return ready == 2, fmt.Sprintf("%+v", l.Workers)
		})
	}
}

// pdSim starts one simulated engine and returns its URL.
func pdSim(t *testing.T, name string, extra ...string) string {
	t.Helper()
	args := append([]string{"sim", "--count", "1", "--port", "0", "--log-level", "warn"}, extra...)
	return startSMG(t, "sim-"+name, args...).lines(1, 20*time.Second)[0]
}

// pdBurstResult is what one burst showed.
type pdBurstResult struct {
	ok, shed, failed int
	expiries         float64 // prefill requests that hit their bootstrap deadline
	maxRunning       int64   // decode engine, sampled every 10 ms
	maxWaiting       int64
	maxHeld          int64 // running + waiting: every request the decode engine holds
	elapsed          time.Duration
}

// pdRunBurst sends pdBurst requests at once, round robin over the routers,
// while sampling the decode engine's running and waiting counts.
func pdRunBurst(t *testing.T, f pdFleet) pdBurstResult {
	t.Helper()
	var res pdBurstResult
	ctx, stop := context.WithCancel(context.Background())
	var maxRunning, maxWaiting, maxHeld atomic.Int64
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for ctx.Err() == nil {
			if run, wait, err := pdDecodeLoad(f.decode); err == nil {
				maxRunning.Store(max(maxRunning.Load(), run))
				maxWaiting.Store(max(maxWaiting.Load(), wait))
				maxHeld.Store(max(maxHeld.Load(), run+wait))
			}
			time.Sleep(10 * time.Millisecond) // sampling period
		}
	}()
	var mu sync.Mutex
	var wg sync.WaitGroup
	began := time.Now()
	body := []byte(fmt.Sprintf(`{"model":"sim-model","prompt":"tell me a story","max_tokens":%d}`, pdMaxTokens))
	for i := range pdBurst {
		wg.Go(func() {
			base := f.routers[i%len(f.routers)]
			req, _ := http.NewRequest(http.MethodPost, base+"/v1/completions", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("x-smg-routing-key", fmt.Sprint("user-", i%4)) // manual pins keys
			resp, err := client.Do(req)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				res.failed++
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			switch {
			case resp.StatusCode == http.StatusOK:
				res.ok++
			case resp.Header.Get("X-SMG-Error-Code") == "worker_overload_protection_shed" && resp.Header.Get("Retry-After") != "":
				res.shed++
			default:
				res.failed++
				t.Logf("request %d: %d %s", i, resp.StatusCode, bytes.TrimSpace(b))
			}
		})
	}
	wg.Wait()
	res.elapsed = time.Since(began)
	stop()
	<-sampled
	res.maxRunning, res.maxWaiting, res.maxHeld = maxRunning.Load(), maxWaiting.Load(), maxHeld.Load()
	m, err := scrape(f.prefill + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	res.expiries = metricSum(m, "vllm:request_success_total", "finished_reason", "abort")
	return res
}

// pdDecodeLoad reads the decode engine's live running and waiting counts.
func pdDecodeLoad(url string) (running, waiting int64, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/v1/loads", nil)
	resp, err := client.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	var l struct {
		Loads []struct {
			Running int64 `json:"num_running_reqs"`
			Waiting int64 `json:"num_waiting_reqs"`
		} `json:"loads"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		return 0, 0, err
	}
	for _, r := range l.Loads {
		running += r.Running
		waiting += r.Waiting
	}
	return running, waiting, nil
}

// TestPDAdmissionWindowAcrossThreeRouters: with the fleet-wide window, a
// burst of 4x the decode window through three routers finishes with no
// bootstrap expiry and the decode engine never queues past its window, under
// every routing policy (the engines and control plane are shared; each
// policy gets three fresh routers).
func TestPDAdmissionWindowAcrossThreeRouters(t *testing.T) {
	t.Parallel()
	f := pdEngines(t)
	var expiriesBefore float64
	for _, policy := range []string{"cache_aware", "round_robin", "random", "power_of_two", "least_load",
		"consistent_hashing", "prefix_hash", "manual"} {
		t.Run(policy, func(t *testing.T) {
			f.startRouters(t, "--policy", policy)
			res := pdRunBurst(t, f)
			res.expiries -= expiriesBefore
			expiriesBefore += res.expiries
			t.Logf("shared window: ok=%d shed=%d failed=%d expiries=%v decode max running=%d max waiting=%d max held=%d in %s",
				res.ok, res.shed, res.failed, res.expiries, res.maxRunning, res.maxWaiting, res.maxHeld, res.elapsed.Round(time.Millisecond))
			if res.expiries != 0 {
				t.Errorf("prefill bootstrap expiries = %v, want 0", res.expiries)
			}
			if res.maxRunning > pdWindow {
				t.Errorf("decode running peaked at %d, above its window %d", res.maxRunning, pdWindow)
			}
			// A request may wait for the engine's next step (up to one ITL) for a
			// slot that is free; more requests than the window never reach it.
			if res.maxHeld > pdWindow {
				t.Errorf("decode engine held %d requests (running + waiting), above its window %d", res.maxHeld, pdWindow)
			}
			if res.ok != pdBurst {
				t.Errorf("%d of %d requests answered 200 (shed %d, failed %d)", res.ok, pdBurst, res.shed, res.failed)
			}
			waits := 0.0
			for _, base := range f.routers {
				m, err := scrape(base + "/metrics")
				if err != nil {
					t.Fatal(err)
				}
				waits += metricSum(m, "smg_pd_admission_waits_total")
			}
			if waits == 0 {
				t.Errorf("smg_pd_admission_waits_total = 0 over the routers: the burst never waited for a room")
			}
		})
	}
}

// TestPDPerRouterWindowBaselineExpires: each router counting the whole
// window alone (the spec's per-gateway rule) lets three routers put three
// windows in flight; the decode queue grows and prefill deadlines expire.
func TestPDPerRouterWindowBaselineExpires(t *testing.T) {
	f := pdStart(t, "--pd-window-mode", "per-router")
	res := pdRunBurst(t, f)
	t.Logf("per-router window: ok=%d shed=%d failed=%d expiries=%v decode max running=%d max waiting=%d max held=%d in %s",
		res.ok, res.shed, res.failed, res.expiries, res.maxRunning, res.maxWaiting, res.maxHeld, res.elapsed.Round(time.Millisecond))
	if res.expiries == 0 {
		t.Errorf("no bootstrap expiry with per-router counting (decode queue peaked at %d)", res.maxWaiting)
	}
	if res.maxHeld <= pdWindow {
		t.Errorf("decode engine never held more than its window with per-router counting (peak %d)", res.maxHeld)
	}
}

// docs/pd.md as a newcomer runs it: `smg launch --pd-disaggregation --prefill
// URL --decode URL` against two `smg sim` engines, no bootstrap port given.
// The control plane reads the prefill's port from /server_info
// (disaggregation_bootstrap_port), so the decode engine gets a port and the
// requests succeed, plain and streamed.
func TestLaunchPDWithoutBootstrapPortLikeTheDocs(t *testing.T) {
	prefill := pdSim(t, "prefill", "--flavor", "sglang", "--role", "prefill")
	decode := pdSim(t, "decode", "--flavor", "sglang", "--role", "decode", "--max-running-requests", "4")
	base, _ := startLaunch(t, "launch-pd", nil, "--pd-disaggregation", "--prefill", prefill, "--decode", decode)
	a := admin{base: base}
	ws := a.waitReady(t, prefill, decode)
	port := prefill[strings.LastIndexByte(prefill, ':')+1:]
	if p := ws[prefill].Spec.BootstrapPort; p == nil || fmt.Sprint(*p) != port {
		t.Fatalf("prefill bootstrap_port = %v, want %s from its /server_info", p, port)
	}
	if p := ws[decode].Spec.BootstrapPort; p != nil {
		t.Fatalf("decode bootstrap_port = %d, want none", *p)
	}
	a.waitRoutersApplied(t, 1)
	for _, stream := range []bool{false, true} {
		ans := chat(base, 8, stream, 30*time.Second)
		err := ans.completeJSON()
		if stream {
			err = ans.completeStream()
		}
		if err != nil {
			t.Fatalf("PD chat (stream %v): %v", stream, err)
		}
	}
}
