package suite

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/smg-project/smg/bench"
)

// GatewayConfig is one way of running the gateway in the overload scenario.
type GatewayConfig struct {
	Name  string   `json:"name"`
	Flags []string `json:"flags"`
	Why   string   `json:"why"`
	// Routers > 1 adds Routers-1 `smg router` processes (with RouterFlags)
	// beside smg launch's own router; the client spreads requests over all.
	Routers     int      `json:"routers,omitempty"`
	RouterFlags []string `json:"router_flags,omitempty"`
	// Spread is how the client spreads requests over the routers
	// (SpreadRoundRobin when empty).
	Spread string `json:"spread,omitempty"`
	// ShedFailover: the client sends a shed request on to the next router.
	ShedFailover bool `json:"shed_failover,omitempty"`
	// Handoff: every router lists the others in --peer-routers, so one with
	// no room in its share borrows a peer's free room.
	Handoff bool `json:"handoff,omitempty"`
	// SimArgs are extra simulator flags (the window configurations run the
	// SGLang flavor, whose engines report their running window, or the
	// vLLM flavor, whose engines report none).
	SimArgs []string `json:"sim_args,omitempty"`
	// GRPC registers the engines by their gRPC URLs (the simulator serves
	// SMG's engine protocol beside HTTP): the router renders the template,
	// tokenizes, calls Generate and detokenizes the answer itself.
	GRPC bool `json:"grpc,omitempty"`
	// LearnWindows: the engines report no running window, so smg learns it
	// from their queue; a saturating burst before the run lets it (as any
	// fleet that has seen load once), and the engines' marks start after.
	LearnWindows bool `json:"learn_windows,omitempty"`
	// SchedulerYAML, when set, is written to a file passed as
	// --priority-scheduler-config; Priorities is the arrivals' class mix.
	SchedulerYAML string                `json:"scheduler_yaml,omitempty"`
	Priorities    []bench.PriorityShare `json:"priorities,omitempty"`
	// Engines is the fleet's size (0: the suite's 4).
	Engines int `json:"engines,omitempty"`
	// NginxMaxConns > 0 puts nginx (least_conn, this max_conns per engine)
	// in front of the fleet instead of smg.
	NginxMaxConns int `json:"nginx_max_conns,omitempty"`
}

// engines is the configuration's fleet size.
func (gc GatewayConfig) engines() int {
	if gc.Engines > 0 {
		return gc.Engines
	}
	return fleetSize
}

// tunedWaiting is the waiting-requests ceiling of the tuned configuration: a
// quarter of an engine's running window. A request that finds q requests
// waiting starts after about q/window of a service time, so a ceiling of
// window/4 caps the queueing the veto lets build at about a quarter of a
// request's duration once the veto is in force. Lower (1) would veto engines
// on single Poisson bursts at healthy load; the default 8 (= the window) lets
// a whole service time of queue build before anything happens.
const tunedWaiting = engineSlots / 4

// OverloadConfigs are the four configurations the issue asks for, the tuned
// one with a waiting ceiling of tuned (0: tunedWaiting). All route with
// least_load so the only difference between them is protection.
func OverloadConfigs(tuned int) []GatewayConfig {
	why := "waiting ceiling %d, 503 when all are over"
	if tuned <= 0 || tuned == tunedWaiting {
		tuned, why = tunedWaiting, "waiting ceiling %d (window/4), 503 when all are over"
	}
	return []GatewayConfig{
		{Name: "off", Flags: []string{"--disable-worker-overload-protection"}, Why: "no ceilings: relative balancing only"},
		{Name: "steer", Why: "default ceilings (waiting 8, KV 0.8), steer when all are over"},
		{Name: "shed", Flags: []string{"--worker-overload-shed"}, Why: "default ceilings, 503 when all are over"},
		{Name: "shed-tuned", Flags: []string{"--worker-overload-shed", "--worker-overload-waiting-requests", fmt.Sprint(tuned)},
			Why: fmt.Sprintf(why, tuned)},
	}
}

// OverloadRun is one configuration at one offered load.
type OverloadRun struct {
	Config  string        `json:"config"`
	Load    float64       `json:"load"` // multiple of the measured capacity
	Rate    float64       `json:"rate"` // requests/s offered
	Summary bench.Summary `json:"summary"`
	// RetryAfterSeen counts shed answers that carried a Retry-After header.
	RetryAfterSeen int `json:"retry_after_seen"`
	// Trace is the run second by second (arrivals, routing, verdicts).
	Trace []TraceSecond `json:"trace,omitempty"`
	// Engines' own high-water marks over the run (GET /sim/stats after each
	// scheduling pass), the highest of any engine.
	PeakRunning int `json:"peak_running"`
	PeakWaiting int `json:"peak_waiting"`
	// RoomsIdle is the engines' idle window rooms over the steady state.
	RoomsIdle RoomsIdle `json:"rooms_idle"`
	// LossBound is the mean slots a router that never waits could keep
	// busy at this load (lossBound).
	LossBound float64 `json:"loss_bound"`
	// ByClass summarises each class of a priority mix apart.
	ByClass map[string]bench.Summary `json:"by_class,omitempty"`
}

