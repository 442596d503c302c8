// Package scale is the control plane's scale harness (make bench-scale): one
// control plane, the real one, in this process; N synthetic workers fed by M
// synthetic agent streams at a report rate; R synthetic routers watching,
// spread over a few processes; verdict flips at a rate. It measures the
// control plane alone (its process's CPU and memory; the agents and routers
// run in child processes) and the latencies end to end: report → verdict,
// verdict → every router, router lag, the join time and size of a snapshot,
// and allocations per report.
//
// It imports no plotting: the benchmark suite (bench/cmd/benchsuite) draws.
//
// It drives the control plane through its public constructors and wire
// protocols; it changes no rule to make a figure.
package scale

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/smg-project/smg/controlplane"
	"github.com/smg-project/smg/controlplane/registry"
	"github.com/smg-project/smg/controlplane/spread"
	"github.com/smg-project/smg/controlplane/watch"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// Config is one run.
type Config struct {
	Name        string
	Workers     int     // N synthetic workers
	Agents      int     // M agent streams feeding them
	AgentProcs  int     // processes the agent streams are spread over
	ReportRate  float64 // load reports per second per worker
	Routers     int     // R synthetic routers
	RouterProcs int     // processes the routers are spread over
	FlipRate    float64 // verdict flips per second, fleet-wide
	Joins       int     // routers joining during the window, timed
	Warmup      time.Duration
	Duration    time.Duration // the measurement window
	// LoadInterval is the control plane's --watch-load-interval (0: its
	// default).
	LoadInterval time.Duration
	// PerStream runs the watch server with per-stream encoding (the
	// baseline shared frames are measured against).
	PerStream bool
	// Writers and LoadPhases, when set, are the watch server's
	// (watch.Options: Writers -1 writes every stream from its own
	// goroutine; LoadPhases 1 puts every stream on one load grid): to
	// measure what each of them changes.
	Writers, LoadPhases int
	// SkipQuiet leaves out the quiet window: by default, when verdicts
	// flip, the window is preceded by one of the same length in which none
	// does (the agents report loads, the routers ack and report), and the
	// difference is the marginal cost of the flips.
	SkipQuiet bool
	// Floor runs the floor instead of the control plane: a bare gRPC
	// server with the control plane's server options sending each change,
	// one pre-encoded delta of a verdict flip's size, to the R routers
	// (Workers, Routers, RouterProcs and FlipRate count; no agents). What
	// it costs is gRPC's and the kernel's; the control plane's figures
	// divided by it are what is ours.
	Floor bool
	// FloorOneWriter: the floor's changes are written to every stream in
	// turn by one goroutine instead of each stream's own, woken (what the
	// wake-up of R goroutines per change costs). A slow router would hold
	// every other: a lower bound, not a design.
	FloorOneWriter bool
	// Command starts a child process that calls MaybeChild first thing
	// (nil: this executable again).
	Command func() *exec.Cmd `json:"-"`
	// GCPercent, when set, is the control plane's GOGC for the run (as an
	// operator would set it on its process; the children keep theirs):
	// its garbage collections' mark phases are where report → verdict's
	// tail comes from.
	GCPercent int
	// CPUProfile, when set, is a file to write the control plane's CPU
	// profile of the window to.
	CPUProfile string
	// Trace, when set, is a file to write a runtime/trace of the control
	// plane's process for the window to (`go tool trace -pprof=sched FILE`:
	// what a slow flip waited for outside GC; the trace costs CPU itself).
	// Each flip's commit is in it as a "flip" log event with its wall clock.
	Trace string
	// AllocProfile, when set, is a file to write the control plane's
	// allocations (a heap profile) to at the window's end, and at its start
	// to AllocProfile+".base": the window's are
	// `go tool pprof -sample_index=alloc_objects -base X.base X`.
	AllocProfile string
	// ChildProfiles, when set, is a prefix for the child processes' CPU
	// profiles of the window: PREFIX.agents-0, PREFIX.routers-1, ... (what
	// the load generators spend, apart from the control plane).
	ChildProfiles string
	// Goroutines, when set, is a file to write the control plane's
	// goroutines to (with their stacks) at the middle of the window: where
	// a stalled stream waits.
	Goroutines string
	// ReadPause, when set, stops every agent stream's receive loop in the
	// control plane for this long, 1 s into the window, between reading a
	// message and applying it (controlplane.Options.AgentApplying): a
	// control plane stuck on its own locks, its agents' records queued
	// unread. Give the window --worker-stale-secs more to see its vetoes.
	ReadPause time.Duration
	// AgentsNoClock: the synthetic agents send no sent_at, as agents did
	// before it, so the control plane judges their silence on its own clock
	// alone (the baseline ReadPause is compared with).
	AgentsNoClock bool
	// Log receives progress (nil: discarded).
	Log io.Writer `json:"-"`
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.Workers < 1:
		return errors.New("scale: Workers must be at least 1")
	case c.Agents < 1 || c.Agents > c.Workers:
		return fmt.Errorf("scale: Agents must be in [1, Workers], got %d", c.Agents)
	case c.AgentProcs < 1 || c.RouterProcs < 1:
		return errors.New("scale: AgentProcs and RouterProcs must be at least 1")
	case c.Routers < 0 || c.ReportRate < 0 || c.FlipRate < 0:
		return errors.New("scale: Routers, ReportRate and FlipRate must not be negative")
	case c.Duration <= 0 || c.Warmup <= 0:
		return errors.New("scale: Warmup and Duration must be positive")
	case c.FlipRate > 0 && float64(c.Workers)/c.FlipRate < 0.5:
		return errors.New("scale: FlipRate too high for Workers: each worker would flip more than twice a second")
	}
	return nil
}

