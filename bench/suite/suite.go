// Package suite measures what overload protection buys: the scenarios behind
// make bench-overload, bench-faults and bench-proxy, which run real smg sim
// fleets behind smg launch under bench's load generator and write tables. It
// starts processes through internal/testutil, so only bench/cmd/benchsuite
// links it, never smg.
package suite

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/smg-project/smg/bench"
)

// Suite holds what every scenario shares: the smg binary, the fleet's shape
// and where results go.
type Suite struct {
	Bin     string    // smg binary
	RawDir  string    // per-run JSON results
	DocsDir string    // docs/: benchmarks.md and img/ ("" writes no docs)
	Short   bool      // smoke-test sizes: shapes, not timings
	Seed    uint64    // simulator and load seed
	Log     io.Writer // progress
	// AgentPoll > 0 runs one smg agent covering every engine, polling each
	// that often and pushing load records to the control plane; 0 leaves the
	// engines to the control plane's HTTP poll (--load-monitor-interval).
	AgentPoll time.Duration
	// Exploration knobs of the overload scenario (zero: the full scenario).
	Configs  []string  // run only these configurations
	Loads    []float64 // offered loads instead of 0.5, 1, 1.5, 2
	Capacity float64   // req/s instead of a calibration run
	// TunedWaiting is the waiting ceiling of shed-tuned (0: tunedWaiting).
	TunedWaiting int
	// WindowWait, when set, replaces the router wait
	// (--worker-admission-wait-secs) of every window configuration.
	WindowWait string

	client *http.Client
}

// The fleet: 4 engines with a running window of 8, 20 ms decode steps that
// grow 2% per running request, vLLM flavor. Requests stream 32-64 tokens
// after 256-768 prompt tokens, so one takes about a second on an idle engine
// and an engine serves about 8 requests/s: short runs, but engines that queue
// and batch like real ones.
const (
	fleetSize   = 4
	engineSlots = 8
	itlMs       = 20.0
	itlGrowth   = 0.02
	prefillRate = 20000.0
)

// nominalCapacity is what the fleet's parameters promise: every slot busy,
// each request a prefill then mean-output steps at a full batch's step time.
// Short runs use it instead of a calibration run; full runs measure.
func nominalCapacity() Capacity {
	service := (promptDist.Mean()+7)/prefillRate + outputDist.Mean()*itlMs/1000*(1+itlGrowth*(engineSlots-1))
	rps := fleetSize * engineSlots / service
	return Capacity{ReqPerSec: rps, TokensPerSec: rps * outputDist.Mean()}
}

// simArgs are the simulator flags of every scenario.
func (s *Suite) simArgs() []string {
	return []string{"--seed", fmt.Sprint(s.Seed), "--max-running-requests", fmt.Sprint(engineSlots),
		"--itl-ms", fmt.Sprint(itlMs), "--itl-growth", fmt.Sprint(itlGrowth), "--prefill-tokens-per-sec", fmt.Sprint(prefillRate)}
}

var (
	promptDist = bench.Dist{Min: 256, Max: 768}
	outputDist = bench.Dist{Min: 32, Max: 64}
)

// gatewayBase are flags every configuration shares: polls every second, as a
// short benchmark needs, and Ready after one passing probe.
var gatewayBase = []string{"--load-monitor-interval", "1", "--health-success-threshold", "1", "--policy", "least_load"}

func (s *Suite) logf(format string, a ...any) {
	if s.Log != nil {
		fmt.Fprintf(s.Log, format+"\n", a...)
	}
}

func (s *Suite) httpClient() *http.Client {
	if s.client == nil {
		s.client = bench.NewHTTPClient()
	}
	return s.client
}

// env is one fleet behind one gateway, with the node agent when the suite has one.
type env struct {
	fleet   *Fleet
	gw      *Gateway
	agent   *Proc
	routers []*Proc  // extra routers beside the gateway's own
	urls    []string // every router's URL when there are several
	workers []string // the engines' URLs as registered (gRPC ones for a GRPC configuration)
	// nginx, when the configuration has no smg: its URL and scratch dir.
	nginx              *Proc
	nginxURL, nginxDir string
}

