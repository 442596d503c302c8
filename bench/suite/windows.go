package suite

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/smg-project/smg/bench"
)

// windowFlags are the router-side flags of the window configurations: every
// engine gated on its running window (the engine reports 8), no wait in the
// router (a request that finds every window full is shed at once: a router
// queue that holds requests for seconds only moves the latency) and no queue
// allowance in the engines. The overload veto stays on beneath.
var windowFlags = []string{"--worker-overload-shed", "--worker-admission-window", "--worker-admission-wait-secs", "0"}

// routerBase is what an extra router shares with the gateway's own router.
var routerBase = []string{"--policy", "least_load", "--load-monitor-interval", "1"}

// WindowConfigs are the running-window configurations: one router; three
// routers sharing each window (shares from the control plane); three routers
// each counting the whole window alone (what shares buy).
func WindowConfigs() []GatewayConfig {
	sglang := []string{"--flavor", "sglang"}
	alone := append(append([]string{}, windowFlags...), "--worker-admission-window-mode", "per-router")
	return []GatewayConfig{
		{Name: "window-1r", Flags: windowFlags, SimArgs: sglang,
			Why: "running windows (8, reported by the engines), wait 0, queue 0; 1 router"},
		{Name: "window-1r-grpc", Flags: windowFlags, SimArgs: sglang, GRPC: true,
			Why: "window-1r with the same engines registered by their gRPC URLs (SMG's engine protocol): the router renders the chat template, tokenizes, calls Generate and detokenizes"},
		{Name: "window-3r", Flags: windowFlags, SimArgs: sglang, Routers: 3,
			RouterFlags: append(append([]string{}, routerBase...), windowFlags...),
			Why:         "the same, 3 routers sharing each window (client spreads requests over them in turn)"},
		{Name: "window-3r-lo", Flags: windowFlags, SimArgs: sglang, Routers: 3, Spread: bench.SpreadLeastOutstanding,
			RouterFlags: append(append([]string{}, routerBase...), windowFlags...),
			Why:         "the same 3 routers sharing each window, the client sending each request to the router with the fewest of its requests open (least outstanding)"},
		{Name: "window-3r-next", Flags: windowFlags, SimArgs: sglang, Routers: 3, ShedFailover: true,
			RouterFlags: append(append([]string{}, routerBase...), windowFlags...),
			Why:         "the same 3 routers sharing each window, in turn; a request shed by one router goes on to the next at once (each router once), as a balancer retrying 503 on another upstream"},
		{Name: "window-3r-loan", Flags: windowFlags, SimArgs: sglang, Routers: 3, Handoff: true,
			RouterFlags: append(append([]string{}, routerBase...), windowFlags...),
			Why:         "the same 3 routers sharing each window, in turn; a router with no room in its share borrows one from a peer router that has one and sends the request there itself (`--peer-routers`, each router listing the other two)"},
		{Name: "window-3r-alone", Flags: alone, SimArgs: sglang, Routers: 3,
			RouterFlags: append(append([]string{}, routerBase...), alone...),
			Why:         "the same 3 routers, each counting the whole window alone (`--worker-admission-window-mode per-router`)"},
		{Name: "window-vllm-1r", Flags: windowFlags, LearnWindows: true,
			Why: "running windows learned (vLLM flavor: the engines report no window; their real one is 8), wait 0, queue 0; 1 router"},
		{Name: "window-vllm-3r", Flags: windowFlags, LearnWindows: true, Routers: 3,
			RouterFlags: append(append([]string{}, routerBase...), windowFlags...),
			Why:         "the same learned windows, 3 routers sharing each window (client spreads requests over them in turn)"},
	}
}

// warmWindows sends n concurrent short requests through url and waits for
// their answers: engines that report no window queue under it, which is
// what smg learns their window from.
func warmWindows(ctx context.Context, url string, n int) {
	body := []byte(`{"model":"sim-model","messages":[{"role":"user","content":"warm up"}],"max_tokens":16}`)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
			if err != nil {
				return
			}
			req.Header.Set("Content-Type", "application/json")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
}

var routerServingRe = regexp.MustCompile(`msg="Router serving" http=(\S+)`)

// StartRouter runs `smg router` against the gateway's control plane and
// waits until it holds a snapshot.
func StartRouter(ctx context.Context, bin string, gw *Gateway, id string, flags []string) (*Proc, string, error) {
	addr := make(chan string, 1)
	args := append([]string{"router", "--port", "0", "--controlplane", gw.GRPC, "--router-id", id, "--log-level", "info"}, flags...)
	p, err := startProc(bin, args, func(line string) {
		if m := routerServingRe.FindStringSubmatch(line); m != nil {
			select {
			case addr <- "http://" + m[1]:
			default:
			}
		}
	})
	if err != nil {
		return nil, "", err
	}
	var url string
	select {
	case url = <-addr:
	case <-p.done:
		return nil, "", fmt.Errorf("smg router exited: %s", p.Log())
	case <-time.After(15 * time.Second):
		p.Stop(time.Second)
		return nil, "", fmt.Errorf("smg router did not start: %s", p.Log())
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/readyz", nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p, url, nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			p.Stop(time.Second)
			return nil, "", fmt.Errorf("smg router %s not ready: %s", id, p.Log())
		}
		time.Sleep(50 * time.Millisecond) // polling a process's start, not a timed assertion
	}
}