// Quantiles of a latency, milliseconds.
type Quantiles struct {
	N             int
	P50, P99, Max float64
}

func quantiles(ms []float64) Quantiles {
	if len(ms) == 0 {
		return Quantiles{}
	}
	slices.Sort(ms)
	at := func(p float64) float64 { return ms[int(p*float64(len(ms)-1)+0.5)] }
	return Quantiles{N: len(ms), P50: at(0.5), P99: at(0.99), Max: ms[len(ms)-1]}
}

// Result is what one run measured.
type Result struct {
	Config Config

	// The control plane's process (it runs nothing else but the harness's
	// bookkeeping): CPU in cores over the window, heap in use and peak
	// resident memory.
	CPUCores float64
	HeapMiB  float64
	RSSMiB   float64 // resident at the window's end

	Reports         int64   // load records the agents sent in the window
	ReportsPerSec   float64 // of ReportTarget
	ReportTarget    float64
	AllocsPerReport float64 // control-plane allocations in the window per report (everything it did)

	Revisions uint64 // registry revisions in the window (verdicts and load flushes)
	Flips     int    // verdict flips committed in the window
	Delivered int    // of them, applied by every router before the run ended

	ReportToVerdict  Quantiles // agent sent the record → control plane committed the flip
	VerdictToRouters Quantiles // committed → the last router applied it
	// VerdictSentAll: committed → the control plane's last Send of it
	// returned (its own side of the fan-out, without the routers' receive).
	VerdictSentAll Quantiles
	// CPUPerRouterChangeUs: control-plane CPU per router per revision, µs
	// (everything it did: an upper bound).
	CPUPerRouterChangeUs float64
	// The quiet window before the window (same length, no flips): the
	// control plane's CPU (cores), revisions and watch messages sent in
	// it, the routers' CPU; Marginal: the window minus the quiet window,
	// what the flips alone cost.
	QuietCPUCores, QuietRouterCPUCores float64
	QuietRevisions                     uint64
	QuietSent                          float64
	Marginal                           Marginal
	LagP99, LagMax                     float64 // revisions a router's ack trails the registry, sampled

	// Join: a router dialling → holding its decoded snapshot, from the
	// first router process (it hosts Routers/RouterProcs routers decoding
	// every message); JoinAlone: the same joins from a process of their
	// own, as a real router joins. Each split in phases (JoinPhases).
	Join, JoinAlone             Quantiles
	JoinPhases, JoinAlonePhases JoinPhases
	SnapshotKiB                 float64
	MsgsPerRouterSec            float64
	KiBPerRouterSec             float64
	Encoded, Sent               float64 // watch messages marshalled vs sent in the window
	CPUPerSentUs                float64 // control-plane CPU per watch message sent, µs (everything it did)
	LoadAvg                     float64 // the machine's 1-minute load average at the window's end (other jobs included)

	// UnreachableVetoes: liveness vetoes as unreachable in the window
	// (smg_worker_stall_transitions_total); HeldMax: the most workers one
	// sweep held a veto off for because the control plane was behind
	// reading their agent's stream (smg_liveness_held_for_read_lag_workers,
	// sampled every 250 ms).
	UnreachableVetoes, HeldMax float64

	// The clients, apart: the agent and router processes' CPU over the
	// window (cores), the records the agents' rate asked for, and the share
	// of the window an agent stream spent inside Send (flow control: the
	// control plane not reading shows here, a starved agent process does
	// not).
	AgentCPUCores, RouterCPUCores float64
	ReportsDuePerSec              float64
	AgentSendBlocked              float64
	Errors                        []string
	// Warnings: what the control plane logged at Warn or above from the
	// children's start to the window's end, most frequent first.
	Warnings []string
}