// url is where clients send requests (the first router's, or nginx's).
func (e *env) url() string {
	if e.nginx != nil {
		return e.nginxURL
	}
	return e.gw.URL
}

func (e *env) stop() {
	if e.nginx != nil {
		e.nginx.Stop(5 * time.Second)
		os.RemoveAll(e.nginxDir)
	}
	for _, r := range e.routers {
		r.Stop(5 * time.Second)
	}
	e.agent.Stop(5 * time.Second)
	if e.gw != nil {
		e.gw.Stop(5 * time.Second)
	}
	if e.fleet != nil {
		e.fleet.Stop(5 * time.Second)
	}
}

// start runs a fresh fleet and a gateway with flags in front of it.
func (s *Suite) start(ctx context.Context, flags []string) (*env, error) {
	return s.startConfig(ctx, GatewayConfig{Flags: flags})
}

// startConfig runs a fresh fleet, a gateway and the configuration's extra
// routers.
func (s *Suite) startConfig(ctx context.Context, gc GatewayConfig) (*env, error) {
	sched, err := schedulerFlags(gc)
	if err != nil {
		return nil, err
	}
	flags := append(append([]string{}, gc.Flags...), sched...)
	var peers [][]string // each router's --port and --peer-routers, gateway first
	if gc.Handoff && gc.Routers > 1 {
		if peers, err = peerFlags(gc.Routers); err != nil {
			return nil, err
		}
		flags = append(flags, peers[0]...)
	}
	simArgs := append(s.simArgs(), gc.SimArgs...)
	if gc.GRPC {
		simArgs = append(simArgs, "--grpc-port", "0")
	}
	f, err := StartFleet(ctx, s.Bin, gc.engines(), simArgs)
	if err != nil {
		return nil, err
	}
	if gc.NginxMaxConns > 0 {
		e := &env{fleet: f}
		if e.nginx, e.nginxURL, e.nginxDir, err = s.startNginxFor(f, gc.NginxMaxConns); err != nil {
			f.Stop(time.Second)
			return nil, err
		}
		return e, nil
	}
	workers := f.URLs
	if gc.GRPC {
		workers = f.GRPCURLs
	}
	gw, err := StartGateway(ctx, s.Bin, workers, append(append([]string{}, gatewayBase...), flags...))
	if err != nil {
		f.Stop(time.Second)
		return nil, err
	}
	e := &env{fleet: f, gw: gw, workers: workers}
	if s.AgentPoll > 0 {
		if e.agent, err = StartAgent(ctx, s.Bin, gw, "n1", workers, s.AgentPoll); err != nil {
			e.stop()
			return nil, err
		}
	}
	if gc.Routers > 1 {
		e.urls = []string{gw.URL}
		for i := 1; i < gc.Routers; i++ {
			// Every router runs the same scheduler YAML as the gateway's.
			rf := append(append([]string{}, gc.RouterFlags...), sched...)
			if peers != nil {
				rf = append(rf, peers[i]...)
			}
			p, url, err := StartRouter(ctx, s.Bin, gw, fmt.Sprintf("r%d", i), rf)
			if err != nil {
				e.stop()
				return nil, err
			}
			e.routers = append(e.routers, p)
			e.urls = append(e.urls, url)
		}
	}
	if slices.Contains(flags, "--worker-admission-window") {
		// Learned windows need a burst that queues on every engine: on a
		// starved box one burst may not, so it is sent again until the
		// windows are learned and split.
		warm := func() {}
		if gc.LearnWindows {
			urls := e.urls // every router's, or none with one router
			if len(urls) == 0 {
				urls = []string{gw.URL}
			}
			warm = func() { warmWindows(ctx, urls, 2*gc.engines()*engineSlots) }
		}
		var err error
		for deadline := time.Now().Add(time.Minute); ; {
			warm()
			err = gw.waitShares(ctx, gc.engines(), max(1, gc.Routers), 10*time.Second)
			if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
				break
			}
		}
		if err != nil {
			e.stop()
			return nil, err
		}
	}
	return e, nil
}

