package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/smg-project/smg/bench/scale"
	"github.com/smg-project/smg/bench/suite"
)

// scaleRuns are the configurations of make bench-scale: cost against R
// (routers) with the verdict fan-out, the shared encoding against the
// per-stream baseline side by side, cost against N (workers reporting 20
// times a second through agents), and the full size: 10,000 workers and
// 1,000 routers.
func scaleRuns(short bool) []scale.Config {
	if short {
		return []scale.Config{
			{Name: "short", Workers: 200, Agents: 4, AgentProcs: 1, ReportRate: 5, Routers: 20, RouterProcs: 2, FlipRate: 10, Joins: 2},
			{Name: "floor-short", Floor: true, Workers: 200, Agents: 4, AgentProcs: 1, Routers: 20, RouterProcs: 2, FlipRate: 10},
		}
	}
	fan := func(r int, perStream bool) scale.Config {
		name := fmt.Sprintf("fanout-R%d", r)
		if perStream {
			name += "-per-stream"
		}
		return scale.Config{Name: name, Workers: 1000, Agents: 10, AgentProcs: 1, ReportRate: 0.5,
			Routers: r, RouterProcs: 4, FlipRate: 20, Joins: 3, PerStream: perStream}
	}
	// The floor beside each fan-out run: a bare gRPC server sending the same
	// changes to the same routers (scale.Config.Floor).
	floor := func(r int) scale.Config {
		c := fan(r, false)
		c.Name, c.Floor = fmt.Sprintf("floor-R%d", r), true
		return c
	}
	ingest := func(n int) scale.Config {
		return scale.Config{Name: fmt.Sprintf("ingest-N%d", n), Workers: n, Agents: max(n/100, 1), AgentProcs: 2,
			ReportRate: 20, Routers: 10, RouterProcs: 1, FlipRate: 10, Joins: 3}
	}
	return []scale.Config{
		fan(100, false), floor(100), fan(250, false), floor(250), fan(500, false), floor(500), fan(1000, false), floor(1000),
		fan(500, true), fan(1000, true),
		ingest(1000), ingest(2500), ingest(5000), ingest(10000),
		// The full size, loads to routers at the spec's load refresh (10 s).
		{Name: "full-N10000-R1000", Workers: 10000, Agents: 100, AgentProcs: 2, ReportRate: 20,
			Routers: 1000, RouterProcs: 4, FlipRate: 10, Joins: 3, LoadInterval: 10 * time.Second},
	}
}

// runScale runs the scale harness (make bench-scale) and, unless short or
// given one configuration, writes docs/benchmarks.md's scale section and
// docs/img/scale-*.png.
func runScale(ctx context.Context, docs, raw string, short bool, only string, window time.Duration) error {
	runs := scaleRuns(short)
	if only != "" {
		var c scale.Config
		if err := json.Unmarshal([]byte(only), &c); err != nil {
			return fmt.Errorf("--scale-config: %w", err)
		}
		runs, docs = []scale.Config{c}, ""
	}
	var results []*scale.Result
	for _, c := range runs {
		if c.Warmup == 0 {
			c.Warmup = 2 * time.Second // after the fleet has settled (every worker reported, every router watching)
		}
		if c.Duration == 0 {
			c.Duration = window
		}
		if short {
			c.Warmup, c.Duration = 2*time.Second, 3*time.Second
		}
		c.Log = os.Stderr
		runtime.GC()
		debug.FreeOSMemory() // each run's memory figure is its own
		res, err := scale.Run(ctx, c)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil { // a run that cannot finish is a row saying why; the others still count
			fmt.Fprintf(os.Stderr, "benchsuite: %s: %v\n", c.Name, err)
			res = &scale.Result{Config: c, Errors: []string{err.Error()}}
		}
		results = append(results, res)
		if err := os.MkdirAll(raw, 0o755); err == nil { // after every run: a long suite loses nothing
			if b, err := json.MarshalIndent(results, "", " "); err == nil {
				_ = os.WriteFile(filepath.Join(raw, "scale.json"), b, 0o644)
			}
		}
	}
	writeScaleTable(os.Stdout, results)
	if short || docs == "" {
		return nil
	}
	return publishScale(results, docs)
}

func writeScaleTable(w io.Writer, rs []*scale.Result) {
	fmt.Fprintln(w, "| run | N workers | reports/s (target) | R routers | CP CPU (cores) | agents / routers CPU (cores) | CP heap / RSS (MiB) | report→verdict p50 / p99 (ms) | verdict→CP's last send p50 / p99 (ms) | verdict→all routers p50 / p99 (ms) | CP CPU per router per change (µs) | marginal: CP CPU per router per change (µs), × the floor | marginal: writes / reads per message sent | router lag p99 (revisions) | join p50 / max (ms): from the 1st router process; alone, snapshot (KiB) | allocs per report | watch messages encoded / sent | CP CPU per message sent (µs) | load avg |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rs {
		c := r.Config
		fmt.Fprintf(w, "| %s | %d | %.0f (%.0f) | %d | %.2f | %.2f / %.2f | %.0f / %.0f | %.1f / %.1f | %.1f / %.1f | %.1f / %.1f | %.1f | %s | %.2f / %.2f | %.0f | %.0f / %.0f; %.0f / %.0f, %.0f | %.0f | %.0f / %.0f | %.1f | %.0f |\n",
			c.Name, c.Workers, r.ReportsPerSec, r.ReportTarget, c.Routers, r.CPUCores, r.AgentCPUCores, r.RouterCPUCores, r.HeapMiB, r.RSSMiB,
			r.ReportToVerdict.P50, r.ReportToVerdict.P99, r.VerdictSentAll.P50, r.VerdictSentAll.P99, r.VerdictToRouters.P50, r.VerdictToRouters.P99,
			r.CPUPerRouterChangeUs, againstFloor(r, rs), r.Marginal.WritesPerSent, r.Marginal.ReadsPerSent,
			r.LagP99, r.Join.P50, r.Join.Max, r.JoinAlone.P50, r.JoinAlone.Max, r.SnapshotKiB, r.AllocsPerReport, r.Encoded, r.Sent, r.CPUPerSentUs, r.LoadAvg)
		if len(r.Errors) > 0 {
			fmt.Fprintf(w, "|  | errors: %s |\n", strings.Join(r.Errors, "; "))
		}
		if len(r.Warnings) > 0 {
			fmt.Fprintf(w, "|  | control plane warnings: %s |\n", strings.Join(r.Warnings, "; "))
		}
	}
}