// Run runs one configuration.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	if cfg.Command == nil {
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		cfg.Command = func() *exec.Cmd { return exec.Command(exe) }
	}
	if cfg.Floor {
		return runFloor(ctx, cfg)
	}
	logw := cfg.Log
	if cfg.GCPercent != 0 {
		defer debug.SetGCPercent(debug.SetGCPercent(cfg.GCPercent))
	}

	// Worker URLs point at one loopback stub answering every probe, so the
	// health checker keeps them Ready and the poller gets an answer.
	stub, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	var probes, lastProbe atomic.Int64
	stubSrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/health") {
			probes.Add(1)
		}
		lastProbe.Store(time.Now().UnixNano())
		_, _ = w.Write([]byte("{}"))
	})}
	go stubSrv.Serve(stub)
	defer stubSrv.Close()
	urlBase := "http://" + stub.Addr().String()

	flips := newFlipLog()
	opts := controlplane.DefaultOptions()
	opts.LoadMonitorInterval = 3600 // agents cover every worker
	sends := newSendLog()
	opts.WatchSent = sends.sent
	opts.Health.IntervalSecs = 3600
	if cfg.LoadInterval > 0 {
		opts.WatchLoadInterval = cfg.LoadInterval
	}
	var pause readPause
	if cfg.ReadPause > 0 {
		opts.AgentApplying = pause.wait
	}
	metrics := prometheus.NewRegistry()
	cp, err := controlplane.New(opts, slog.New(flips), metrics)
	if err != nil {
		return nil, err
	}
	watchMetrics := metrics
	if cfg.PerStream || cfg.Writers != 0 || cfg.LoadPhases != 0 {
		// The baseline, or a variant: the same server with shared frames
		// off, or other writers or load phases, in place of the one New
		// built (its metrics on their own registry).
		watchMetrics = prometheus.NewRegistry()
		cp.Watch = watch.NewServer(cp.Registry, watch.Options{Sink: cp.Evidence, Demand: cp.Windows, EncodePerStream: cfg.PerStream,
			Writers: cfg.Writers, LoadPhases: cfg.LoadPhases, LoadInterval: opts.WatchLoadInterval, Sent: sends.sent},
			slog.New(flips), watchMetrics)
	}
	th := opts.Thresholds.Resolve(nil)
	if _, err := cp.Registry.Update(func(tx *registry.Txn) error {
		for w := range cfg.Workers {
			tx.Insert(&registry.Worker{Registered: registry.Registered{ID: workerID(w), Spec: &smgv1.WorkerSpec{Url: workerURL(urlBase, w)}, Model: "scale-model", Type: "regular", Thresholds: th}, State: registry.State{Health: registry.HealthHealthy}})
		}
		return nil
	}); err != nil {
		return nil, err
	}
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	lis := &acceptLog{Listener: tcp}
	gs := cp.GRPCServer()
	go gs.Serve(lis)
	defer gs.Stop()
	runCtx, stopCP := context.WithCancel(ctx)
	cpDone := make(chan struct{})
	go func() { cp.Run(runCtx); close(cpDone) }()
	defer func() { stopCP(); <-cpDone }()

	// The health checker probes at once the first workers of a batch (the
	// burst budget; the rest at their phases over the hour-long interval,
	// controlplane/spread), and the poller polls those no agent covers yet:
	// wait for those, so the window sees the steady state.
	settle := time.Now().Add(time.Minute)
	for time.Now().Before(settle) && (probes.Load() < int64(min(cfg.Workers, spread.DefaultBurstSize)) || time.Since(time.Unix(0, lastProbe.Load())) < 100*time.Millisecond) {
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}

	specs := childSpecs(cfg, lis.Addr().String(), urlBase, th.WaitingRequests)
	fmt.Fprintf(logw, "scale %s: %d workers, %d agents at %g reports/s each worker, %d routers in %d processes, %g flips/s; window %s\n",
		cfg.Name, cfg.Workers, cfg.Agents, cfg.ReportRate, cfg.Routers, cfg.RouterProcs, cfg.FlipRate, cfg.Duration)
	flips.counting.Store(true)
	children, err := startChildren(cfg, specs)
	if err != nil {
		return nil, err
	}
	// Settled: every worker has reported through its agent once and every
	// router is watching; then the warmup.
	settled, told := time.Now(), time.Now()
	for !fleetSettled(cp, cfg) {
		if time.Since(told) > 10*time.Second {
			told = time.Now()
			fmt.Fprintf(logw, "scale %s: settling: %s %v\n", cfg.Name, settleState(cp), flips.warnings())
		}
		select {
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			return nil, errors.Join(ctx.Err(), children.wait())
		}
		if time.Since(settled) > 2*time.Minute {
			return nil, errors.Join(fmt.Errorf("scale: the fleet did not settle in 2 minutes: %s; %s", settleState(cp), strings.Join(flips.warnings(), "; ")), children.wait())
		}
	}
	fmt.Fprintf(logw, "scale %s: fleet settled in %s\n", cfg.Name, time.Since(settled).Round(time.Millisecond))
	quiet, start, end := cfg.windows(time.Now())
	if err := children.window(quiet, start, end); err != nil {
		return nil, errors.Join(err, children.wait())
	}

	// The quiet window, then the window: CPU, allocations and revisions at
	// both ends, lag sampled.
	now := func() phase {
		return sample(cp.Registry.Revision(), counterSum(watchMetrics, "smg_watch_messages_sent_total"))
	}
	var q0 phase
	for i, at := range []time.Time{quiet, start} {
		if i == 1 && at.Equal(quiet) {
			break
		}
		select {
		case <-time.After(time.Until(at)):
		case <-ctx.Done():
			return nil, errors.Join(ctx.Err(), children.wait())
		}
		if i == 0 {
			q0 = now()
		}
	}
	sends.on.Store(true)
	pause.set(start.Add(time.Second), cfg.ReadPause)
	vetoes0 := counterWhere(metrics, "smg_worker_stall_transitions_total", "reason", "unreachable")
	var ms0 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	w0 := now()
	cpu0, rev0 := w0.cpu, w0.revs
	enc0, sent0 := counterSum(watchMetrics, "smg_watch_messages_encoded_total"), w0.sent
	quietPhase := since(q0, w0, start.Sub(quiet))
	stopProfile := func() {}
	if cfg.CPUProfile != "" {
		if f, err := os.Create(cfg.CPUProfile); err == nil {
			if pprof.StartCPUProfile(f) == nil {
				stopProfile = func() { pprof.StopCPUProfile(); f.Close() }
			}
		}
	}
	if cfg.Trace != "" {
		if f, err := os.Create(cfg.Trace); err == nil {
			if trace.Start(f) == nil {
				prev := stopProfile
				stopProfile = func() { trace.Stop(); f.Close(); prev() }
			} else {
				f.Close()
			}
		}
	}
	writeAllocs := func(name string) {
		if f, err := os.Create(name); err == nil {
			_ = pprof.Lookup("allocs").WriteTo(f, 0)
			f.Close()
		}
	}
	if cfg.AllocProfile != "" {
		writeAllocs(cfg.AllocProfile + ".base")
	}
	if cfg.Goroutines != "" {
		mid := time.AfterFunc(cfg.Duration/2, func() {
			if f, err := os.Create(cfg.Goroutines); err == nil {
				_ = pprof.Lookup("goroutine").WriteTo(f, 2)
				f.Close()
			}
		})
		defer mid.Stop()
	}
	var lags []float64
	var heldMax float64
	sample := time.NewTicker(250 * time.Millisecond)
	for now := time.Now(); now.Before(end); now = time.Now() {
		select {
		case <-sample.C:
		case <-time.After(time.Until(end)):
		case <-ctx.Done():
			sample.Stop()
			stopProfile()
			return nil, errors.Join(ctx.Err(), children.wait())
		}
		for _, r := range cp.Watch.Routers() {
			if strings.HasPrefix(r.GetRouterId(), "router-") {
				lags = append(lags, float64(r.GetLag()))
			}
		}
		// The inbox's gauge alone: gathering every metric (10,000
		// workers' series) 4 times a second cost the control plane 12% of
		// its CPU and 3 in 4 of its allocations in ingest-N10000.
		heldMax = max(heldMax, cp.Evidence.HeldForReadLag())
	}
	sample.Stop()
	stopProfile()
	if cfg.AllocProfile != "" {
		writeAllocs(cfg.AllocProfile)
	}
	warnings := flips.warnings()
	flips.counting.Store(false) // the streams ending after the window are no news
	// Read before the children end: their agent streams breaking at the
	// end are connection failures, and a worker silent for the stall bound
	// by then (every one reporting every 2 s or less often) is vetoed.
	vetoes := counterWhere(metrics, "smg_worker_stall_transitions_total", "reason", "unreachable") - vetoes0
	w1 := now()
	cpu1, rev1 := w1.cpu, w1.revs
	shared := metricSum(watchMetrics, "smg_watch_shared_streams", "", "", func(m *dto.Metric) float64 { return m.GetGauge().GetValue() })
	stalls := counterSum(watchMetrics, "smg_watch_writer_stalls_total")
	var ms1 runtime.MemStats
	runtime.ReadMemStats(&ms1)
	wall := end.Sub(start)

	results, cerr := children.results()
	sends.on.Store(false)
	res := &Result{Config: cfg, Errors: cerr, Warnings: warnings, HeldMax: heldMax,
		UnreachableVetoes: vetoes}
	res.CPUCores = (cpu1 - cpu0).Seconds() / wall.Seconds()
	res.HeapMiB = float64(ms1.HeapInuse) / (1 << 20)
	res.RSSMiB = rssMiB()
	res.LoadAvg = loadAvg()
	res.Revisions = rev1 - rev0
	res.ReportTarget = float64(cfg.Workers) * cfg.ReportRate
	var routerMsgs, routerBytes int64
	seen := map[string]*seenAgg{}
	var sent []flipEvent
	var joins []float64
	var joinSamples []joinSample
	var alone []float64 // the joins from a process of their own
	var aloneSamples []joinSample
	var due int64
	var blocked float64
	for _, r := range results {
		switch r.Role {
		case "agents":
			res.AgentCPUCores += r.CPUSecs / wall.Seconds()
		case "joiner": // not a watching router: its cost is the joins'
		default:
			res.RouterCPUCores += r.CPUSecs / wall.Seconds()
			if quietPhase.wall > 0 {
				res.QuietRouterCPUCores += r.QuietCPUSecs / quietPhase.wall.Seconds()
			}
		}
		due += r.Due
		blocked += r.SendBlockedSecs
		res.Reports += r.Sent
		sent = append(sent, r.Flips...)
		routerMsgs += r.Messages
		routerBytes += r.Bytes
		res.Errors = append(res.Errors, r.Errors...)
		mergeSeen(seen, r.Seen)
		for _, j := range r.Joins {
			stampJoin(&j, lis, flips, sends)
			if r.Role == "joiner" {
				aloneSamples = append(aloneSamples, j)
				alone = append(alone, j.Millis)
			} else {
				joinSamples = append(joinSamples, j)
				joins = append(joins, j.Millis)
			}
			res.SnapshotKiB = float64(j.Bytes) / 1024
			if j.Workers != cfg.Workers {
				res.Errors = append(res.Errors, fmt.Sprintf("a joining router's snapshot lists %d workers, want %d", j.Workers, cfg.Workers))
			}
		}
	}
	res.ReportsPerSec = float64(res.Reports) / wall.Seconds()
	res.ReportsDuePerSec = float64(due) / wall.Seconds()
	res.AgentSendBlocked = blocked / wall.Seconds() / float64(cfg.Agents)
	if res.Reports > 0 {
		res.AllocsPerReport = float64(ms1.Mallocs-ms0.Mallocs) / float64(res.Reports)
	}
	if cfg.Routers > 0 && res.Revisions > 0 {
		res.CPUPerRouterChangeUs = (cpu1 - cpu0).Seconds() * 1e6 / float64(cfg.Routers) / float64(res.Revisions)
		res.MsgsPerRouterSec = float64(routerMsgs) / float64(cfg.Routers) / wall.Seconds()
		res.KiBPerRouterSec = float64(routerBytes) / 1024 / float64(cfg.Routers) / wall.Seconds()
	}
	var r2v, v2r, v2s []float64
	var slowest []slowFlip
	var slowR2V [][2]int64
	committed := flips.committed()
	for _, f := range sent {
		if f.At < start.UnixNano() || f.At >= end.UnixNano() {
			continue
		}
		at, ok := committed[flipKey(f.Worker, f.N)]
		if !ok {
			continue
		}
		res.Flips++
		r2v = append(r2v, float64(at-f.At)/1e6)
		slowR2V = append(slowR2V, [2]int64{f.At, at})
		if s := seen[flipKey(f.Worker, f.N)]; cfg.Routers > 0 && s != nil && s.Count >= cfg.Routers {
			res.Delivered++
			v2r = append(v2r, float64(s.Last-at)/1e6)
			if done, ok := sends.allAt(s.MinRev, cfg.Routers); ok {
				v2s = append(v2s, float64(done-at)/1e6)
				slowest = append(slowest, slowFlip{at, done - at, s.Last - at})
			}
		}
	}
	res.ReportToVerdict, res.VerdictToRouters, res.VerdictSentAll = quantiles(r2v), quantiles(v2r), quantiles(v2s)
	logSlowest(logw, cfg.Name, slowest)
	fmt.Fprintf(logw, "scale %s: %d garbage collections in the window, %.0f MiB allocated a second\n",
		cfg.Name, ms1.NumGC-ms0.NumGC, float64(ms1.TotalAlloc-ms0.TotalAlloc)/(1<<20)/wall.Seconds())
	logSlowReports(logw, cfg.Name, slowR2V, gcEnds())
	res.Join = quantiles(joins)
	res.JoinPhases = joinPhases(joinSamples)
	res.JoinAlone, res.JoinAlonePhases = quantiles(alone), joinPhases(aloneSamples)
	logJoins(logw, cfg.Name, append(joinSamples, aloneSamples...))
	lq := quantiles(lags)
	res.LagP99, res.LagMax = lq.P99, lq.Max
	res.Encoded = counterSum(watchMetrics, "smg_watch_messages_encoded_total") - enc0
	res.Sent = counterSum(watchMetrics, "smg_watch_messages_sent_total") - sent0
	if res.Sent > 0 {
		res.CPUPerSentUs = (cpu1 - cpu0).Seconds() * 1e6 / res.Sent
	}
	res.quiet(quietPhase, since(w0, w1, wall))
	fmt.Fprintf(logw, "scale %s: %.1f µs per router per change (marginal %.1f), %.1f µs per message (marginal %.1f, %.2f writes, %.2f reads); quiet window cpu %.2f cores, routers %.2f cores; load %.1f\n",
		cfg.Name, res.CPUPerRouterChangeUs, res.Marginal.PerRouterChangeUs, res.CPUPerSentUs, res.Marginal.PerSentUs, res.Marginal.WritesPerSent, res.Marginal.ReadsPerSent,
		res.QuietCPUCores, res.QuietRouterCPUCores, res.LoadAvg)
	fmt.Fprintf(logw, "scale %s: cpu %.2f cores, heap %.0f MiB, %.0f reports/s of %.0f (%.0f due), flips %d (%d to all routers), r->v p99 %.1f ms, v->CP's last send p99 %.1f ms, v->routers p99 %.1f ms; agents %.2f cores, %.0f%% of the time in Send; routers %.2f cores\n",
		cfg.Name, res.CPUCores, res.HeapMiB, res.ReportsPerSec, res.ReportTarget, res.ReportsDuePerSec, res.Flips, res.Delivered, res.ReportToVerdict.P99, res.VerdictSentAll.P99, res.VerdictToRouters.P99,
		res.AgentCPUCores, 100*res.AgentSendBlocked, res.RouterCPUCores)
	fmt.Fprintf(logw, "scale %s: watch: %.0f of %d streams on the shared writers at the window's end, %.0f sends stalled a writer (since the start)\n",
		cfg.Name, shared, cfg.Routers, stalls)
	fmt.Fprintf(logw, "scale %s: liveness: %.0f unreachable vetoes in the window, at most %.0f workers held off for the read lag (read pause %s, agents' clock %v); %d revisions, %.0f watch messages sent\n",
		cfg.Name, res.UnreachableVetoes, res.HeldMax, cfg.ReadPause, !cfg.AgentsNoClock, res.Revisions, res.Sent)
	return res, nil
}

