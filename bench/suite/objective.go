package suite

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/smg-project/smg/bench"
)

// The objective scenario: heterogeneous requests (prompts log-uniform over
// 64..16384 tokens, outputs 16..512) on engines whose KV cache a few long
// prompts fill, under a TTFT objective, against running windows alone and
// against nginx least_conn capped at the engines' window.
const (
	hetEngines = 2
	hetSlots   = 16
	hetKV      = 49152 // three 16k prompts fill it
	hetITLMs   = 10.0
)

// HetObjective is the TTFT objective of the scenario: a 16k-token prompt
// alone takes about 0.85 s to prefill at 20,000 tokens/s, so the objective
// leaves room for about as much work ahead again.
const HetObjective = 1500 * time.Millisecond

// hetWait is the room wait of the het-full-*-wait configurations: as long as
// the objective, so the objective's own bound is what ends a wait.
const hetWait = "1.5"

var (
	hetPrompt = bench.Dist{Min: 64, Max: 16384, Log: true}
	hetOutput = bench.Dist{Min: 16, Max: 512}
)

// hetSimArgs override the suite's engine flags (later flags win).
var hetSimArgs = []string{"--flavor", "sglang", "--max-running-requests", strconv.Itoa(hetSlots),
	"--kv-capacity-tokens", strconv.Itoa(hetKV), "--itl-ms", fmt.Sprint(hetITLMs)}

// ObjectiveConfigs are the scenario's configurations: nginx, running
// windows alone and windows under the objective, with 1 router and 3.
func ObjectiveConfigs() []GatewayConfig {
	obj := append(slices.Clone(windowFlags), "--ttft-objective-secs", strconv.FormatFloat(HetObjective.Seconds(), 'f', -1, 64))
	three := func(flags []string) []string { return append(slices.Clone(routerBase), flags...) }
	budget := append(slices.Clone(windowFlags), "--worker-token-budget", "--worker-overload-token-usage", "0.98")
	full := append(slices.Clone(budget), obj[len(windowFlags):]...)
	return []GatewayConfig{
		{Name: "het-nginx", Engines: hetEngines, NginxMaxConns: hetSlots, SimArgs: hetSimArgs,
			Why: fmt.Sprintf("nginx `least_conn`, `max_conns=%d` per engine (its window): a request finding every engine at its cap gets 502 at once", hetSlots)},
		{Name: "het-window-1r", Engines: hetEngines, Flags: windowFlags, SimArgs: hetSimArgs,
			Why: "running windows alone (16, reported by the engines), wait 0; 1 router"},
		{Name: "het-window-3r", Engines: hetEngines, Flags: windowFlags, SimArgs: hetSimArgs, Routers: 3, RouterFlags: three(windowFlags),
			Why: "the same, 3 routers sharing each window (client spreads requests over them in turn)"},
		{Name: "het-budget-1r", Engines: hetEngines, Flags: budget, SimArgs: hetSimArgs,
			Why: "running windows and token budgets (`--worker-token-budget`: each engine's 49152 KV tokens; the overload veto's KV usage raised to 0.98, as a budget fills KV by design), wait 0; 1 router"},
		{Name: "het-objective-1r", Engines: hetEngines, Flags: obj, SimArgs: hetSimArgs,
			Why: fmt.Sprintf("running windows and `--ttft-objective-secs %g`; 1 router", HetObjective.Seconds())},
		{Name: "het-objective-3r", Engines: hetEngines, Flags: obj, SimArgs: hetSimArgs, Routers: 3, RouterFlags: three(obj),
			Why: "the same, 3 routers sharing each window"},
		{Name: "het-full-1r", Engines: hetEngines, Flags: full, SimArgs: hetSimArgs,
			Why: "running windows, token budgets and the objective together; 1 router"},
		{Name: "het-full-3r", Engines: hetEngines, Flags: full, SimArgs: hetSimArgs,
			Routers: 3, RouterFlags: three(append(slices.Clone(obj), "--worker-token-budget")),
			Why: "the same, 3 routers sharing each window and budget"},
		{Name: "het-full-1r-wait", Engines: hetEngines, Flags: withFlag(full, "--worker-admission-wait-secs", hetWait), SimArgs: hetSimArgs,
			Why: fmt.Sprintf("het-full-1r with `--worker-admission-wait-secs %s`: a request whose worker that meets the objective is full may wait that long (at most what the objective leaves); with 0 it is refused at once", hetWait)},
		{Name: "het-full-3r-wait", Engines: hetEngines, Flags: withFlag(full, "--worker-admission-wait-secs", hetWait), SimArgs: hetSimArgs,
			Routers: 3, RouterFlags: three(append(withFlag(obj, "--worker-admission-wait-secs", hetWait), "--worker-token-budget")),
			Why: "the same, 3 routers sharing each window and budget"},
		{Name: "het-objective-3r-fresh", Engines: hetEngines, Flags: append(slices.Clone(obj), "--watch-load-interval", "0"),
			SimArgs: hetSimArgs, Routers: 3, RouterFlags: three(obj),
			Why: "the same, the control plane sending every load at once (`--watch-load-interval 0`): the other routers' work ahead a report (250 ms) late instead of up to a second more"},
	}
}

