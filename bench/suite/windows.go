package suite

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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

// windowFlags gate every engine on its running window (the engine reports
// 8) with no wait in the router (a request that finds every window full is
// shed at once: a router queue that holds requests for seconds only moves
// the latency) and no queue allowance in the engines. The overload veto
// stays on beneath.
var windowFlags = []string{"--worker-overload-shed", "--worker-admission-window", "--worker-admission-wait-secs", "0"}

// roomWait is the window configurations' router wait for a room, in
// seconds: with none a router is a loss system, and a room freed between
// two arrivals stays empty until the next one (2-5% of the rooms at 2×);
// a request that finds every window full waits this long for a freed room
// instead, which adds at most this much to its TTFT. The configurations'
// Why texts say 20 ms.
const roomWait = "0.02"

// windowWaitFlags are windowFlags with the window configurations' wait.
var windowWaitFlags = withFlag(windowFlags, "--worker-admission-wait-secs", roomWait)

// routerBase is what an extra router shares with the gateway's own router.
var routerBase = []string{"--policy", "least_load", "--load-monitor-interval", "1"}

// WindowConfigs are the running-window configurations: one router; three
// routers sharing each window (shares from the control plane); three routers
// each counting the whole window alone (what shares buy).
func WindowConfigs() []GatewayConfig {
	sglang := []string{"--flavor", "sglang"}
	alone := append(append([]string{}, windowWaitFlags...), "--worker-admission-window-mode", "per-router")
	return []GatewayConfig{
		{Name: "window-1r", Flags: windowWaitFlags, SimArgs: sglang,
			Why: "running windows (8, reported by the engines), a wait of at most 20 ms for a room, queue 0; 1 router"},
		{Name: "window-1r-grpc", Flags: windowWaitFlags, SimArgs: sglang, GRPC: true,
			Why: "window-1r with the same engines registered by their gRPC URLs (SMG's engine protocol): the router renders the chat template, tokenizes, calls Generate and detokenizes"},
		{Name: "window-3r", Flags: windowWaitFlags, SimArgs: sglang, Routers: 3,
			RouterFlags: append(append([]string{}, routerBase...), windowWaitFlags...),
			Why:         "the same, 3 routers sharing each window (client spreads requests over them in turn)"},
		{Name: "window-3r-lo", Flags: windowWaitFlags, SimArgs: sglang, Routers: 3, Spread: bench.SpreadLeastOutstanding,
			RouterFlags: append(append([]string{}, routerBase...), windowWaitFlags...),
			Why:         "the same 3 routers sharing each window, the client sending each request to the router with the fewest of its requests open (least outstanding)"},
		{Name: "window-3r-next", Flags: windowWaitFlags, SimArgs: sglang, Routers: 3, ShedFailover: true,
			RouterFlags: append(append([]string{}, routerBase...), windowWaitFlags...),
			Why:         "the same 3 routers sharing each window, in turn; a request shed by one router goes on to the next at once (each router once), as a balancer retrying 503 on another upstream"},
		{Name: "window-3r-loan", Flags: windowWaitFlags, SimArgs: sglang, Routers: 3, Handoff: true,
			RouterFlags: append(append([]string{}, routerBase...), windowWaitFlags...),
			Why:         "the same 3 routers sharing each window, in turn; a router with no room in its share borrows one from a peer router that has one and sends the request there itself (`--peer-routers`, each router listing the other two)"},
		{Name: "window-3r-alone", Flags: alone, SimArgs: sglang, Routers: 3,
			RouterFlags: append(append([]string{}, routerBase...), alone...),
			Why:         "the same 3 routers, each counting the whole window alone (`--worker-admission-window-mode per-router`)"},
		{Name: "window-vllm-1r", Flags: windowWaitFlags, LearnWindows: true,
			Why: "running windows learned (vLLM flavor: the engines report no window; their real one is 8), a wait of at most 20 ms for a room, queue 0; 1 router"},
		{Name: "window-vllm-3r", Flags: windowWaitFlags, LearnWindows: true, Routers: 3,
			RouterFlags: append(append([]string{}, routerBase...), windowWaitFlags...),
			Why:         "the same learned windows, 3 routers sharing each window (client spreads requests over them in turn)"},
		{Name: "window-vllm-3r-next", Flags: windowWaitFlags, LearnWindows: true, Routers: 3, ShedFailover: true,
			RouterFlags: append(append([]string{}, routerBase...), windowWaitFlags...),
			Why:         "window-3r-next with learned windows: a request shed by one router goes on to the next at once (each router once)"},
		{Name: "window-vllm-3r-loan", Flags: windowWaitFlags, LearnWindows: true, Routers: 3, Handoff: true,
			RouterFlags: append(append([]string{}, routerBase...), windowWaitFlags...),
			Why:         "window-3r-loan with learned windows: a router with no room in its share borrows one from a peer router (`--peer-routers`)"},
	}
}