// mergeSeen adds one router process's flips seen to seen.
func mergeSeen(seen, more map[string]*seenAgg) {
	for k, a := range more {
		if s := seen[k]; s != nil {
			s.Count += a.Count
			s.Last = max(s.Last, a.Last)
			s.MinRev = min(s.MinRev, a.MinRev)
		} else {
			seen[k] = a
		}
	}
}

// windows are the quiet window [quiet, start) and the window [start, end)
// of a run whose fleet settled at now: after the warmup, the quiet window
// (unless skipped or nothing flips: then quiet == start), then the window.
func (c Config) windows(now time.Time) (quiet, start, end time.Time) {
	quiet = now.Add(c.Warmup)
	start = quiet
	if !c.SkipQuiet && c.FlipRate > 0 {
		start = quiet.Add(c.Duration)
	}
	return quiet, start, start.Add(c.Duration)
}

// quiet fills the quiet window's figures and the marginal cost of the
// window's flips.
func (r *Result) quiet(q, w phase) {
	if q.wall <= 0 {
		return
	}
	r.QuietCPUCores = q.cpu.Seconds() / q.wall.Seconds()
	r.QuietRevisions, r.QuietSent = q.revs, q.sent
	r.Marginal = marginal(q, w, r.Config.Routers)
}

// childSpecs splits the workers over the agent processes and the routers
// over the router processes.
func childSpecs(cfg Config, addr, urlBase string, threshold int64) []childSpec {
	var specs []childSpec
	agentBase := 0
	for p := range cfg.AgentProcs {
		lo, hi := p*cfg.Workers/cfg.AgentProcs, (p+1)*cfg.Workers/cfg.AgentProcs
		agents := (p+1)*cfg.Agents/cfg.AgentProcs - p*cfg.Agents/cfg.AgentProcs
		specs = append(specs, childSpec{Role: "agents", Addr: addr,
			Lo: lo, Hi: hi, Agents: agents, AgentBase: agentBase, URLBase: urlBase, ReportRate: cfg.ReportRate,
			FlipRate: cfg.FlipRate * float64(hi-lo) / float64(cfg.Workers), FlipOn: int32(threshold + 10), NoClock: cfg.AgentsNoClock})
		agentBase += agents
	}
	return append(specs, routerSpecs(cfg, addr)...)
}