// ObjectiveRun is one configuration at one offered load.
type ObjectiveRun struct {
	Config  string        `json:"config"`
	Load    float64       `json:"load"`
	Rate    float64       `json:"rate"`
	Summary bench.Summary `json:"summary"`
	// Admitted requests reached an engine (an answer began, or the client
	// gave up waiting for one); Met are those completed with a TTFT within
	// the objective; Refused were answered at once without an engine.
	Admitted int `json:"admitted"`
	Met      int `json:"met"`
	Refused  int `json:"refused"`
	// RefusalSecs are the client-measured times to a refusal, and
	// RefusalTimes each of them, pooled over the loads for the target: one
	// run's p99 of a few dozen refusals is its slowest one.
	RefusalSecs  bench.Percentiles `json:"refusal_seconds"`
	RefusalTimes []float64         `json:"refusal_times,omitempty"`
	// Prediction is the routers' smg_ttft_prediction_ratio over the run.
	Prediction RatioStats `json:"prediction"`
	// Engines' own high-water marks over the run.
	PeakRunning int `json:"peak_running"`
	PeakWaiting int `json:"peak_waiting"`
}

// Attainment is the share of admitted requests that met the objective.
func (r ObjectiveRun) Attainment() float64 { return float64(r.Met) / float64(max(r.Admitted, 1)) }

// ObjectiveReport is the whole scenario.
type ObjectiveReport struct {
	Capacity     Capacity        `json:"capacity"`
	Configs      []GatewayConfig `json:"configs"`
	Loads        []float64       `json:"loads"`
	RunSeconds   float64         `json:"run_seconds"`
	TimeoutSecs  float64         `json:"timeout_seconds"`
	Objective    float64         `json:"ttft_objective_seconds"`
	Output       bench.Dist      `json:"output_tokens"`
	Runs         []ObjectiveRun  `json:"runs"`
	Took         float64         `json:"took_seconds"`
	LoadAvgStart string          `json:"loadavg_start"`
	LoadAvgEnd   string          `json:"loadavg_end"`
}

// Run finds one configuration at one load.
func (r *ObjectiveReport) Run(config string, load float64) (ObjectiveRun, bool) {
	for _, run := range r.Runs {
		if run.Config == config && run.Load == load {
			return run, true
		}
	}
	return ObjectiveRun{}, false
}

// refusalP99 is the p99 of config's refusals over every load, or, for a
// report without each refusal's time, the slowest of its runs' p99s.
func (r *ObjectiveReport) refusalP99(config string) float64 {
	var pooled []float64
	var slowest float64
	complete := true
	for _, run := range r.Runs {
		if run.Config == config {
			pooled = append(pooled, run.RefusalTimes...)
			slowest = max(slowest, run.RefusalSecs.P99)
			complete = complete && len(run.RefusalTimes) == run.Refused
		}
	}
	if !complete {
		return slowest
	}
	return bench.PercentilesOf(pooled).P99
}