// peerFlags picks n free loopback ports and gives each router its --port and
// the others' URLs as --peer-routers (a port picked here may be taken before
// its router binds it; the router then fails to start and the run says so).
func peerFlags(n int) ([][]string, error) {
	ports := make([]string, n)
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		_, ports[i], _ = net.SplitHostPort(ln.Addr().String())
		defer ln.Close()
	}
	out := make([][]string, n)
	for i := range out {
		var others []string
		for j, p := range ports {
			if j != i {
				others = append(others, "http://127.0.0.1:"+p)
			}
		}
		out[i] = []string{"--port", ports[i], "--peer-routers", strings.Join(others, ",")}
	}
	return out, nil
}

// Capacity is the fleet's measured saturation throughput.
type Capacity struct {
	ReqPerSec    float64 `json:"req_per_sec"`
	TokensPerSec float64 `json:"tokens_per_sec"`
	Clients      int     `json:"clients"`
	Seconds      float64 `json:"seconds"`
}

// Calibrate measures the fleet's capacity: closed-loop clients, half again as
// many as the fleet has running slots so no slot waits for a client, through
// a gateway with protection off. Only requests that end after a warm-up (the
// first quarter, while the first batches fill) and inside the window count.
// 24 s: the answers cut by the window's edges weigh half as much as in 12 s,
// whose readings spread 1.9% on one box where 24 s ones spread 0.1%.
func (s *Suite) Calibrate(ctx context.Context) (Capacity, error) {
	d := 24 * time.Second
	if s.Short {
		d = 4 * time.Second
	}
	return s.calibrate(ctx, GatewayConfig{Flags: []string{"--disable-worker-overload-protection"}}, fleetSize*engineSlots,
		promptDist, outputDist, d)
}

// calibrate measures the capacity of gc's fleet (slots running slots in
// all) under the given request lengths for d.
func (s *Suite) calibrate(ctx context.Context, gc GatewayConfig, slots int, prompt, output bench.Dist, d time.Duration) (Capacity, error) {
	e, err := s.startConfig(ctx, gc)
	if err != nil {
		return Capacity{}, err
	}
	defer e.stop()
	warm := d / 4
	clients := slots * 3 / 2
	s.logf("calibrating: %d closed-loop clients for %s", clients, d)
	res, err := bench.Run(ctx, s.httpClient(), bench.Config{URL: e.gw.URL, Clients: clients, Duration: d, Prompt: prompt,
		Output: output, Timeout: 30 * time.Second, Seed: s.Seed}, nil)
	if err != nil {
		return Capacity{}, err
	}
	var n, tokens int
	for _, r := range res.Records {
		if end := r.Start + r.E2E; r.Completed && end > warm.Seconds() && end <= d.Seconds() {
			n++
			tokens += r.Tokens
		}
	}
	secs := (d - warm).Seconds()
	c := Capacity{ReqPerSec: float64(n) / secs, TokensPerSec: float64(tokens) / secs, Clients: clients, Seconds: secs}
	if c.ReqPerSec <= 0 {
		return c, fmt.Errorf("calibration completed no request (%+v)", res.Summary)
	}
	s.logf("capacity: %.1f req/s, %.0f output tokens/s", c.ReqPerSec, c.TokensPerSec)
	return c, nil
}

func (s *Suite) writeJSON(name string, v any) error {
	if s.RawDir == "" {
		return nil
	}
	if err := os.MkdirAll(s.RawDir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(s.RawDir, name), b, 0o644)
}

func progressLogger(s *Suite, label string) func(bench.Progress) {
	return func(p bench.Progress) {
		s.logf("  %-22s %4.0fs  sent %5d  in flight %4d  ok %5d  shed %5d  err %4d", label,
			p.Elapsed.Seconds(), p.Sent, p.InFlight, p.Completed, p.Shed, p.Errors)
	}
}

// Machine says what a benchmark ran on, for the docs' tables: the cores Go
// sees, the CPU model (Linux) and the Go version.
func Machine() string {
	m := fmt.Sprintf("%d cores", runtime.NumCPU())
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for l := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m += " (" + strings.TrimSpace(v) + ")"
				break
			}
		}
	}
	return m + ", " + runtime.Version()
}

// loadAvg reads the 1, 5 and 15 minute load averages ("" off Linux).
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}
