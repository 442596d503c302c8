// Command benchsuite runs the overload and fault benchmarks of docs/overload-benchmark.md
// against a built smg binary and writes docs/benchmarks.md tables and docs/img plots.
//
//	go run ./bench/cmd/benchsuite --bin bin/smg --suite overload
//
// It owns the plotting stack (gonum/plot), which the smg binary must not
// link.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/smg-project/smg/bench/scale"
	"github.com/smg-project/smg/bench/suite"
)

func main() {
	scale.MaybeChild() // the scale suite's agent and router processes are this binary
	fs := flag.NewFlagSet("benchsuite", flag.ContinueOnError)
	bin := fs.String("bin", "bin/smg", "smg binary to run the simulated fleet and the gateway with")
	which := fs.String("suite", "overload", "which benchmark: overload (make bench-overload: the overload scenario, then the objectives and tenants ones), objectives or tenants (that one alone), faults (make bench-faults), scale (make bench-scale) or proxy (make bench-proxy)")
	short := fs.Bool("short", false, "smoke-test sizes (2 loads, 3-second runs): checks shapes, not timings; writes no docs")
	raw := fs.String("raw", "docs/bench-raw", "directory for per-run JSON results (git-ignored)")
	docs := fs.String("docs", "docs", "directory holding benchmarks.md and img/")
	seed := fs.Uint64("seed", 1, "seed of the simulated engines and of the offered load")
	agentPoll := fs.Duration("agent-poll", 50*time.Millisecond,
		"run one smg agent covering every engine, polling each this often (0: the control plane polls over HTTP)")
	only := fs.String("configs", "", "overload, objectives, tenants: comma-separated configurations to run (empty: all; with --suite overload, only the overload scenario runs, in the order named; name@secs: that configuration with --worker-admission-wait-secs secs)")
	loads := fs.String("loads", "", "overload, objectives: comma-separated multiples of capacity (empty: 0.5,1,1.5,2; objectives 1,2,4)")
	replot := fs.Bool("republish", false, "overload, objectives, proxy: rewrite the docs tables and plots from the last full run's overload.json (objectives.json, proxy.json) in --raw, without running")
	tuned := fs.Int("tuned-waiting", 0, "overload: waiting-requests ceiling of shed-tuned (0: the benchmark's choice)")
	windowWait := fs.String("window-wait", "", "overload: --worker-admission-wait-secs of every window configuration instead of the benchmark's")
	capacity := fs.Float64("capacity", 0, "overload: fleet capacity in req/s instead of calibrating (output tokens/s follow from the mean length)")
	scaleConfig := fs.String("scale-config", "", `scale: run this one configuration (JSON of scale.Config, e.g. {"Workers":1000,"Agents":10,...}) and write no docs`)
	scaleWindow := fs.Duration("scale-window", 10*time.Second, "scale: measurement window of each run")
	scaleRepublish := fs.String("scale-republish", "", "scale: rewrite the docs table and plots from this results JSON (--raw's scale.json), without running")
	tenantRounds := fs.Int("tenant-rounds", 3, "tenants: rounds of the tenant configurations, alternating")
	proxyPairs := fs.Int("proxy-pairs", 5, "proxy: runs of each proxy per load, alternating")
	proxyRun := fs.Duration("proxy-run", 10*time.Second, "proxy: length of one run (whole seconds)")
	proxyClients := fs.Int("proxy-clients", 32, "proxy: closed-loop wrk connections")
	proxyPlacements := fs.String("proxy-placements", "shared,own-cpu", "proxy: where the proxy runs, comma-separated: shared (wrk, engines and proxy on every CPU) and own-cpu (the proxy alone on one CPU, wrk and the engines on another; needs 2 CPUs)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s := &suite.Suite{Bin: *bin, RawDir: *raw, DocsDir: *docs, Short: *short, Seed: *seed, Log: os.Stderr,
		AgentPoll: *agentPoll, Capacity: *capacity, TunedWaiting: *tuned, WindowWait: *windowWait}
	if *only != "" {
		s.Configs = strings.Split(*only, ",")
	}
	if *loads != "" {
		for _, l := range strings.Split(*loads, ",") {
			v, err := strconv.ParseFloat(l, 64)
			if err != nil {
				fmt.Fprintln(os.Stderr, "benchsuite: --loads:", err)
				os.Exit(2)
			}
			s.Loads = append(s.Loads, v)
		}
	}
	// A partial run is for exploring: it must not overwrite the published docs.
	if *short || *only != "" || *loads != "" || *capacity > 0 || *tuned > 0 || *windowWait != "" {
		s.DocsDir = ""
	}
	start := time.Now()
	var err error
	switch {
	case *replot && *which == "objectives":
		err = republishObjectives(s)
	case *replot && *which == "proxy":
		err = republishProxy(s)
	case *replot:
		err = republish(s)
	case *which == "overload":
		err = runOverload(ctx, s)
		// --configs names the overload scenario's configurations here; the
		// other scenarios' run under their own --suite.
		if err == nil && *only == "" {
			err = runObjectives(ctx, s)
		}
		if err == nil && *only == "" {
			err = runTenants(ctx, s, *tenantRounds)
		}
	case *which == "objectives":
		err = runObjectives(ctx, s)
	case *which == "tenants":
		err = runTenants(ctx, s, *tenantRounds)
	case *which == "faults":
		err = runFaults(ctx, s)
	case *which == "scale" && *scaleRepublish != "":
		err = republishScale(*scaleRepublish, *docs)
	case *which == "proxy":
		err = runProxy(ctx, s, suite.ProxyOptions{Pairs: *proxyPairs, Duration: *proxyRun, Clients: *proxyClients, Profile: !*short,
			Placements: strings.Split(*proxyPlacements, ",")})
	case *which == "scale":
		err = runScale(ctx, s.DocsDir, *raw, *short, *scaleConfig, *scaleWindow)
	default:
		err = fmt.Errorf("unknown suite %q (overload, objectives, tenants, faults, scale or proxy)", *which)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchsuite:", err)
		os.Exit(1)
	}
	what := *which
	if *replot {
		what = "republish"
	}
	fmt.Fprintf(os.Stderr, "benchsuite %s done in %s\n", what, time.Since(start).Round(time.Second))
}

