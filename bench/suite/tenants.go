package suite

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/smg-project/smg/bench"
)

// The tenant scenario: on the overload scenario's fleet, behind 3 routers
// with running windows, room loans between them (a steady tenant's headroom
// is pooled over the routers) and the priority scheduler's fair shares, a
// steady tenant sends 0.3× of capacity while a flooding tenant sends 10× its
// fair share (half the capacity each: 5×). The steady tenant's p99 TTFT is
// compared with its value when it is alone.
const (
	steadyLoad = 0.3
	floodLoad  = 5.0
)

// fairYAML: two tenants of equal weight; a tenant over its fair share is
// refused (429), and in its first holding time past the share a tenant not
// seen yet would leave it (newcomer_headroom); one wanting more than its
// weighted share fills the engines in the fleet's fixed order, leaving the
// others' headroom on the rest (pack_over_share); a request under it waits at
// most 100 ms for a slot in the router. The higher classes reserve nothing: SMG's default reservations
// (system 32, interactive 128) exceed a router's share of this fleet, and
// scaled down to fit it they would hold back nearly every slot from the
// default class these tenants send.
const fairYAML = `
classes:
  system: {reserved: 0}
  interactive: {reserved: 0}
  default: {queue_size: 256, queue_timeout_secs: 0.1}
fair_share: {enabled: true, newcomer_headroom: true, pack_over_share: true}
api_keys:
  sk-bench-steady: steady
  sk-bench-flood: flood
tenant_policies:
  "auth:steady": {max_class: default}
  "auth:flood": {max_class: default}
`

// fairNoShareYAML is the same without fair shares: what they buy.
var fairNoShareYAML = strings.Replace(fairYAML, "fair_share: {enabled: true, newcomer_headroom: true, pack_over_share: true}", "", 1)

// TenantConfigs are the scenario's configurations, each with 3 routers.
func TenantConfigs() []GatewayConfig {
	flags := append(slices.Clone(windowFlags), "--priority-scheduler-enabled")
	three := append(slices.Clone(routerBase), flags...)
	steady := bench.PriorityShare{Class: "default", Label: "steady", Weight: steadyLoad, APIKey: "sk-bench-steady"}
	flood := bench.PriorityShare{Class: "default", Label: "flood", Weight: floodLoad, APIKey: "sk-bench-flood"}
	sglang := []string{"--flavor", "sglang"}
	return []GatewayConfig{
		{Name: "tenants-alone", Flags: flags, Routers: 3, Handoff: true, RouterFlags: three, SimArgs: sglang, SchedulerYAML: fairYAML,
			Priorities: []bench.PriorityShare{steady},
			Why:        fmt.Sprintf("the steady tenant alone at %.1f× of capacity; running windows, fair shares on, 3 routers, each listing the others in `--peer-routers` (pooled headroom)", steadyLoad)},
		{Name: "tenants-flood", Flags: flags, Routers: 3, Handoff: true, RouterFlags: three, SimArgs: sglang, SchedulerYAML: fairYAML,
			Priorities: []bench.PriorityShare{steady, flood},
			Why:        fmt.Sprintf("the same, and the flooding tenant at %.0f× of capacity (10× its fair share)", floodLoad)},
		{Name: "tenants-flood-noshare", Flags: flags, Routers: 3, Handoff: true, RouterFlags: three, SimArgs: sglang, SchedulerYAML: fairNoShareYAML,
			Priorities: []bench.PriorityShare{steady, flood},
			Why:        "the same flood without fair shares (windows and the scheduler alone)"},
	}
}

// TenantRun is one configuration's run.
type TenantRun struct {
	Config   string                   `json:"config"`
	Rate     float64                  `json:"rate"`
	ByTenant map[string]bench.Summary `json:"by_tenant"`
	// Refused429 counts the flooding tenant's 429 answers.
	Refused429 int `json:"refused_429"`
	// Refusals counts each tenant's refusals by error code.
	Refusals map[string]map[string]int `json:"refusals"`
	// SteadyTTFT holds the steady tenant's TTFT of each completed request,
	// pooled over the rounds for the target: one round's p99 is its
	// second-slowest answer or so.
	SteadyTTFT []float64 `json:"steady_ttft,omitempty"`
}