// warmWindows sends n concurrent short requests, spread over urls in turn
// (every router, as a fleet that has seen load has seen it at each: through
// one alone, the window shares would start skewed to it), and waits for
// their answers: engines that report no window queue under them, which is
// what smg learns their window from.
func warmWindows(ctx context.Context, urls []string, n int) {
	body := []byte(`{"model":"sim-model","messages":[{"role":"user","content":"warm up"}],"max_tokens":16}`)
	var wg sync.WaitGroup
	for i := range n {
		url := urls[i%len(urls)]
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
	p, err := startProc(nil, bin, args, func(line string) {
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

// simMarks is what the engines' GET /sim/stats say, over the fleet.
type simMarks struct {
	PeakRunning, PeakWaiting int // the highest of any engine
	Rooms                    int // window rooms, all engines
	// Idle room-seconds since the engines started: all, and those while a
	// request was queued at the engine (waiting for its next scheduling
	// pass).
	Idle, IdleQueued float64
}

// simStats reads every engine's GET /sim/stats; reset starts new marks.
func (f *Fleet) simStats(ctx context.Context, reset bool) simMarks {
	q := ""
	if reset {
		q = "?reset=1"
	}
	var m simMarks
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
			PeakWaiting int     `json:"peak_waiting"`
			PeakRunning int     `json:"peak_running"`
			Rooms       int     `json:"rooms"`
			Idle        float64 `json:"room_idle_seconds"`
			IdleQueued  float64 `json:"room_idle_queued_seconds"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		m.PeakRunning, m.PeakWaiting = max(m.PeakRunning, st.PeakRunning), max(m.PeakWaiting, st.PeakWaiting)
		m.Rooms += st.Rooms
		m.Idle += st.Idle
		m.IdleQueued += st.IdleQueued
	}
	return m
}

// RoomsIdle is the share of the fleet's window rooms the engines held idle
// over a run's steady state (the span goodput is measured over): with no
// request at the engine, and with one queued there for the next
// scheduling pass.
type RoomsIdle struct {
	Empty  float64 `json:"empty"`
	Queued float64 `json:"queued"`
}

// meterIdle reads the engines' idle room-seconds at start+from and
// start+to; the returned func waits for both reads and gives the shares.
func (f *Fleet) meterIdle(ctx context.Context, start time.Time, from, to time.Duration) func() RoomsIdle {
	done := make(chan RoomsIdle, 1)
	go func() {
		var marks [2]simMarks
		for i, at := range []time.Duration{from, to} {
			select {
			case <-time.After(time.Until(start.Add(at))):
			case <-ctx.Done():
				done <- RoomsIdle{}
				return
			}
			marks[i] = f.simStats(ctx, false)
		}
		span := float64(marks[1].Rooms) * (to - from).Seconds()
		if span <= 0 {
			done <- RoomsIdle{}
			return
		}
		queued := marks[1].IdleQueued - marks[0].IdleQueued
		done <- RoomsIdle{Empty: (marks[1].Idle - marks[0].Idle - queued) / span, Queued: queued / span}
	}()
	return func() RoomsIdle { return <-done }
}

// WindowCeiling is the most a gateway that holds every engine to its
// running window with nothing queued in it can serve: what the capacity
// (engines kept saturated, a queue always ready) loses when a room freed by
// one answer stays empty until the next request reaches the engine.
type WindowCeiling struct {
	TokensPerSec float64   `json:"tokens_per_sec"` // steady-state output tokens/s, whole fleet
	Rooms        RoomsIdle `json:"rooms_idle"`     // the engines' idle rooms meanwhile
}

// windowCeiling measures it on a fresh fleet with no router: engineSlots
// closed-loop clients per engine, each sending straight to its engine the
// moment its last answer ended. No arrival waits for, and no router stands
// between, a freed room and its next request; what is left is the engine's
// own: the answer's last bytes and the next request crossing HTTP, and the
// wait for the engine's next scheduling pass (an engine admits between
// steps).
func (s *Suite) windowCeiling(ctx context.Context, d time.Duration) (WindowCeiling, error) {
	f, err := StartFleet(ctx, s.Bin, fleetSize, s.simArgs())
	if err != nil {
		return WindowCeiling{}, err
	}
	defer f.Stop(time.Second)
	s.logf("window ceiling: %d closed-loop clients straight to each of %d engines for %s", engineSlots, fleetSize, d)
	start := time.Now()
	idle := f.meterIdle(ctx, start, bench.Warmup(d), d)
	sums := make([]float64, len(f.URLs))
	errs := make([]error, len(f.URLs))
	var wg sync.WaitGroup
	for i, u := range f.URLs {
		wg.Go(func() {
			res, err := bench.Run(ctx, s.httpClient(), bench.Config{URL: u, Clients: engineSlots, Duration: d, Prompt: promptDist,
				Output: outputDist, Timeout: 30 * time.Second, Seed: s.Seed + uint64(i)}, nil)
			if err == nil && res.Summary.Errors > 0 {
				err = fmt.Errorf("engine %d: %d errors (%v)", i, res.Summary.Errors, res.Summary.ErrorKinds)
			}
			if err == nil {
				sums[i] = res.Summary.Throughput
			}
			errs[i] = err
		})
	}
	wg.Wait()
	c := WindowCeiling{Rooms: idle()}
	for _, v := range sums {
		c.TokensPerSec += v
	}
	if err := errors.Join(errs...); err != nil {
		return c, err
	}
	s.logf("window ceiling: %.0f output tokens/s, rooms idle %.1f%% empty, %.1f%% queued at the engine",
		c.TokensPerSec, 100*c.Rooms.Empty, 100*c.Rooms.Queued)
	return c, nil
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
		"at the client over the steady state, against the fleet's slots (a measure that, unlike tokens/s, does not slow down when other jobs take the CPU); " +
		"rooms idle: the engines' free window rooms over the steady state (`GET /sim/stats` room-seconds), with no request at the engine " +
		"(the answer's end reaching the router, the router waiting for an arrival, the next request crossing HTTP) / with one queued at the engine " +
		"for its next scheduling pass; loss bound: the slots a router that never waits can keep busy at this load (Erlang's loss formula per router, its share of the 32 slots as servers, " +
		"its part of the arrivals each held for the run's mean answer time): a room freed between arrivals stays empty whatever the router does:\n\n")
	b.WriteString("| config | routers | load | TTFT p50 | TTFT p99 | goodput / capacity | slots busy | loss bound | rooms idle: none sent / queued | 503 rate | engine peak running | engine peak waiting |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
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
		fmt.Fprintf(b, "| %s | %d | %.1f× | %s | %s | %.0f%% | %.1f of %d | %.1f | %s | %.1f%% | %d | %d |\n", r.Config, max(1, gc.Routers), r.Load,
			msStr(s.TTFT.P50), msStr(s.TTFT.P99), 100*s.Goodput/rep.Capacity.TokensPerSec, s.InFlight, fleetSize*engineSlots,
			r.LossBound, idleStr(r.RoomsIdle), 100*s.Rate503, r.PeakRunning, r.PeakWaiting)
	}
	if c := rep.WindowCeiling; c != nil {
		fmt.Fprintf(b, "\nWindow ceiling (%d closed-loop clients straight to each engine, no router, measured beside the capacity): "+
			"**%.0f output tokens/s, %.1f%% of capacity**, rooms idle %s: what a gateway that never lets an engine queue can serve at best, "+
			"since a room freed by one answer stays empty until the next request reaches the engine and the engine admits it between steps. "+
			"Capacity keeps a queue at every engine, so no room waits.\n", engineSlots, c.TokensPerSec,
			100*c.TokensPerSec/rep.Capacity.TokensPerSec, idleStr(c.Rooms))
	}
	b.WriteString("\nWindow targets (at 2×: admitted p99 TTFT ≤ 1.3× its 0.5× value, goodput ≥ 97% of capacity; " +
		"at every load: no engine running above its window nor waiting above the allowance, one for a learned window):\n\n")
	b.WriteString("| config | TTFT p99 0.5× → 2× | ratio | TTFT target | goodput at 2× | goodput target | goodput / window ceiling | slots busy at 2× | peaks running / waiting | bounds |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, t := range ts {
		ceil := "—"
		if c := rep.WindowCeiling; c != nil && c.TokensPerSec > 0 {
			ceil = fmt.Sprintf("%.1f%%", 100*t.GoodputFraction*rep.Capacity.TokensPerSec/c.TokensPerSec)
		}
		fmt.Fprintf(b, "| %s | %s → %s | %.2f× | %s | %.1f%% | %s | %s | %.1f of %d | %d / %d | %s |\n", t.Config, msStr(t.P99Low), msStr(t.P99High),
			t.P99High/t.P99Low, metStr(t.TTFTMet), 100*t.GoodputFraction, metStr(t.GoodMet), ceil, t.SlotsBusy, fleetSize*engineSlots,
			t.PeakRunning, t.PeakWaiting, metStr(t.BoundsMet))
	}
}

// WriteWindowTables writes the window configurations' tables of rep (what
// docs/benchmarks.md gets), for a partial run that writes no docs.
func WriteWindowTables(w io.Writer, rep *OverloadReport) {
	var b bytes.Buffer
	writeWindowSection(&b, rep)
	_, _ = w.Write(b.Bytes())
}

// lossBound is the mean number of slots a router that never waits can keep
// busy: a loss system (Erlang's B) per router, its share of the fleet's
// slots as servers, its part of Poisson arrivals at rate each held for
// held seconds, a request that finds its router's share full refused.
// Rooms that free between arrivals stay empty: arithmetic of the offered
// load, not of any router.
func lossBound(rate, held float64, slots, routers int) float64 {
	routers = max(1, routers)
	a := rate * held / float64(routers)
	var busy float64
	for i := range routers {
		c := slots / routers
		if i < slots%routers {
			c++
		}
		b := 1.0 // Erlang B by its recurrence
		for k := 1; k <= c; k++ {
			b = a * b / (float64(k) + a*b)
		}
		busy += a * (1 - b)
	}
	return busy
}

// meanHeld is the mean time completed requests were open at the client.
func meanHeld(records []bench.Record) float64 {
	var sum float64
	n := 0
	for _, r := range records {
		if r.Completed {
			sum += r.E2E
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}

// idleStr is a run's idle rooms: none sent / queued at the engine.
func idleStr(r RoomsIdle) string {
	return fmt.Sprintf("%.1f%% / %.1f%%", 100*r.Empty, 100*r.Queued)
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