// OverloadReport is the whole scenario.
type OverloadReport struct {
	Capacity Capacity `json:"capacity"`
	// WindowCeiling is measured beside the capacity when window
	// configurations run: goodput's bound with nothing queued in the
	// engines.
	WindowCeiling *WindowCeiling  `json:"window_ceiling,omitempty"`
	Configs       []GatewayConfig `json:"configs"`
	Loads         []float64       `json:"loads"`
	RunSeconds    float64         `json:"run_seconds"`
	TimeoutSecs   float64         `json:"timeout_seconds"`
	TTFTObjective float64         `json:"ttft_objective_seconds"`
	Runs          []OverloadRun   `json:"runs"`
	Started       time.Time       `json:"started"`
	Took          float64         `json:"took_seconds"`
	// Load averages of the machine when the scenario began and ended: the
	// figures mean little when other work crowded the cores.
	LoadAvgStart string `json:"loadavg_start"`
	LoadAvgEnd   string `json:"loadavg_end"`
	// AgentPoll is the node agent's poll interval ("": no agent, HTTP polls).
	AgentPoll string `json:"agent_poll,omitempty"`
	// Notes say how the published report was put together when it was not
	// one run (e.g. a configuration re-run and merged), printed with it.
	Notes []string `json:"notes,omitempty"`
}

// Run finds one configuration at one load.
func (r *OverloadReport) Run(config string, load float64) (OverloadRun, bool) {
	for _, run := range r.Runs {
		if run.Config == config && run.Load == load {
			return run, true
		}
	}
	return OverloadRun{}, false
}

// shortLightConfigs are the configurations a short run also offers less than
// capacity: below capacity the smoke test shows only that requests complete
// and nothing is shed, which one configuration of each family shows.
var shortLightConfigs = []string{"off", "steer", "window-1r", "window-vllm-1r", "window-priority"}

// TTFTObjective is the goodput objective: about the time a whole answer
// takes on an idle engine of this fleet (48 tokens × ~20 ms).
const TTFTObjective = time.Second

// Overload offers 0.5×, 1×, 1.5× and 2× of the fleet's measured capacity to
// each configuration, with a fresh fleet and gateway for every run.
func (s *Suite) Overload(ctx context.Context) (*OverloadReport, error) {
	began := time.Now()
	rep := &OverloadReport{Configs: append(append(OverloadConfigs(s.TunedWaiting), WindowConfigs()...), PriorityConfigs()...), Loads: []float64{0.5, 1, 1.5, 2},
		RunSeconds: 20, TimeoutSecs: 15, TTFTObjective: TTFTObjective.Seconds(), Started: began, LoadAvgStart: loadAvg()}
	if s.AgentPoll > 0 {
		rep.AgentPoll = s.AgentPoll.String()
	}
	if len(s.Configs) > 0 {
		picked, err := pickConfigs(rep.Configs, s.Configs)
		if err != nil {
			return nil, err
		}
		rep.Configs = picked
	}
	if len(s.Loads) > 0 {
		rep.Loads = s.Loads
	}
	if s.WindowWait != "" {
		for i := range rep.Configs {
			gc := &rep.Configs[i]
			gc.Flags, gc.RouterFlags = withFlag(gc.Flags, "--worker-admission-wait-secs", s.WindowWait),
				withFlag(gc.RouterFlags, "--worker-admission-wait-secs", s.WindowWait)
		}
	}
	switch {
	case s.Short:
		// A short timeout bounds the unprotected 2× runs, whose queues
		// would otherwise take longest to drain.
		rep.Loads, rep.RunSeconds, rep.TimeoutSecs = []float64{0.5, 2}, 3, 2
		rep.Capacity = nominalCapacity()
	case s.Capacity > 0:
		rep.Capacity = Capacity{ReqPerSec: s.Capacity, TokensPerSec: s.Capacity * outputDist.Mean()}
	default:
		capacity, err := s.Calibrate(ctx)
		if err != nil {
			return nil, fmt.Errorf("calibration: %w", err)
		}
		rep.Capacity = capacity
	}
	capacity := rep.Capacity
	if !s.Short && slices.ContainsFunc(rep.Configs, func(gc GatewayConfig) bool {
		return slices.Contains(gc.Flags, "--worker-admission-window")
	}) {
		c, err := s.windowCeiling(ctx, 12*time.Second)
		if err != nil {
			return nil, fmt.Errorf("window ceiling: %w", err)
		}
		rep.WindowCeiling = &c
	}
	for _, gc := range rep.Configs {
		for _, load := range rep.Loads {
			if s.Short && load < 1 && !slices.Contains(shortLightConfigs, gc.Name) {
				continue
			}
			run, err := s.overloadRun(ctx, gc, load, rep)
			if err != nil {
				return rep, fmt.Errorf("%s at %.1fx: %w", gc.Name, load, err)
			}
			rep.Runs = append(rep.Runs, run)
			sm := run.Summary
			s.logf("%-10s %.1fx: %d req, ok %d, shed %d, err %d, TTFT p50 %.0f ms p99 %.0f ms, goodput %.0f tok/s (%.0f%% of capacity)",
				gc.Name, load, sm.Requests, sm.Completed, sm.Shed, sm.Errors, sm.TTFT.P50*1000, sm.TTFT.P99*1000,
				sm.Goodput, 100*sm.Goodput/capacity.TokensPerSec)
		}
	}
	rep.Took = time.Since(began).Seconds()
	rep.LoadAvgEnd = loadAvg()
	if err := s.writeJSON("overload.json", rep); err != nil {
		return rep, err
	}
	return rep, nil
}

