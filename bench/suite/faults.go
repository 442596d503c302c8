package suite

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/smg-project/smg/bench"
)

// FaultEvent is one fault the scenario injects, at a time from the run's start.
type FaultEvent struct {
	At     float64        `json:"at"`     // seconds from the start of the run
	Engine int            `json:"engine"` // index in the fleet
	Name   string         `json:"name"`   // "kill", "revive", "freeze", "thaw"
	Patch  map[string]any `json:"patch"`  // POST /sim/fault body
}

// FaultOutcome is what one fault did.
type FaultOutcome struct {
	FaultEvent
	// Failed counts requests that started before the next event and did not
	// complete (not shed), from this event on.
	Failed int `json:"failed"`
	// Excluded is the time from the fault until GET /workers first showed the
	// engine vetoed by liveness or not Ready (-1: never within the window).
	Excluded float64 `json:"excluded"`
	// LastRouted is the time from the fault until the last request that was
	// still routed to the engine started (-1: none). The client learns the
	// engine from the response id of the first output, so a request that
	// never got a token (stuck on a frozen engine until it timed out) is
	// not attributed: the figure counts requests that got output.
	LastRouted float64 `json:"last_routed"`
	// Verdict is the first veto or state GET /workers showed.
	Verdict string `json:"verdict,omitempty"`
}

// FaultReport is the fault scenario.
type FaultReport struct {
	Capacity   Capacity       `json:"capacity"`
	Rate       float64        `json:"rate"`
	Config     GatewayConfig  `json:"config"`
	RunSeconds float64        `json:"run_seconds"`
	Outcomes   []FaultOutcome `json:"outcomes"`
	Summary    bench.Summary  `json:"summary"`
	Records    []bench.Record `json:"-"`
	Samples    []WorkerSample `json:"worker_samples"`
	// Machine load averages at the start and the end (see OverloadReport).
	LoadAvgStart string `json:"loadavg_start"`
	LoadAvgEnd   string `json:"loadavg_end"`
	AgentPoll    string `json:"agent_poll,omitempty"` // "" when the control plane polled over HTTP
}

// WorkerSample is GET /workers for one engine at one time.
type WorkerSample struct {
	At     float64 `json:"at"`
	Engine int     `json:"engine"`
	WorkerState
}

// Faults runs the fleet at 1× its measured capacity under the default
// configuration while engine 0 is killed (then restarted) and engine 1 is
// frozen (then thawed), recording TTFT over time and when each was excluded.
func (s *Suite) Faults(ctx context.Context) (*FaultReport, error) {
	loadStart := loadAvg()
	capacity := nominalCapacity()
	if !s.Short {
		var err error
		if capacity, err = s.Calibrate(ctx); err != nil {
			return nil, fmt.Errorf("calibration: %w", err)
		}
	}
	events := []FaultEvent{
		{At: 10, Engine: 0, Name: "kill", Patch: map[string]any{"kill": true}},
		{At: 25, Engine: 0, Name: "revive", Patch: map[string]any{"kill": false}},
		{At: 35, Engine: 1, Name: "freeze", Patch: map[string]any{"freeze": true}},
		{At: 50, Engine: 1, Name: "thaw", Patch: map[string]any{"freeze": false}},
	}
	runSecs := 60.0
	if s.Short {
		events = []FaultEvent{
			{At: 2, Engine: 0, Name: "kill", Patch: map[string]any{"kill": true}},
			{At: 5, Engine: 1, Name: "freeze", Patch: map[string]any{"freeze": true}},
		}
		runSecs = 8
	}
	gc := GatewayConfig{Name: "steer", Why: "default protection (steer), least_load"}
	e, err := s.start(ctx, gc.Flags)
	if err != nil {
		return nil, err
	}
	defer e.stop()
	rep := &FaultReport{Capacity: capacity, Rate: capacity.ReqPerSec, Config: gc, RunSeconds: runSecs, LoadAvgStart: loadStart}
	if s.AgentPoll > 0 {
		rep.AgentPoll = s.AgentPoll.String()
	}
	start := time.Now()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var faultErr error
	wg.Add(1)
	go func() { // inject the faults on schedule
		defer wg.Done()
		for _, ev := range events {
			select {
			case <-time.After(time.Until(start.Add(time.Duration(ev.At * float64(time.Second))))):
			case <-runCtx.Done():
				return
			}
			s.logf("  t=%.0fs %s engine %d", ev.At, ev.Name, ev.Engine)
			if err := e.fleet.Fault(runCtx, ev.Engine, ev.Patch); err != nil {
				mu.Lock()
				faultErr = err
				mu.Unlock()
			}
		}
	}()
	// The gateway's view of each worker, for the time to exclusion.
	sampler := sampleWorkers(runCtx, e.gw, e.fleet.URLs, start, 100*time.Millisecond)
	cfg := bench.Config{URL: e.gw.URL, Rate: rep.Rate, Duration: time.Duration(runSecs * float64(time.Second)),
		Prompt: promptDist, Output: outputDist, Timeout: 15 * time.Second, TTFTObjective: TTFTObjective, Seed: s.Seed}
	if s.Short {
		cfg.Timeout = 5 * time.Second
	}
	res, err := bench.Run(ctx, s.httpClient(), cfg, progressLogger(s, "faults 1.0x"))
	rep.Samples = sampler.stop()
	cancel()
	wg.Wait()
	if err != nil {
		return nil, err
	}
	if faultErr != nil {
		return nil, fmt.Errorf("injecting a fault: %w", faultErr)
	}
	rep.Records, rep.Summary, rep.LoadAvgEnd = res.Records, res.Summary, loadAvg()
	for i, ev := range events {
		until := runSecs + cfg.Timeout.Seconds()
		if i+1 < len(events) {
			until = events[i+1].At
		}
		rep.Outcomes = append(rep.Outcomes, outcome(ev, until, res.Records, rep.Samples))
	}
	res.Scenario = "faults"
	if err := s.writeJSON("faults-records.json", res); err != nil {
		return rep, err
	}
	return rep, s.writeJSON("faults.json", rep)
}

func outcome(ev FaultEvent, until float64, records []bench.Record, samples []WorkerSample) FaultOutcome {
	o := FaultOutcome{FaultEvent: ev, Excluded: -1, LastRouted: -1}
	engine := fmt.Sprint(ev.Engine)
	for _, r := range records {
		if r.Start < ev.At || r.Start >= until {
			continue
		}
		if !r.Completed && !r.Shed {
			o.Failed++
		}
		if r.Engine == engine && r.Start-ev.At > o.LastRouted {
			o.LastRouted = r.Start - ev.At
		}
	}
	// Requests already running when the fault hit fail too: count those cut
	// after it, once.
	for _, r := range records {
		if r.Start < ev.At && r.Start+r.E2E >= ev.At && !r.Completed && !r.Shed && r.Engine == engine {
			o.Failed++
		}
	}
	if ev.Name == "kill" || ev.Name == "freeze" {
		for _, sm := range samples {
			if sm.Engine != ev.Engine || sm.At < ev.At {
				continue
			}
			// An overload veto may already stand when the fault hits; the
			// exclusion the fault earns is a liveness veto or leaving Ready.
			if (sm.Vetoed && sm.Veto != "overload") || !sm.Ready {
				o.Excluded = sm.At - ev.At
				o.Verdict = sm.Veto
				if sm.Reason != "" {
					o.Verdict += " (" + sm.Reason + ")"
				}
				if !sm.Ready {
					o.Verdict += " not ready, health " + sm.Health
				}
				break
			}
		}
	}
	return o
}