// routerSpecs splits the routers over the router processes.
func routerSpecs(cfg Config, addr string) []childSpec {
	var specs []childSpec
	base := 0
	for p := range cfg.RouterProcs {
		n := (p+1)*cfg.Routers/cfg.RouterProcs - p*cfg.Routers/cfg.RouterProcs
		s := childSpec{Role: "routers", Addr: addr, Routers: n, RouterBase: base}
		if p == 0 {
			s.Joins = cfg.Joins
		}
		specs = append(specs, s)
		base += n
	}
	if cfg.Joins > 0 {
		// The same joins from a process of their own, as a real router
		// joins: what the joiner's host adds, apart.
		specs = append(specs, childSpec{Role: "joiner", Addr: addr, RouterBase: base, Joins: cfg.Joins})
	}
	return specs
}

// fleetSettled: every worker has an agent and every router is watching.
func fleetSettled(cp *controlplane.ControlPlane, cfg Config) bool {
	routers := 0
	for _, r := range cp.Watch.Routers() {
		if strings.HasPrefix(r.GetRouterId(), "router-") {
			routers++
		}
	}
	if routers < cfg.Routers {
		return false
	}
	for _, w := range cp.Registry.Snapshot().Workers() {
		if w.AgentNode == "" {
			return false
		}
	}
	return true
}