// TenantReport is the whole scenario.
type TenantReport struct {
	Capacity     Capacity        `json:"capacity"`
	Configs      []GatewayConfig `json:"configs"`
	RunSeconds   float64         `json:"run_seconds"`
	Runs         []TenantRun     `json:"runs"`
	Took         float64         `json:"took_seconds"`
	LoadAvgStart string          `json:"loadavg_start"`
	LoadAvgEnd   string          `json:"loadavg_end"`
}

// Tenants runs each configuration once, alone and flood alternating
// rounds times (the steady tenant's p99 is a few requests' worth).
func (s *Suite) Tenants(ctx context.Context, rounds int) (*TenantReport, error) {
	began := time.Now()
	rep := &TenantReport{Configs: TenantConfigs(), RunSeconds: 20, LoadAvgStart: loadAvg()}
	switch {
	case s.Short:
		rep.RunSeconds, rep.Capacity = 3, nominalCapacity()
	case s.Capacity > 0:
		rep.Capacity = Capacity{ReqPerSec: s.Capacity, TokensPerSec: s.Capacity * outputDist.Mean()}
	default:
		c, err := s.Calibrate(ctx)
		if err != nil {
			return nil, fmt.Errorf("calibration: %w", err)
		}
		rep.Capacity = c
	}
	if len(s.Configs) > 0 {
		rep.Configs = slices.DeleteFunc(rep.Configs, func(gc GatewayConfig) bool { return !slices.Contains(s.Configs, gc.Name) })
	}
	for round := range max(rounds, 1) {
		for _, gc := range rep.Configs {
			var total float64
			for _, p := range gc.Priorities {
				total += p.Weight
			}
			e, err := s.startConfig(ctx, gc)
			if err != nil {
				return rep, fmt.Errorf("%s: %w", gc.Name, err)
			}
			rate := total * rep.Capacity.ReqPerSec
			res, err := bench.Run(ctx, s.httpClient(), bench.Config{URL: e.url(), URLs: e.urls, Rate: rate,
				Duration: time.Duration(rep.RunSeconds * float64(time.Second)), Prompt: promptDist, Output: outputDist,
				Timeout: 15 * time.Second, TTFTObjective: TTFTObjective, Seed: s.Seed + uint64(round), Priorities: gc.Priorities},
				progressLogger(s, gc.Name))
			e.stop()
			if err != nil {
				return rep, fmt.Errorf("%s: %w", gc.Name, err)
			}
			run := TenantRun{Config: fmt.Sprintf("%s#%d", gc.Name, round+1), Rate: rate, ByTenant: res.ByClass,
				Refusals: map[string]map[string]int{}}
			for _, r := range res.Records {
				if r.Status == 429 {
					run.Refused429++
				}
				if r.Priority == "steady" && r.Completed {
					run.SteadyTTFT = append(run.SteadyTTFT, r.TTFT)
				}
				if r.Shed {
					if run.Refusals[r.Priority] == nil {
						run.Refusals[r.Priority] = map[string]int{}
					}
					run.Refusals[r.Priority][r.ErrorCode]++
				}
			}
			rep.Runs = append(rep.Runs, run)
			// Each request's record, for reading where the refusals and the slow answers fall in a run.
			if err := s.writeJSON(fmt.Sprintf("tenants-%s-%d.json", gc.Name, round+1), res.Records); err != nil {
				return rep, err
			}
			st := run.ByTenant["steady"]
			s.logf("%-22s steady: %d req, ok %d, refused %d, TTFT p50 %.0f ms p99 %.0f ms; flood: ok %d, 429 %d",
				run.Config, st.Requests, st.Completed, st.Shed+st.Errors, st.TTFT.P50*1000, st.TTFT.P99*1000,
				run.ByTenant["flood"].Completed, run.Refused429)
		}
	}
	rep.Took = time.Since(began).Seconds()
	rep.LoadAvgEnd = loadAvg()
	return rep, s.writeJSON("tenants.json", rep)
}

// WriteTenantTable writes one row per run and tenant.
func WriteTenantTable(w io.Writer, rep *TenantReport) {
	fmt.Fprintf(w, "| run | tenant | offered req/s | completed | refused | errors | TTFT p50 | TTFT p99 | goodput tok/s |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rep.Runs {
		for _, t := range []string{"steady", "flood"} {
			s, ok := r.ByTenant[t]
			if !ok {
				continue
			}
			fmt.Fprintf(w, "| %s | %s | %.1f | %d | %s | %d | %s | %s | %.0f |\n", r.Config, t, s.OfferedRate, s.Completed,
				refusalStr(s.Shed, r.Refusals[t]), s.Errors, msStr(s.TTFT.P50), msStr(s.TTFT.P99), s.Goodput)
		}
	}
}