// Objectives offers 1×, 2× and 4× of the heterogeneous fleet's measured
// capacity to each configuration, a fresh fleet and gateway for every run.
// A short run offers 2× to the objective configuration with 1 router only.
func (s *Suite) Objectives(ctx context.Context) (*ObjectiveReport, error) {
	began := time.Now()
	rep := &ObjectiveReport{Configs: ObjectiveConfigs(), Loads: []float64{1, 2, 4}, RunSeconds: 15, TimeoutSecs: 20,
		Objective: HetObjective.Seconds(), Output: hetOutput, LoadAvgStart: loadAvg()}
	if s.Short {
		// Short answers: the smoke test's streams end well within its timeout
		// however loaded the machine.
		rep.Loads, rep.RunSeconds, rep.TimeoutSecs, rep.Output = []float64{2}, 3, 10, bench.Dist{Min: 16, Max: 64}
		rep.Configs = slices.DeleteFunc(rep.Configs, func(gc GatewayConfig) bool { return gc.Name != "het-objective-1r" })
		rep.Capacity = hetNominalCapacity(rep.Output)
	} else if len(s.Configs) > 0 {
		rep.Configs = slices.DeleteFunc(rep.Configs, func(gc GatewayConfig) bool { return !slices.Contains(s.Configs, gc.Name) })
	}
	if len(s.Loads) > 0 && !s.Short {
		rep.Loads = s.Loads
	}
	if s.Capacity > 0 && !s.Short {
		rep.Capacity = Capacity{ReqPerSec: s.Capacity, TokensPerSec: s.Capacity * rep.Output.Mean()}
	}
	if rep.Capacity.ReqPerSec == 0 {
		c, err := s.calibrate(ctx, GatewayConfig{Engines: hetEngines, Flags: []string{"--disable-worker-overload-protection"}, SimArgs: hetSimArgs},
			hetEngines*hetSlots, hetPrompt, hetOutput, 20*time.Second)
		if err != nil {
			return nil, fmt.Errorf("calibration: %w", err)
		}
		rep.Capacity = c
	}
	for _, load := range rep.Loads {
		// Loads outermost: a change in the machine's load shows in every
		// configuration alike rather than in one.
		for _, gc := range rep.Configs {
			run, err := s.objectiveRun(ctx, gc, load, rep)
			if err != nil {
				return rep, fmt.Errorf("%s at %.1fx: %w", gc.Name, load, err)
			}
			rep.Runs = append(rep.Runs, run)
			s.logf("%-16s %.0fx: %d req, admitted %d, met %.1f%%, refused %d (p99 %.1f ms), goodput %.0f tok/s, prediction p50 %.2f p90 %.2f (n %d)",
				gc.Name, load, run.Summary.Requests, run.Admitted, 100*run.Attainment(), run.Refused, run.RefusalSecs.P99*1000,
				run.Summary.Goodput, run.Prediction.P50, run.Prediction.P90, run.Prediction.N)
		}
	}
	rep.Took = time.Since(began).Seconds()
	rep.LoadAvgEnd = loadAvg()
	return rep, s.writeJSON("objectives.json", rep)
}

// hetNominalCapacity is what the heterogeneous fleet's parameters promise
// (short runs use it instead of a calibration run).
func hetNominalCapacity(output bench.Dist) Capacity {
	service := hetPrompt.Mean()/prefillRate + output.Mean()*hetITLMs/1000*(1+itlGrowth*(hetSlots-1))
	rps := hetEngines * hetSlots / service
	return Capacity{ReqPerSec: rps, TokensPerSec: rps * output.Mean()}
}