// simStats reads every engine's GET /sim/stats and returns the highest peak
// running and peak waiting of any engine; reset starts new marks.
func (f *Fleet) simStats(ctx context.Context, reset bool) (peakRunning, peakWaiting int) {
	q := ""
	if reset {
		q = "?reset=1"
	}
	for _, u := range f.URLs {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u+"/sim/stats"+q, nil)
		if err != nil {
			continue
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			continue
		}
		var st struct {
			PeakWaiting int `json:"peak_waiting"`
			PeakRunning int `json:"peak_running"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		peakRunning, peakWaiting = max(peakRunning, st.PeakRunning), max(peakWaiting, st.PeakWaiting)
	}
	return peakRunning, peakWaiting
}

// WindowTarget is the claim running windows make for one configuration: at 2×,
// admitted p99 TTFT within 1.3× of its 0.5× value, goodput at least 97% of
// capacity, and at every load no engine running above its window (8) nor
// waiting above the allowance (0).
type WindowTarget struct {
	Target
	PeakRunning, PeakWaiting int
	BoundsMet                bool
	SlotsBusy                float64 // at 2×: mean admitted requests open, of the fleet's slots
}

// WindowTargets evaluates the window configurations of rep.
func WindowTargets(rep *OverloadReport) []WindowTarget {
	var out []WindowTarget
	for _, gc := range rep.Configs {
		if !slicesContainsFlag(gc.Flags, "--worker-admission-window") || len(gc.Priorities) > 0 {
			continue // a priority mix has its own target (writePrioritySection)
		}
		lo, ok1 := rep.Run(gc.Name, 0.5)
		hi, ok2 := rep.Run(gc.Name, 2)
		if !ok1 || !ok2 {
			continue
		}
		t := WindowTarget{Target: Target{Config: gc.Name, P99Low: lo.Summary.TTFT.P99, P99High: hi.Summary.TTFT.P99,
			GoodputFraction: hi.Summary.Goodput / rep.Capacity.TokensPerSec}, SlotsBusy: hi.Summary.InFlight}
		t.TTFTMet = t.P99High <= 1.3*t.P99Low
		t.GoodMet = t.GoodputFraction >= 0.97
		for _, r := range rep.Runs {
			if r.Config == gc.Name {
				t.PeakRunning, t.PeakWaiting = max(t.PeakRunning, r.PeakRunning), max(t.PeakWaiting, r.PeakWaiting)
			}
		}
		t.BoundsMet = t.PeakRunning <= engineSlots && t.PeakWaiting <= waitingBound(gc)
		out = append(out, t)
	}
	return out
}

// waitingBound is the most an engine may queue under a configuration: none
// with a reported window (allowance 0), one with a learned one (a probe of
// one room above it).
func waitingBound(gc GatewayConfig) int {
	if gc.LearnWindows {
		return 1
	}
	return 0
}

func slicesContainsFlag(flags []string, f string) bool { return slices.Contains(flags, f) }

// writeWindowSection adds the engines' own peaks per run and the window
// targets for the window configurations.
func writeWindowSection(b *bytes.Buffer, rep *OverloadReport) {
	ts := WindowTargets(rep)
	if len(ts) == 0 {
		return
	}
	b.WriteString("\nRunning windows (`--worker-admission-window`): the engines' own high-water marks per run " +
		"(`GET /sim/stats`: queue and running batch after each scheduling pass; window 8, allowance 0; a learned window (vLLM flavor) may queue one request, a probe of one room), " +
		"TTFT measured by the client from its send, so any wait in a router counts; slots busy: the mean number of admitted requests open " +
		"at the client over the steady state, against the fleet's slots (a measure that, unlike tokens/s, does not slow down when other jobs take the CPU):\n\n")
	b.WriteString("| config | routers | load | TTFT p50 | TTFT p99 | goodput / capacity | slots busy | 503 rate | engine peak running | engine peak waiting |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rep.Runs {
		var gc GatewayConfig
		for _, c := range rep.Configs {
			if c.Name == r.Config {
				gc = c
			}
		}
		if !slicesContainsFlag(gc.Flags, "--worker-admission-window") {
			continue
		}
		s := r.Summary
		fmt.Fprintf(b, "| %s | %d | %.1f× | %s | %s | %.0f%% | %.1f of %d | %.1f%% | %d | %d |\n", r.Config, max(1, gc.Routers), r.Load,
			msStr(s.TTFT.P50), msStr(s.TTFT.P99), 100*s.Goodput/rep.Capacity.TokensPerSec, s.InFlight, fleetSize*engineSlots,
			100*s.Rate503, r.PeakRunning, r.PeakWaiting)
	}
	b.WriteString("\nWindow targets (at 2×: admitted p99 TTFT ≤ 1.3× its 0.5× value, goodput ≥ 97% of capacity; " +
		"at every load: no engine running above its window nor waiting above the allowance, one for a learned window):\n\n")
	b.WriteString("| config | TTFT p99 0.5× → 2× | ratio | TTFT target | goodput at 2× | goodput target | slots busy at 2× | peaks running / waiting | bounds |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, t := range ts {
		fmt.Fprintf(b, "| %s | %s → %s | %.2f× | %s | %.1f%% | %s | %.1f of %d | %d / %d | %s |\n", t.Config, msStr(t.P99Low), msStr(t.P99High),
			t.P99High/t.P99Low, metStr(t.TTFTMet), 100*t.GoodputFraction, metStr(t.GoodMet), t.SlotsBusy, fleetSize*engineSlots,
			t.PeakRunning, t.PeakWaiting, metStr(t.BoundsMet))
	}
}

// waitShares waits until the control plane has split every engine's whole
// window among routers routers: before that a router holds no room and would
// shed what the benchmark means to measure.
func (g *Gateway) waitShares(ctx context.Context, engines, routers int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		split := 0
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, g.URL+"/workers", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			var body struct {
				Workers []struct {
					Admission *struct {
						Window json.Number            `json:"window"`
						Shares map[string]json.Number `json:"shares"`
					} `json:"admission"`
				} `json:"workers"`
			}
			_ = json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
			for _, w := range body.Workers {
				a := w.Admission
				if a == nil || len(a.Shares) != routers {
					continue
				}
				window, _ := strconv.Atoi(strings.Trim(a.Window.String(), `"`))
				sum := 0
				for _, s := range a.Shares {
					n, _ := strconv.Atoi(strings.Trim(s.String(), `"`))
					sum += n
				}
				if window > 0 && sum == window {
					split++
				}
			}
		}
		if split == engines {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("windows not split over %d routers within %s (%d of %d engines)", routers, within, split, engines)
		}
		time.Sleep(50 * time.Millisecond) // polling a start-up condition, not a timed assertion
	}
}