// settleState says how far the fleet has settled.
func settleState(cp *controlplane.ControlPlane) string {
	routers, agented, workers := 0, 0, 0
	var missing []string
	for _, r := range cp.Watch.Routers() {
		if strings.HasPrefix(r.GetRouterId(), "router-") {
			routers++
		}
	}
	for _, w := range cp.Registry.Snapshot().Workers() {
		workers++
		if w.AgentNode != "" {
			agented++
		} else if len(missing) < 5 {
			missing = append(missing, w.ID)
		}
	}
	return fmt.Sprintf("%d routers watching, %d of %d workers reported by an agent (not yet: %v)", routers, agented, workers, missing)
}

// children are the agent and router processes of one run.
type children struct {
	cmds []*exec.Cmd
	outs []*bytes.Buffer
	ins  []io.WriteCloser
}

// window tells every child the quiet window and the measurement window.
func (c *children) window(quiet, start, end time.Time) error {
	for _, in := range c.ins {
		if _, err := fmt.Fprintf(in, "%d %d %d\n", quiet.UnixNano(), start.UnixNano(), end.UnixNano()); err != nil {
			return err
		}
	}
	return nil
}

func startChildren(cfg Config, specs []childSpec) (*children, error) {
	c := &children{}
	for i, s := range specs {
		if cfg.ChildProfiles != "" {
			s.CPUProfile = fmt.Sprintf("%s.%s-%d", cfg.ChildProfiles, s.Role, i)
		}
		raw, err := json.Marshal(s)
		if err != nil {
			return nil, err
		}
		cmd := cfg.Command()
		cmd.Env = append(os.Environ(), childEnv+"="+string(raw))
		out := &bytes.Buffer{}
		cmd.Stdout, cmd.Stderr = out, os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			return nil, err
		}
		c.ins = append(c.ins, in)
		if err := cmd.Start(); err != nil {
			_ = c.wait()
			return nil, fmt.Errorf("start %s child: %w", s.Role, err)
		}
		c.cmds, c.outs = append(c.cmds, cmd), append(c.outs, out)
	}
	return c, nil
}