func (s *Suite) objectiveRun(ctx context.Context, gc GatewayConfig, load float64, rep *ObjectiveReport) (ObjectiveRun, error) {
	e, err := s.startConfig(ctx, gc)
	if err != nil {
		return ObjectiveRun{}, err
	}
	defer e.stop()
	routers := e.urls
	if len(routers) == 0 {
		routers = []string{e.url()}
	}
	before := scrapeRatios(ctx, routers, gc)
	rate := load * rep.Capacity.ReqPerSec
	label := fmt.Sprintf("%s %.0fx", gc.Name, load)
	e.fleet.simStats(ctx, true)
	cfg := bench.Config{URL: e.url(), URLs: e.urls, Rate: rate, Duration: time.Duration(rep.RunSeconds * float64(time.Second)),
		Prompt: hetPrompt, Output: rep.Output, Timeout: time.Duration(rep.TimeoutSecs * float64(time.Second)),
		TTFTObjective: HetObjective, Seed: s.Seed + uint64(load*10)}
	res, err := bench.Run(ctx, s.httpClient(), cfg, progressLogger(s, label))
	if err != nil {
		return ObjectiveRun{}, err
	}
	after := scrapeRatios(ctx, routers, gc)
	run := ObjectiveRun{Config: gc.Name, Load: load, Rate: rate, Summary: res.Summary, Prediction: after.since(before)}
	marks := e.fleet.simStats(ctx, false)
	run.PeakRunning, run.PeakWaiting = marks.PeakRunning, marks.PeakWaiting
	for _, r := range res.Records {
		switch {
		case r.Completed || r.Status == http.StatusOK || r.Error == "timeout":
			run.Admitted++
			if r.Completed && r.TTFT <= HetObjective.Seconds() {
				run.Met++
			}
		case r.Status == http.StatusServiceUnavailable || r.Status == http.StatusTooManyRequests || r.Status == http.StatusBadGateway:
			run.Refused++
			run.RefusalTimes = append(run.RefusalTimes, r.E2E)
		}
	}
	run.RefusalSecs = bench.PercentilesOf(run.RefusalTimes)
	res.Scenario = label
	return run, s.writeJSON(fmt.Sprintf("objective-%s-%.0fx.json", gc.Name, load), res)
}

// RatioStats summarise a histogram of observed/predicted TTFT.
type RatioStats struct {
	N int `json:"n"`
	// P50 and P90 are read off the buckets, linear within one.
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	// InBand is the share of ratios in (0.7, 1.4] (bucket bounds).
	InBand float64 `json:"in_band"`

	bounds []float64 // bucket upper bounds, ascending (+Inf last)
	counts []float64 // cumulative counts per bound
}

// since is h less an earlier scrape of the same histogram.
func (h RatioStats) since(old RatioStats) RatioStats {
	out := RatioStats{bounds: h.bounds, counts: slices.Clone(h.counts)}
	if len(old.counts) == len(h.counts) {
		for i := range out.counts {
			out.counts[i] -= old.counts[i]
		}
	}
	out.fill()
	return out
}

func (h *RatioStats) fill() {
	if len(h.counts) == 0 || h.counts[len(h.counts)-1] <= 0 {
		return
	}
	total := h.counts[len(h.counts)-1]
	h.N = int(total)
	h.P50, h.P90 = h.quantile(0.5), h.quantile(0.9)
	var lo, hi float64
	for i, b := range h.bounds {
		if b == 0.7 {
			lo = h.counts[i]
		}
		if b == 1.4 {
			hi = h.counts[i]
		}
	}
	h.InBand = (hi - lo) / total
}

// quantile interpolates linearly inside the bucket holding q; in the +Inf
// bucket it answers the last finite bound.
func (h *RatioStats) quantile(q float64) float64 {
	total := h.counts[len(h.counts)-1]
	want := q * total
	prevBound, prevCount := 0.0, 0.0
	for i, b := range h.bounds {
		c := h.counts[i]
		if c >= want {
			if math.IsInf(b, 1) {
				return prevBound
			}
			if c == prevCount {
				return b
			}
			return prevBound + (b-prevBound)*(want-prevCount)/(c-prevCount)
		}
		prevBound, prevCount = b, c
	}
	return prevBound
}