// refusalStr is a count of refusals and, when any, their codes.
func refusalStr(n int, byCode map[string]int) string {
	if n == 0 || len(byCode) == 0 {
		return fmt.Sprint(n)
	}
	codes := slices.Sorted(maps.Keys(byCode))
	parts := make([]string, len(codes))
	for i, c := range codes {
		parts[i] = fmt.Sprintf("%d `%s`", byCode[c], c)
	}
	return fmt.Sprintf("%d (%s)", n, strings.Join(parts, ", "))
}

// PublishTenants writes the scenario into docs/benchmarks.md.
func (s *Suite) PublishTenants(rep *TenantReport) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "### Fair shares: a steady tenant beside a flooding one, 3 routers\n\n")
	fmt.Fprintf(&b, "`make bench-overload` (this scenario alone: `go run ./bench/cmd/benchsuite --bin bin/smg --suite tenants`; "+
		"`--tenant-rounds` sets the rounds). ")
	fmt.Fprintf(&b, "The overload scenario's fleet (4 engines, window 8; prompts %s, outputs %s tokens), capacity %.1f req/s. "+
		"Each run: %.0f s of Poisson arrivals. Took %.0f s; load average %s at the start, %s at the end, on %s.\n\n",
		promptDist, outputDist, rep.Capacity.ReqPerSec, rep.RunSeconds, rep.Took, rep.LoadAvgStart, rep.LoadAvgEnd, Machine())
	fmt.Fprintf(&b, "| config | what |\n|---|---|\n")
	for _, gc := range rep.Configs {
		fmt.Fprintf(&b, "| %s | `%s` and the scheduler YAML below: %s |\n", gc.Name, strings.Join(gc.Flags, " "), gc.Why)
	}
	fmt.Fprintf(&b, "\n```yaml%s```\n\n", fairYAML)
	WriteTenantTable(&b, rep)
	writeTenantTarget(&b, rep.Runs)
	return replaceBlock(filepath.Join(s.DocsDir, "benchmarks.md"), "bench-tenants", b.String())
}

// writeTenantTarget compares the steady tenant's p99 TTFT beside the flood
// with its value alone: pooled over every round's answers, and per round.
func writeTenantTarget(w io.Writer, runs []TenantRun) {
	var alone, flood []float64 // pooled answers
	var aloneP99, floodP99 []float64
	var refused, sent int
	for _, r := range runs {
		st := r.ByTenant["steady"]
		switch {
		case strings.HasPrefix(r.Config, "tenants-alone#"):
			alone, aloneP99 = append(alone, r.SteadyTTFT...), append(aloneP99, st.TTFT.P99)
		case strings.HasPrefix(r.Config, "tenants-flood#"):
			flood, floodP99 = append(flood, r.SteadyTTFT...), append(floodP99, st.TTFT.P99)
			refused, sent = refused+st.Shed, sent+st.Requests
		}
	}
	a, f := bench.PercentilesOf(alone), bench.PercentilesOf(flood)
	if a.N == 0 || f.N == 0 {
		return
	}
	var ratios []float64
	for i := range min(len(aloneP99), len(floodP99)) {
		if aloneP99[i] > 0 {
			ratios = append(ratios, floodP99[i]/aloneP99[i])
		}
	}
	fmt.Fprintf(w, "\nTarget: the steady tenant's p99 TTFT beside the flood within 1.2× of its value alone: %s against %s over all %d rounds' answers (%d and %d), %.2f×: %s. ",
		msStr(f.P99), msStr(a.P99), len(floodP99), f.N, a.N, f.P99/a.P99, metStr(f.P99 <= 1.2*a.P99))
	if len(ratios) > 0 {
		fmt.Fprintf(w, "Per round: %.2f-%.2f× (median %.2f×). ", slices.Min(ratios), slices.Max(ratios), median(ratios))
	}
	fmt.Fprintf(w, "Beside the flood with fair shares the steady tenant was refused %d times in %d requests.\n", refused, sent)
}