// pickConfigs is the configurations of all named in names, in the order
// named: twins interleaved, and rounds that reverse the order, alternate
// on the box. name@secs is the configuration with that router wait
// (--worker-admission-wait-secs), so waits compare under one calibration.
func pickConfigs(all []GatewayConfig, names []string) ([]GatewayConfig, error) {
	picked := make([]GatewayConfig, 0, len(names))
	for _, name := range names {
		base, wait, waited := strings.Cut(name, "@")
		i := slices.IndexFunc(all, func(gc GatewayConfig) bool { return gc.Name == base })
		if i < 0 {
			return nil, fmt.Errorf("unknown overload configuration %q", name)
		}
		gc := all[i]
		if waited {
			if !slices.Contains(gc.Flags, "--worker-admission-wait-secs") {
				return nil, fmt.Errorf("%q: %s has no router wait to replace", name, base)
			}
			gc.Name = name
			gc.Flags, gc.RouterFlags = withFlag(gc.Flags, "--worker-admission-wait-secs", wait), withFlag(gc.RouterFlags, "--worker-admission-wait-secs", wait)
		}
		picked = append(picked, gc)
	}
	return picked, nil
}

func (s *Suite) overloadRun(ctx context.Context, gc GatewayConfig, load float64, rep *OverloadReport) (OverloadRun, error) {
	e, err := s.startConfig(ctx, gc)
	if err != nil {
		return OverloadRun{}, err
	}
	defer e.stop()
	rate := load * rep.Capacity.ReqPerSec
	label := fmt.Sprintf("%s %.1fx", gc.Name, load)
	e.fleet.simStats(ctx, true) // the engines' high-water marks start now
	cfg := bench.Config{URL: e.gw.URL, URLs: e.urls, Rate: rate, Duration: time.Duration(rep.RunSeconds * float64(time.Second)),
		Prompt: promptDist, Output: outputDist, Timeout: time.Duration(rep.TimeoutSecs * float64(time.Second)),
		TTFTObjective: TTFTObjective, Seed: s.Seed + uint64(load*10), Priorities: gc.Priorities, Spread: gc.Spread,
		ShedFailover: gc.ShedFailover}
	start := time.Now()
	sampler := sampleWorkers(ctx, e.gw, e.workers, start, 100*time.Millisecond)
	idle := e.fleet.meterIdle(ctx, start, bench.Warmup(cfg.Duration), cfg.Duration)
	res, err := bench.Run(ctx, s.httpClient(), cfg, progressLogger(s, label))
	samples := sampler.stop()
	if err != nil {
		return OverloadRun{}, err
	}
	marks := e.fleet.simStats(ctx, false)
	res.Scenario = label
	if err := s.writeJSON(fmt.Sprintf("overload-%s-%.1fx.json", gc.Name, load), res); err != nil {
		return OverloadRun{}, err
	}
	run := OverloadRun{Config: gc.Name, Load: load, Rate: rate, Summary: res.Summary,
		Trace: Trace(res.Records, samples, fleetSize, rep.RunSeconds), PeakRunning: marks.PeakRunning, PeakWaiting: marks.PeakWaiting,
		ByClass: res.ByClass, RoomsIdle: idle(),
		LossBound: lossBound(res.Summary.OfferedRate, meanHeld(res.Records), gc.engines()*engineSlots, gc.Routers)}
	for _, r := range res.Records {
		if r.Shed && r.RetryAfter > 0 {
			run.RetryAfterSeen++
		}
	}
	return run, nil
}

// withFlag returns a copy of flags with the value of an existing flag
// replaced (flags without it are returned as they are).
func withFlag(flags []string, name, value string) []string {
	out := slices.Clone(flags)
	for i := 0; i+1 < len(out); i++ {
		if out[i] == name {
			out[i+1] = value
		}
	}
	return out
}