// scrapeRatios sums smg_ttft_prediction_ratio over the routers' /metrics
// (nothing for a configuration without smg routers).
func scrapeRatios(ctx context.Context, routers []string, gc GatewayConfig) RatioStats {
	var h RatioStats
	if gc.NginxMaxConns > 0 {
		return h
	}
	for _, u := range routers {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u+"/metrics", nil)
		if err != nil {
			continue
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			continue
		}
		bounds, counts := parseBuckets(resp.Body, "smg_ttft_prediction_ratio_bucket")
		resp.Body.Close()
		if h.bounds == nil {
			h.bounds, h.counts = bounds, counts
		} else if len(counts) == len(h.counts) {
			for i := range counts {
				h.counts[i] += counts[i]
			}
		}
	}
	h.fill()
	return h
}

// parseBuckets reads one unlabelled histogram's buckets from a Prometheus
// text exposition.
func parseBuckets(r io.Reader, name string) (bounds, counts []float64) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name+`{le="`)
		if !ok {
			continue
		}
		le, val, ok := strings.Cut(rest, `"} `)
		if !ok {
			continue
		}
		b, err1 := strconv.ParseFloat(le, 64)
		c, err2 := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err1 != nil || err2 != nil {
			continue
		}
		bounds, counts = append(bounds, b), append(counts, c)
	}
	return bounds, counts
}

// WriteObjectiveTable writes the scenario as a markdown table.
func WriteObjectiveTable(w io.Writer, rep *ObjectiveReport) {
	fmt.Fprintf(w, "| config | load | offered req/s | admitted | refused | met objective (of admitted) | TTFT p50 | TTFT p99 | goodput within objective tok/s | refusal p99 | prediction observed/predicted p50, p90 (n) | engine peak running / waiting |\n")
	fmt.Fprintf(w, "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rep.Runs {
		s := r.Summary
		pred := "-"
		if r.Prediction.N > 0 {
			pred = fmt.Sprintf("%.2f, %.2f (%d)", r.Prediction.P50, r.Prediction.P90, r.Prediction.N)
		}
		refusal := "-"
		if r.Refused > 0 {
			refusal = fmt.Sprintf("%.1f ms", r.RefusalSecs.P99*1000)
		}
		fmt.Fprintf(w, "| %s | %.0f× | %.1f | %d | %d | %.1f%% | %s | %s | %.0f | %s | %s | %d / %d |\n",
			r.Config, r.Load, s.OfferedRate, r.Admitted, r.Refused, 100*r.Attainment(), msStr(s.TTFT.P50), msStr(s.TTFT.P99),
			s.Goodput, refusal, pred, r.PeakRunning, r.PeakWaiting)
	}
}

// objectiveTargets writes the targets against the report: for the
// configuration with every admission rule on (het-full), else the
// objective alone (het-objective), against windows alone and nginx.
func objectiveTargets(w io.Writer, rep *ObjectiveReport) {
	fmt.Fprintf(w, "| config | attainment at 2× (≥ 97%%) | at 4× (≥ 97%%) | goodput at 2× / windows alone (≥ 1.2) | / nginx (≥ 2) | refusal p99, every load's pooled (< 10 ms) | prediction p90 at 1× (0.7-1.4) |\n")
	fmt.Fprintf(w, "|---|---|---|---|---|---|---|\n")
	for _, n := range []string{"1r", "3r"} {
		cfg := "het-full-" + n
		if _, ok := rep.Run(cfg, 2); !ok {
			cfg = "het-objective-" + n
		}
		o2, ok2 := rep.Run(cfg, 2)
		o4, ok4 := rep.Run(cfg, 4)
		refusalP99 := rep.refusalP99(cfg)
		o1, ok1 := rep.Run(cfg, 1)
		w2, okw := rep.Run("het-window-"+n, 2)
		ng, okn := rep.Run("het-nginx", 2)
		if !ok2 || !ok4 || !ok1 || !okw || !okn {
			continue
		}
		fmt.Fprintf(w, "| %s | %.1f%% %s | %.1f%% %s | %.2f %s | %.2f %s | %.1f ms %s | %.2f %s |\n", cfg,
			100*o2.Attainment(), metStr(o2.Attainment() >= 0.97), 100*o4.Attainment(), metStr(o4.Attainment() >= 0.97),
			o2.Summary.Goodput/w2.Summary.Goodput, metStr(o2.Summary.Goodput >= 1.2*w2.Summary.Goodput),
			o2.Summary.Goodput/ng.Summary.Goodput, metStr(o2.Summary.Goodput >= 2*ng.Summary.Goodput),
			refusalP99*1000, metStr(refusalP99 < 0.010),
			o1.Prediction.P90, metStr(o1.Prediction.P90 >= 0.7 && o1.Prediction.P90 <= 1.4))
	}
}