func runOverload(ctx context.Context, s *suite.Suite) error {
	rep, err := s.Overload(ctx)
	if err != nil {
		return err
	}
	suite.WriteOverloadTable(os.Stdout, rep)
	suite.WriteWindowTables(os.Stdout, rep)
	if len(suite.GRPCPairs(rep)) > 0 {
		fmt.Println()
		suite.WriteGRPCTable(os.Stdout, rep)
	}
	if s.DocsDir == "" {
		return nil
	}
	return publishOverload(s, rep)
}

func runObjectives(ctx context.Context, s *suite.Suite) error {
	rep, err := s.Objectives(ctx)
	if err != nil {
		return err
	}
	suite.WriteObjectiveTable(os.Stdout, rep)
	if s.DocsDir == "" {
		return nil
	}
	if err := plotObjectives(rep, filepath.Join(s.DocsDir, "img")); err != nil {
		return err
	}
	return s.PublishObjectives(rep)
}

// readRaw reads a full run's results from --raw's name.
func readRaw(s *suite.Suite, name string, v any) error {
	b, err := os.ReadFile(filepath.Join(s.RawDir, name))
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

func republishObjectives(s *suite.Suite) error {
	var rep suite.ObjectiveReport
	if err := readRaw(s, "objectives.json", &rep); err != nil {
		return err
	}
	if err := plotObjectives(&rep, filepath.Join(s.DocsDir, "img")); err != nil {
		return err
	}
	return s.PublishObjectives(&rep)
}

func runTenants(ctx context.Context, s *suite.Suite, rounds int) error {
	if s.Short {
		rounds = 1
	}
	rep, err := s.Tenants(ctx, rounds)
	if err != nil {
		return err
	}
	suite.WriteTenantTable(os.Stdout, rep)
	if s.DocsDir == "" {
		return nil
	}
	return s.PublishTenants(rep)
}

// publishOverload writes the tables and draws the plots they link to.
func publishOverload(s *suite.Suite, rep *suite.OverloadReport) error {
	if err := plotOverload(rep, filepath.Join(s.DocsDir, "img")); err != nil {
		return err
	}
	return s.PublishOverload(rep)
}

func republish(s *suite.Suite) error {
	var rep suite.OverloadReport
	if err := readRaw(s, "overload.json", &rep); err != nil {
		return err
	}
	return publishOverload(s, &rep)
}

func runProxy(ctx context.Context, s *suite.Suite, o suite.ProxyOptions) error {
	if s.Short {
		o.Pairs, o.Duration = 1, 2*time.Second
	}
	rep, err := s.Proxy(ctx, o)
	if err != nil {
		return err
	}
	var b bytes.Buffer
	suite.WriteProxyTable(&b, rep)
	os.Stdout.Write(b.Bytes())
	if s.DocsDir == "" {
		return nil
	}
	return s.PublishProxy(rep)
}

func republishProxy(s *suite.Suite) error {
	var rep suite.ProxyReport
	if err := readRaw(s, "proxy.json", &rep); err != nil {
		return err
	}
	return s.PublishProxy(&rep)
}

func runFaults(ctx context.Context, s *suite.Suite) error {
	rep, err := s.Faults(ctx)
	if err != nil {
		return err
	}
	suite.WriteFaultTable(os.Stdout, rep)
	if s.DocsDir == "" {
		return nil
	}
	if err := plotFaults(rep, filepath.Join(s.DocsDir, "img")); err != nil {
		return err
	}
	return s.PublishFaults(rep)
}
