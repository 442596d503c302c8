// Plots of the benchmark suite. They live here, not in package bench, so the
// plotting stack (gonum/plot, fonts, PDF) is never linked into smg itself.
package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"sort"

	"github.com/smg-project/smg/bench"
	"github.com/smg-project/smg/bench/suite"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// plotOverload writes overload-ttft-p99.png and overload-goodput.png into dir.
func plotOverload(rep *suite.OverloadReport, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	ttft := plot.New()
	ttft.Title.Text = "Admitted requests: TTFT p99 vs offered load"
	ttft.X.Label.Text = "offered load (× measured fleet capacity)"
	ttft.Y.Label.Text = "TTFT p99 (seconds, log scale)"
	ttft.Y.Scale = plot.LogScale{}
	ttft.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	good := plot.New()
	good.Title.Text = fmt.Sprintf("Goodput (output tokens/s of requests with TTFT ≤ %.0f s)", rep.TTFTObjective)
	good.X.Label.Text = "offered load (× measured fleet capacity)"
	good.Y.Label.Text = "output tokens/s"
	for i, gc := range rep.Configs {
		var pt, pg plotter.XYs
		for _, load := range rep.Loads {
			run, ok := rep.Run(gc.Name, load)
			if !ok {
				continue
			}
			pt = append(pt, plotter.XY{X: load, Y: math.Max(run.Summary.TTFT.P99, 0.001)})
			pg = append(pg, plotter.XY{X: load, Y: run.Summary.Goodput})
		}
		for _, p := range []struct {
			plt *plot.Plot
			xys plotter.XYs
		}{{ttft, pt}, {good, pg}} {
			line, points, err := plotter.NewLinePoints(p.xys)
			if err != nil {
				return err
			}
			line.Color, points.Color = plotutil.Color(i), plotutil.Color(i)
			line.Dashes = plotutil.Dashes(i)
			points.Shape = plotutil.Shape(i)
			line.Width = vg.Points(1.5)
			p.plt.Add(line, points)
			p.plt.Legend.Add(gc.Name, line, points)
		}
	}
	// Reference lines: capacity, 90% of it, and 2× the shed config's 0.5× p99.
	capLine := hline(rep.Loads, rep.Capacity.TokensPerSec, color.Gray{Y: 80})
	ninety := hline(rep.Loads, 0.9*rep.Capacity.TokensPerSec, color.Gray{Y: 160})
	good.Add(capLine, ninety)
	good.Legend.Add("capacity", capLine)
	good.Legend.Add("90% of capacity", ninety)
	if run, ok := rep.Run("shed", 0.5); ok && run.Summary.TTFT.P99 > 0 {
		l := hline(rep.Loads, 2*run.Summary.TTFT.P99, color.Gray{Y: 160})
		ttft.Add(l)
		ttft.Legend.Add("target: 2× shed p99 at 0.5×", l)
	}
	for _, p := range []*plot.Plot{ttft, good} {
		p.Legend.Top = true
		p.Legend.Left = true
		p.Add(plotter.NewGrid())
		p.X.Min = 0.4
		p.X.Max = 2.1
	}
	good.Y.Min = 0
	// Bottom right, lifted above the collapsed lines: the empty part of the plot.
	good.Legend.Top, good.Legend.Left = false, false
	good.Legend.YOffs = vg.Points(60)
	if err := ttft.Save(7*vg.Inch, 4.5*vg.Inch, filepath.Join(dir, "overload-ttft-p99.png")); err != nil {
		return err
	}
	return good.Save(7*vg.Inch, 4.5*vg.Inch, filepath.Join(dir, "overload-goodput.png"))
}

func hline(xs []float64, y float64, c color.Color) *plotter.Line {
	lo, hi := 0.4, 2.1
	if len(xs) > 0 {
		lo, hi = xs[0]-0.1, xs[len(xs)-1]+0.1
	}
	l, _ := plotter.NewLine(plotter.XYs{{X: lo, Y: y}, {X: hi, Y: y}})
	l.Color = c
	l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	return l
}