// againstFloor is r's marginal CPU per router per change and, when the
// results hold a floor run with as many routers, its ratio to the floor's.
func againstFloor(r *scale.Result, rs []*scale.Result) string {
	m := r.Marginal.PerRouterChangeUs
	if r.Config.Floor {
		return fmt.Sprintf("%.1f (the floor)", m)
	}
	for _, f := range rs {
		if f.Config.Floor && f.Config.Routers == r.Config.Routers && f.Marginal.PerRouterChangeUs > 0 {
			return fmt.Sprintf("%.1f, %.2fx", m, m/f.Marginal.PerRouterChangeUs)
		}
	}
	return fmt.Sprintf("%.1f", m)
}

const (
	scaleBegin = "<!-- scale:begin (make bench-scale writes this table) -->"
	scaleEnd   = "<!-- scale:end -->"
)

// publishScale replaces the table between the markers of docs/benchmarks.md
// and draws the cost plots.
func publishScale(rs []*scale.Result, docs string) error {
	path := filepath.Join(docs, "benchmarks.md")
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	doc := string(b)
	i, j := strings.Index(doc, scaleBegin), strings.Index(doc, scaleEnd)
	if i < 0 || j < i {
		return fmt.Errorf("%s: no %q ... %q markers", path, scaleBegin, scaleEnd)
	}
	var t strings.Builder
	fmt.Fprintf(&t, "%s\n\n`make bench-scale` on %s.\n\n", scaleBegin, suite.Machine())
	writeScaleTable(&t, rs)
	t.WriteString("\n")
	doc = doc[:i] + t.String() + doc[j:]
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		return err
	}
	return plotScale(rs, filepath.Join(docs, "img"))
}

// republishScale rewrites the docs table and plots from a run's JSON.
func republishScale(path, docs string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var rs []*scale.Result
	if err := json.Unmarshal(b, &rs); err != nil {
		return err
	}
	return publishScale(rs, docs)
}

// plotScale draws the control plane's cost per unit of work against R
// (CPU per watch message sent, fan-out runs, shared and per-stream) and
// against N (CPU per report, ingestion runs). A flat line is cost growing
// linearly in R or N; CPU per unit of work is what other jobs on the box
// cannot distort (they starve the process, they do not add to its CPU).
func plotScale(rs []*scale.Result, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	series := func(prefix string, perStream bool, x, y func(*scale.Result) float64) plotter.XYs {
		var xy plotter.XYs
		for _, r := range rs {
			if strings.HasPrefix(r.Config.Name, prefix) && r.Config.PerStream == perStream && y(r) > 0 {
				xy = append(xy, plotter.XY{X: x(r), Y: y(r)})
			}
		}
		return xy
	}
	routers := func(r *scale.Result) float64 { return float64(r.Config.Routers) }
	workers := func(r *scale.Result) float64 { return float64(r.Config.Workers) }
	perSent := func(r *scale.Result) float64 { return r.CPUPerSentUs }
	perReport := func(r *scale.Result) float64 {
		if r.Reports == 0 {
			return 0
		}
		return r.CPUCores * r.Config.Duration.Seconds() * 1e6 / float64(r.Reports)
	}
	draw := func(file, title, xlabel, ylabel string, sets ...any) error {
		p := plot.New()
		p.Title.Text = title
		p.X.Label.Text = xlabel
		p.Y.Label.Text = ylabel
		p.Y.Min = 0
		if err := plotutil.AddLinePoints(p, sets...); err != nil {
			return err
		}
		p.Legend.Top, p.Legend.Left = true, true
		return p.Save(7*vg.Inch, 4*vg.Inch, filepath.Join(dir, file))
	}
	if err := draw("scale-routers.png", "Verdict fan-out, 1,000 workers, 20 flips/s: cost per message against R (flat = linear)",
		"routers watching (R)", "control-plane CPU per watch message sent (µs)",
		"shared encoding", series("fanout-", false, routers, perSent),
		"per-stream encoding (before)", series("fanout-", true, routers, perSent),
		"bare gRPC floor", series("floor-", false, routers, perSent)); err != nil {
		return err
	}
	return draw("scale-workers.png", "Ingestion, 20 reports/s per worker via agents: cost per report against N (flat = linear)",
		"workers (N)", "control-plane CPU per report (µs)", "control plane", series("ingest-", false, workers, perReport))
}