// PublishObjectives writes the scenario into docs/benchmarks.md.
func (s *Suite) PublishObjectives(rep *ObjectiveReport) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "### TTFT objectives: heterogeneous requests at 1×, 2× and 4× of measured capacity\n\n")
	fmt.Fprintf(&b, "`make bench-overload` (this scenario alone: `go run ./bench/cmd/benchsuite --bin bin/smg --suite objectives`; "+
		"`--republish` redraws the tables and plots from the last run's JSON). ")
	fmt.Fprintf(&b, "%d engines (`smg sim %s`: window %d, KV %d tokens, %.0f ms decode steps growing 2%% per running request, %.0f prompt tokens/s); "+
		"prompts log-uniform over %s tokens, outputs %s tokens (uniform); TTFT objective %g s. "+
		"Capacity (closed loop, %d clients, %.0f s): **%.1f req/s, %.0f output tokens/s**. "+
		"Each run: %.0f s of Poisson arrivals, request timeout %.0f s. Run took %.0f s in all; load average (1, 5, 15 min) %s at the start, %s at the end, on %s.\n\n",
		hetEngines, strings.Join(hetSimArgs, " "), hetSlots, hetKV, hetITLMs, prefillRate, hetPrompt.String(), rep.Output.String(), rep.Objective,
		rep.Capacity.Clients, rep.Capacity.Seconds, rep.Capacity.ReqPerSec, rep.Capacity.TokensPerSec,
		rep.RunSeconds, rep.TimeoutSecs, rep.Took, rep.LoadAvgStart, rep.LoadAvgEnd, Machine())
	fmt.Fprintf(&b, "| config | gateway flags (plus `%s`) |\n|---|---|\n", strings.Join(gatewayBase, " "))
	for _, gc := range rep.Configs {
		flags := strings.Join(gc.Flags, " ")
		if gc.NginxMaxConns > 0 {
			flags = "nginx"
		}
		fmt.Fprintf(&b, "| %s | `%s`: %s |\n", gc.Name, flags, gc.Why)
	}
	b.WriteString("\nAdmitted: the request reached an engine (its answer began). Met: completed with a client-measured TTFT within the objective. " +
		"Goodput within objective: output tokens/s of the requests that met it. Refusals: 503 (smg) or 502 (nginx at its caps), timed by the client. " +
		"Prediction: the routers' `smg_ttft_prediction_ratio` over the run (quantiles read off its buckets).\n\n")
	WriteObjectiveTable(&b, rep)
	b.WriteString("\nTargets:\n\n")
	objectiveTargets(&b, rep)
	b.WriteString("\n![Share of admitted requests meeting the objective](img/objectives-attainment.png)\n\n![Goodput within the objective](img/objectives-goodput.png)\n")
	return replaceBlock(filepath.Join(s.DocsDir, "benchmarks.md"), "bench-objectives", b.String())
}

// nginxEnv starts nginx in front of f's engines with max_conns per engine.
func (s *Suite) startNginxFor(f *Fleet, maxConns int) (*Proc, string, string, error) {
	bin, err := findNginx()
	if err != nil {
		return nil, "", "", err
	}
	dir, err := os.MkdirTemp("", "smg-nginx-")
	if err != nil {
		return nil, "", "", err
	}
	p, url, err := startNginx(bin, dir, f.URLs, maxConns, 2, nil)
	if err != nil {
		os.RemoveAll(dir)
	}
	return p, url, dir, err
}