// GRPCPair is a configuration served over gRPC beside its HTTP twin (the
// same name without "-grpc") at one load.
type GRPCPair struct {
	Config     string // the gRPC configuration
	Load       float64
	HTTP, GRPC bench.Summary
}

// GRPCPairs pairs every gRPC configuration of rep with its HTTP twin, load
// by load.
func GRPCPairs(rep *OverloadReport) []GRPCPair {
	var out []GRPCPair
	for _, gc := range rep.Configs {
		twin, ok := strings.CutSuffix(gc.Name, "-grpc")
		if !gc.GRPC || !ok {
			continue
		}
		for _, load := range rep.Loads {
			h, ok1 := rep.Run(twin, load)
			g, ok2 := rep.Run(gc.Name, load)
			if ok1 && ok2 {
				out = append(out, GRPCPair{Config: gc.Name, Load: load, HTTP: h.Summary, GRPC: g.Summary})
			}
		}
	}
	return out
}

// WriteGRPCTable writes each gRPC configuration beside its HTTP twin:
// admitted TTFT and goodput, and their ratios.
func WriteGRPCTable(w io.Writer, rep *OverloadReport) {
	pairs := GRPCPairs(rep)
	if len(pairs) == 0 {
		return
	}
	fmt.Fprintf(w, "| config | load | TTFT p50 HTTP / gRPC | TTFT p99 HTTP / gRPC | p99 gRPC / HTTP | goodput / capacity HTTP / gRPC | goodput gRPC / HTTP | 503 rate HTTP / gRPC | errors HTTP / gRPC |\n")
	fmt.Fprintf(w, "|---|---|---|---|---|---|---|---|---|\n")
	capTok := rep.Capacity.TokensPerSec
	for _, p := range pairs {
		h, g := p.HTTP, p.GRPC
		fmt.Fprintf(w, "| %s | %.1f× | %s / %s | %s / %s | %.2f | %.0f%% / %.0f%% | %.2f | %.1f%% / %.1f%% | %d / %d |\n",
			p.Config, p.Load, msStr(h.TTFT.P50), msStr(g.TTFT.P50), msStr(h.TTFT.P99), msStr(g.TTFT.P99), ratio(g.TTFT.P99, h.TTFT.P99),
			100*h.Goodput/capTok, 100*g.Goodput/capTok, ratio(g.Goodput, h.Goodput), 100*h.Rate503, 100*g.Rate503, h.Errors, g.Errors)
	}
}

// ratio is a/b, 0 when b is 0.
func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}