// wait stops every child (interrupt) and waits for it.
func (c *children) wait() error {
	var errs []error
	for _, in := range c.ins {
		in.Close()
	}
	for _, cmd := range c.cmds {
		_ = cmd.Process.Signal(os.Interrupt)
		if err := cmd.Wait(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// results waits for every child to end on its own and reads its result.
func (c *children) results() ([]*childResult, []string) {
	var out []*childResult
	var errs []string
	for i, cmd := range c.cmds {
		err := cmd.Wait()
		c.ins[i].Close()
		if err != nil {
			errs = append(errs, fmt.Sprintf("child %d: %v", i, err))
			continue
		}
		var r childResult
		if err := json.Unmarshal(c.outs[i].Bytes(), &r); err != nil {
			errs = append(errs, fmt.Sprintf("child %d: bad result: %v", i, err))
			continue
		}
		out = append(out, &r)
	}
	return out, errs
}

// sendLog is, per synthetic router, when the control plane's Send of each
// delta or snapshot returned and the revision it brought the router to
// (recorded from the window's start until the children end). It runs in
// the measured process, once per router per change: each router's log has
// its own lock, so the streams do not queue on one.
type sendLog struct {
	on     atomic.Bool
	byPeer sync.Map // router id → *peerLog
	joined sync.Map // a timed joiner's id → its first send (Unix ns): the snapshot
}

type peerLog struct {
	mu  sync.Mutex
	log []sendAt
}

type sendAt struct {
	rev uint64
	at  int64 // Unix ns
}

func newSendLog() *sendLog { return &sendLog{} }

func (l *sendLog) sent(routerID string, rev uint64) {
	if strings.HasPrefix(routerID, "joiner-") {
		if _, had := l.joined.LoadOrStore(routerID, time.Now().UnixNano()); !had && trace.IsEnabled() {
			trace.Log(context.Background(), "join", routerID+" sent")
		}
		return
	}
	if !l.on.Load() || !strings.HasPrefix(routerID, "router-") {
		return
	}
	at := time.Now().UnixNano()
	p, ok := l.byPeer.Load(routerID)
	if !ok {
		p, _ = l.byPeer.LoadOrStore(routerID, &peerLog{})
	}
	pl := p.(*peerLog)
	pl.mu.Lock()
	defer pl.mu.Unlock()
	pl.log = append(pl.log, sendAt{rev, at})
}

// allAt is when the last of the routers was sent revision rev or a later
// one (each router's log ascends in revision); ok=false if one never was.
func (l *sendLog) allAt(rev uint64, routers int) (int64, bool) {
	var last int64
	peers, all := 0, true
	l.byPeer.Range(func(_, p any) bool {
		pl := p.(*peerLog)
		pl.mu.Lock()
		defer pl.mu.Unlock()
		peers++
		i, _ := slices.BinarySearchFunc(pl.log, rev, func(s sendAt, rev uint64) int { return cmp.Compare(s.rev, rev) })
		if i == len(pl.log) {
			all = false
			return false
		}
		last = max(last, pl.log[i].at)
		return true
	})
	if !all || peers < routers {
		return 0, false
	}
	return last, true
}

// flipLog is the control plane's logger: it keeps the time each verdict
// flip was committed (the inbox logs a flip right after its commit),
// counts warnings and errors by message (a run that logs them says so), and
// drops everything else.
type flipLog struct {
	mu     sync.Mutex
	count  map[string]int   // flips per worker id
	at     map[string]int64 // by flipKey
	hello  map[string]int64 // a timed joiner's id → when its stream was taken (Unix ns)
	warned map[string]*warning
	// counting: warnings are counted (from the children's start to the
	// window's end).
	counting atomic.Bool
}

// warning is one message the control plane logged at Warn or above.
type warning struct {
	n     int
	first string // the first one's attributes
}

func newFlipLog() *flipLog {
	return &flipLog{count: map[string]int{}, at: map[string]int64{}, hello: map[string]int64{}, warned: map[string]*warning{}}
}

func (l *flipLog) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelInfo }
func (l *flipLog) WithAttrs([]slog.Attr) slog.Handler            { return l }
func (l *flipLog) WithGroup(string) slog.Handler                 { return l }

// Handle records the inbox's "Worker overloaded" and "back in routing",
// a timed joiner's hello taken (the watch server's "router watching"), and
// counts warnings.
func (l *flipLog) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		if l.counting.Load() {
			l.warn(r)
		}
		return nil
	}
	if r.Message == "router watching" {
		l.joinerHello(r)
		return nil
	}
	if !strings.HasPrefix(r.Message, "Worker overloaded") && !strings.HasPrefix(r.Message, "Worker under every threshold") {
		return nil
	}
	id := ""
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "worker_id" {
			id = a.Value.String()
			return false
		}
		return true
	})
	w := workerIndex(id)
	if w < 0 {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.count[id]++
	l.at[flipKey(w, l.count[id])] = r.Time.UnixNano()
	if trace.IsEnabled() { // Config.Trace: the commit's wall clock, to find a slow flip in the trace
		trace.Log(context.Background(), "flip", fmt.Sprintf("%s #%d committed %d", id, l.count[id], r.Time.UnixNano()))
	}
	return nil
}

func (l *flipLog) joinerHello(r slog.Record) {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key != "router" {
			return true
		}
		if id := a.Value.String(); strings.HasPrefix(id, "joiner-") {
			l.mu.Lock()
			l.hello[id] = r.Time.UnixNano()
			l.mu.Unlock()
			if trace.IsEnabled() { // Config.Trace: on the joiner's stream goroutine
				trace.Log(context.Background(), "join", id+" hello")
			}
		}
		return false
	})
}

// stampJoin fills a timed join's control-plane steps (joinSample).
func stampJoin(j *joinSample, accepts *acceptLog, l *flipLog, sends *sendLog) {
	if at, ok := accepts.at.Load(j.Local); ok {
		j.Accepted = at.(int64)
	}
	l.mu.Lock()
	j.Hello = l.hello[j.ID]
	l.mu.Unlock()
	if at, ok := sends.joined.Load(j.ID); ok {
		j.Sent = at.(int64)
	}
}