// plotFaults writes faults-ttft.png into dir: TTFT of every completed request
// by its start time, p99 per second, failures, and a line at each fault.
func plotFaults(rep *suite.FaultReport, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("TTFT around faults (4 engines at %.1f req/s)", rep.Rate)
	p.X.Label.Text = "request start (seconds into the run)"
	p.Y.Label.Text = "TTFT (seconds, log scale)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	var ok, failed plotter.XYs
	bins := map[int][]float64{}
	maxY := 0.01
	for _, r := range rep.Records {
		if r.Completed {
			ok = append(ok, plotter.XY{X: r.Start, Y: math.Max(r.TTFT, 0.001)})
			bins[int(r.Start)] = append(bins[int(r.Start)], r.TTFT)
			maxY = math.Max(maxY, r.TTFT)
		}
	}
	for _, r := range rep.Records {
		if !r.Completed && !r.Shed {
			failed = append(failed, plotter.XY{X: r.Start, Y: maxY * 1.5})
		}
	}
	var p99 plotter.XYs
	secs := make([]int, 0, len(bins))
	for s := range bins {
		secs = append(secs, s)
	}
	sort.Ints(secs)
	for _, s := range secs {
		p99 = append(p99, plotter.XY{X: float64(s) + 0.5, Y: math.Max(bench.PercentilesOf(bins[s]).P99, 0.001)})
	}
	if len(ok) > 0 {
		sc, err := plotter.NewScatter(ok)
		if err != nil {
			return err
		}
		sc.GlyphStyle = draw.GlyphStyle{Shape: draw.CircleGlyph{}, Radius: vg.Points(1), Color: color.RGBA{R: 90, G: 120, B: 200, A: 255}}
		p.Add(sc)
		p.Legend.Add("TTFT of a completed request", sc)
	}
	if len(p99) > 0 {
		l, err := plotter.NewLine(p99)
		if err != nil {
			return err
		}
		l.Color, l.Width = color.RGBA{R: 20, G: 20, B: 20, A: 255}, vg.Points(1.5)
		p.Add(l)
		p.Legend.Add("p99 per second", l)
	}
	if len(failed) > 0 {
		sc, err := plotter.NewScatter(failed)
		if err != nil {
			return err
		}
		sc.GlyphStyle = draw.GlyphStyle{Shape: draw.CrossGlyph{}, Radius: vg.Points(2.5), Color: color.RGBA{R: 210, A: 255}}
		p.Add(sc)
		p.Legend.Add("failed request (by start)", sc)
	}
	for _, o := range rep.Outcomes {
		l, err := plotter.NewLine(plotter.XYs{{X: o.At, Y: 0.001}, {X: o.At, Y: maxY * 2}})
		if err != nil {
			return err
		}
		l.Color = color.RGBA{R: 200, G: 120, A: 255}
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(l)
		labels, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{{X: o.At + 0.3, Y: maxY * 2}},
			Labels: []string{fmt.Sprintf("%s %d", o.Name, o.Engine)}})
		if err != nil {
			return err
		}
		p.Add(labels)
	}
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	p.Y.Min = 0.005
	p.Y.Max = maxY * 3
	return p.Save(9*vg.Inch, 4.5*vg.Inch, filepath.Join(dir, "faults-ttft.png"))
}

// plotObjectives writes objectives.png into dir: the share of admitted
// requests that met the TTFT objective, and goodput within it, by load.
func plotObjectives(rep *suite.ObjectiveReport, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	att := plot.New()
	att.Title.Text = fmt.Sprintf("Admitted requests meeting the %g s TTFT objective", rep.Objective)
	att.X.Label.Text = "offered load (× measured capacity)"
	att.Y.Label.Text = "share of admitted (%)"
	good := plot.New()
	good.Title.Text = "Goodput within the objective"
	good.X.Label.Text = "offered load (× measured capacity)"
	good.Y.Label.Text = "output tokens/s"
	for i, gc := range rep.Configs {
		var pa, pg plotter.XYs
		for _, load := range rep.Loads {
			if run, ok := rep.Run(gc.Name, load); ok {
				pa = append(pa, plotter.XY{X: load, Y: 100 * run.Attainment()})
				pg = append(pg, plotter.XY{X: load, Y: run.Summary.Goodput})
			}
		}
		for _, p := range []struct {
			plt *plot.Plot
			xys plotter.XYs
		}{{att, pa}, {good, pg}} {
			line, points, err := plotter.NewLinePoints(p.xys)
			if err != nil {
				return err
			}
			line.Color, points.Color = plotutil.Color(i), plotutil.Color(i)
			line.Dashes = plotutil.Dashes(i)
			points.Shape = plotutil.Shape(i)
			line.Width = vg.Points(1.5)
			p.plt.Add(line, points)
			p.plt.Legend.Add(gc.Name, line, points)
		}
	}
	target := hline(rep.Loads, 97, color.Gray{Y: 120})
	att.Add(target, plotter.NewGrid())
	att.Legend.Add("target 97%", target)
	att.Legend.Top = false
	good.Add(plotter.NewGrid())
	good.Y.Min = 0
	good.Legend.Top = false
	if err := att.Save(7*vg.Inch, 4.5*vg.Inch, filepath.Join(dir, "objectives-attainment.png")); err != nil {
		return err
	}
	return good.Save(7*vg.Inch, 4.5*vg.Inch, filepath.Join(dir, "objectives-goodput.png"))
}