func (l *flipLog) warn(r slog.Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.warned[r.Message]
	if w == nil {
		var b strings.Builder
		r.Attrs(func(a slog.Attr) bool {
			fmt.Fprintf(&b, " %s", a)
			return b.Len() < 200
		})
		w = &warning{first: b.String()}
		l.warned[r.Message] = w
	}
	w.n++
}

// warnings lists what the control plane warned about, most frequent first.
func (l *flipLog) warnings() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	msgs := slices.Collect(maps.Keys(l.warned))
	slices.SortFunc(msgs, func(a, b string) int { return l.warned[b].n - l.warned[a].n })
	var out []string
	for _, m := range msgs {
		out = append(out, fmt.Sprintf("control plane logged %dx %q (first:%s)", l.warned[m].n, m, l.warned[m].first))
	}
	return out
}

func (l *flipLog) committed() map[string]int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.at)
}

// counterSum sums a counter's series.
func counterSum(g prometheus.Gatherer, name string) float64 {
	return counterWhere(g, name, "", "")
}

// counterWhere sums a counter's series whose label has value.
func counterWhere(g prometheus.Gatherer, name, label, value string) float64 {
	return metricSum(g, name, label, value, func(m *dto.Metric) float64 { return m.GetCounter().GetValue() })
}

// metricSum sums val over name's series whose label has value (label "":
// every series).
func metricSum(g prometheus.Gatherer, name, label, value string, val func(*dto.Metric) float64) float64 {
	mfs, err := g.Gather()
	if err != nil {
		return 0
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label == "" || slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == label && l.GetValue() == value }) {
				sum += val(m)
			}
		}
	}
	return sum
}

// readPause holds every agent stream's receive loop from one instant for a
// while (Config.ReadPause).
type readPause struct {
	from, to atomic.Int64 // Unix ns; 0: no pause
}

func (p *readPause) set(from time.Time, d time.Duration) {
	if d > 0 {
		p.to.Store(from.Add(d).UnixNano())
		p.from.Store(from.UnixNano())
	}
}

// wait blocks a receive loop that reads inside the pause until its end.
func (p *readPause) wait() {
	from := p.from.Load()
	if from == 0 {
		return
	}
	if now, to := time.Now().UnixNano(), p.to.Load(); now >= from && now < to {
		time.Sleep(time.Duration(to - now))
	}
}

// cpuTime is this process's user plus system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// rssMiB is this process's resident memory now (Linux; 0 elsewhere).
func rssMiB() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			var kib float64
			if _, err := fmt.Sscanf(strings.TrimSpace(rest), "%f kB", &kib); err == nil {
				return kib / 1024
			}
		}
	}
	return 0
}

// loadAvg is the machine's 1-minute load average (Linux; 0 elsewhere).
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	var l float64
	_, _ = fmt.Sscanf(string(b), "%f", &l)
	return l
}

// slowFlip is one flip's fan-out: committed at (Unix ns), then the control
// plane's last send of it and the last router's receipt, after at.
type slowFlip struct {
	at             int64
	sent, received int64
}

// logSlowest logs the slowest flips to reach every router, with where in
// its second each was committed (the load grid's instants are whole
// seconds plus each phase's offset) and how much of the time the control
// plane's side took.
func logSlowest(w io.Writer, name string, flips []slowFlip) {
	slices.SortFunc(flips, func(a, b slowFlip) int { return cmp.Compare(b.received, a.received) })
	for _, f := range flips[:min(5, len(flips))] {
		fmt.Fprintf(w, "scale %s: slow flip committed at +%d ms in its second: last send %.1f ms, last router %.1f ms\n",
			name, time.Duration(f.at)%time.Second/time.Millisecond, float64(f.sent)/1e6, float64(f.received)/1e6)
	}
}

// logSlowReports logs the slowest report → verdict flips (sent, committed:
// Unix ns), where in its second each was sent, and how far after the send
// the next of the control plane's garbage collections ended (gcEnds: their
// ends, any order): the mark phase runs for the 100-200
// ms before it, and a flip sent inside one waits behind its stream.
func logSlowReports(w io.Writer, name string, flips [][2]int64, gcEnds []time.Time) {
	slices.SortFunc(flips, func(a, b [2]int64) int { return cmp.Compare(b[1]-b[0], a[1]-a[0]) })
	for _, f := range flips[:min(8, len(flips))] {
		after := int64(-1)
		for _, e := range gcEnds {
			if d := e.UnixNano() - f[0]; d >= 0 && (after < 0 || d < after) {
				after = d
			}
		}
		gc := "no GC ended after it"
		if after >= 0 {
			gc = fmt.Sprintf("the next GC ended %.1f ms after the send", float64(after)/1e6)
		}
		fmt.Fprintf(w, "scale %s: slow report → verdict %.1f ms, sent at +%d ms in its second; %s\n",
			name, float64(f[1]-f[0])/1e6, time.Duration(f[0])%time.Second/time.Millisecond, gc)
	}
}

// gcEnds is when the process's last garbage collections ended (up to 256).
func gcEnds() []time.Time {
	var gc debug.GCStats
	debug.ReadGCStats(&gc)
	return gc.PauseEnd
}
