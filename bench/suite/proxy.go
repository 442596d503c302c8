package suite

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The proxy benchmark: smg launch (defaults) and nginx (least_conn, upstream
// keepalive) in front of the same two fast simulated engines, the same closed
// loop of wrk connections sending 4-token chat completions, the proxies
// measured in turn. What it reports is each proxy's CPU time (from /proc)
// per request and per streamed token, and requests per second, as ratios
// smg/nginx of the runs taken side by side.
const (
	proxyEngines   = 2
	proxyMaxTokens = 4
)

// proxySimArgs make engines fast enough that the proxy, not the engine, is
// what a request waits on most: 0.5 ms decode steps, prefill at once, room
// for every connection.
var proxySimArgs = []string{"--itl-ms", "0.5", "--prefill-tokens-per-sec", "10000000", "--max-running-requests", "256"}

// ProxyOptions shape a proxy benchmark run.
type ProxyOptions struct {
	Pairs      int           // runs of each proxy per mode and placement, alternating
	Duration   time.Duration // one run
	Clients    int           // wrk connections
	Profile    bool          // also run a CPU-profiled smg per mode, for the top entries
	Placements []string      // shared, own-cpu (default: both)
}

// Placements of the proxy under test beside wrk and the engines.
const (
	// PlacementShared runs everything on every CPU: wrk, the engines and the
	// proxy share the cores, so in the closed loop req/s mirrors the total
	// CPU per request.
	PlacementShared = "shared"
	// PlacementOwnCPU runs the proxy alone on one CPU (nginx with one worker,
	// smg's GOMAXPROCS following its affinity to 1) and wrk and the engines
	// on another, as a gateway runs on a machine of its own.
	PlacementOwnCPU = "own-cpu"
)

// placement is where each process of a placement may run.
type placement struct {
	name         string
	proxyPin     []string // the command the proxy runs under (nil: any CPU)
	restPin      []string // wrk's and the engines'
	nginxWorkers int
}

// proxyPlacement builds the named placement. own-cpu takes the first two
// CPUs this process may run on: the second for the proxy, the first for wrk
// and the engines.
func proxyPlacement(name string, allowed []int) (placement, error) {
	switch name {
	case PlacementShared:
		return placement{name: name, nginxWorkers: 2}, nil
	case PlacementOwnCPU:
		if len(allowed) < 2 {
			return placement{}, fmt.Errorf("the %s placement needs 2 CPUs (the proxy on one, wrk and the engines on the other); "+
				"this process may run on %d: run it on a machine with 2 or more, or pass --proxy-placements %s", name, len(allowed), PlacementShared)
		}
		if _, err := exec.LookPath("taskset"); err != nil {
			return placement{}, fmt.Errorf("the %s placement pins processes with taskset (util-linux): %w", name, err)
		}
		return placement{name: name, nginxWorkers: 1,
			proxyPin: []string{"taskset", "-c", strconv.Itoa(allowed[1])},
			restPin:  []string{"taskset", "-c", strconv.Itoa(allowed[0])}}, nil
	}
	return placement{}, fmt.Errorf("unknown placement %q (%s or %s)", name, PlacementShared, PlacementOwnCPU)
}

// allowedCPUs lists the CPUs this process may run on.
func allowedCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("sched_getaffinity: %w", err)
	}
	var cpus []int
	for i := range len(set) * 64 {
		if set.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	return cpus, nil
}

// ProxyRun is one proxy under one mode's load in one placement.
type ProxyRun struct {
	Proxy      string  `json:"proxy"` // nginx or smg
	Mode       string  `json:"mode"`  // chat or stream
	Placement  string  `json:"placement"`
	Pair       int     `json:"pair"`
	Requests   int64   `json:"requests"`
	Errors     int64   `json:"errors"` // non-2xx answers and socket errors
	Seconds    float64 `json:"seconds"`
	CPUSeconds float64 `json:"cpu_seconds"` // the proxy's processes, user + system
	// RestCPUSeconds is the engines' and wrk's CPU time over the run.
	RestCPUSeconds float64 `json:"rest_cpu_seconds"`
	// CPUBusy is each CPU's busy fraction over the run, whatever ran on it
	// (/proc/stat: other jobs on the box included), by CPU number.
	CPUBusy []float64 `json:"cpu_busy"`
}

// CPUPerRequest is the proxy's CPU time per request, in microseconds.
func (r ProxyRun) CPUPerRequest() float64 { return r.CPUSeconds * 1e6 / float64(max(r.Requests, 1)) }

// ReqPerSec is the run's throughput.
func (r ProxyRun) ReqPerSec() float64 { return float64(r.Requests) / r.Seconds }

// ProxyCores is how much of a CPU the proxy used over the run.
func (r ProxyRun) ProxyCores() float64 { return r.CPUSeconds / r.Seconds }

// RestCores is how much CPU the engines and wrk used over the run.
func (r ProxyRun) RestCores() float64 { return r.RestCPUSeconds / r.Seconds }

// ProxyReport is a proxy benchmark's runs and the profile of smg's request
// path under each mode.
type ProxyReport struct {
	Options      ProxyOptions      `json:"options"`
	Runs         []ProxyRun        `json:"runs"`
	Profiles     map[string]string `json:"profiles,omitempty"` // mode -> `go tool pprof -top`
	LoadAvgStart string            `json:"load_avg_start"`
	LoadAvgEnd   string            `json:"load_avg_end"`
	// CPUs are the CPUs the own-cpu placement used: wrk's and the engines',
	// then the proxy's.
	CPUs []int `json:"cpus,omitempty"`
	// ProfilePlacement is where the profiled smg ran.
	ProfilePlacement string `json:"profile_placement,omitempty"`
}

var proxyModes = []string{"chat", "stream"}

// proxySetup is one placement's engines and proxies.
type proxySetup struct {
	placement
	fleet   *Fleet
	proxies map[string]*Proc
	urls    map[string]string
}

func (p *proxySetup) stop() {
	for _, pr := range p.proxies {
		pr.Stop(5 * time.Second)
	}
	if p.fleet != nil {
		p.fleet.Stop(5 * time.Second)
	}
}

// startProxySetup starts a placement's engines, smg launch and nginx.
func (s *Suite) startProxySetup(ctx context.Context, pl placement, nginxBin, dir string) (*proxySetup, error) {
	ps := &proxySetup{placement: pl, proxies: map[string]*Proc{}, urls: map[string]string{}}
	var err error
	if ps.fleet, err = startFleet(ctx, pl.restPin, s.Bin, proxyEngines, proxySimArgs); err != nil {
		return nil, err
	}
	gw, err := startGatewayEnv(ctx, pl.proxyPin, s.Bin, ps.fleet.URLs, nil, nil)
	if err != nil {
		ps.stop()
		return nil, err
	}
	ps.proxies["smg"], ps.urls["smg"] = gw.Proc, gw.URL
	ngDir := filepath.Join(dir, pl.name)
	if err := os.Mkdir(ngDir, 0o755); err != nil {
		ps.stop()
		return nil, err
	}
	ng, ngURL, err := startNginx(nginxBin, ngDir, ps.fleet.URLs, 0, pl.nginxWorkers, pl.proxyPin)
	if err != nil {
		ps.stop()
		return nil, err
	}
	ps.proxies["nginx"], ps.urls["nginx"] = ng, ngURL
	return ps, nil
}

// Proxy runs the proxy benchmark: each placement's engines and proxies run
// side by side, and every pair measures each mode in each placement, nginx
// and smg in turn.
func (s *Suite) Proxy(ctx context.Context, o ProxyOptions) (*ProxyReport, error) {
	if len(o.Placements) == 0 {
		o.Placements = []string{PlacementShared, PlacementOwnCPU}
	}
	cpus, err := allowedCPUs()
	if err != nil {
		return nil, err
	}
	var pls []placement
	for _, name := range o.Placements {
		pl, err := proxyPlacement(name, cpus)
		if err != nil {
			return nil, err
		}
		pls = append(pls, pl)
	}
	nginxBin, err := findNginx()
	if err != nil {
		return nil, err
	}
	if _, err := exec.LookPath("wrk"); err != nil {
		return nil, errors.New("wrk not found: make bench-proxy installs it (apt-get install wrk)")
	}
	dir, err := os.MkdirTemp("", "smg-bench-proxy-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var setups []*proxySetup
	defer func() {
		for _, ps := range setups {
			ps.stop()
		}
	}()
	for _, pl := range pls {
		ps, err := s.startProxySetup(ctx, pl, nginxBin, dir)
		if err != nil {
			return nil, fmt.Errorf("%s placement: %w", pl.name, err)
		}
		setups = append(setups, ps)
	}
	scripts := map[string]string{}
	for _, mode := range proxyModes {
		scripts[mode] = filepath.Join(dir, mode+".lua")
		if err := os.WriteFile(scripts[mode], []byte(wrkScript(mode == "stream")), 0o644); err != nil {
			return nil, err
		}
	}
	rep := &ProxyReport{Options: o, LoadAvgStart: loadAvg(), Profiles: map[string]string{}}
	if slices.Contains(o.Placements, PlacementOwnCPU) {
		rep.CPUs = cpus[:2]
	}
	// A short warm-up of each: connections open, pools fill.
	for _, ps := range setups {
		for _, p := range []string{"nginx", "smg"} {
			if _, err := ps.run(ctx, p, scripts["chat"], o.Clients, 2*time.Second); err != nil {
				return nil, fmt.Errorf("%s %s warm-up: %w", ps.name, p, err)
			}
		}
	}
	for pair := range o.Pairs {
		for _, mode := range proxyModes {
			for _, ps := range setups {
				order := []string{"nginx", "smg"}
				if pair%2 == 1 {
					order = []string{"smg", "nginx"} // neither always runs first
				}
				for _, p := range order {
					run, err := ps.run(ctx, p, scripts[mode], o.Clients, o.Duration)
					if err != nil {
						return nil, fmt.Errorf("%s %s %s: %w", ps.name, p, mode, err)
					}
					run.Proxy, run.Mode, run.Placement, run.Pair = p, mode, ps.name, pair
					s.logf("  pair %d %-6s %-7s %-5s %6.0f req/s  %6.1f µs CPU/request  proxy %.2f cores, engines+wrk %.2f  errors %d",
						pair, mode, ps.name, p, run.ReqPerSec(), run.CPUPerRequest(), run.ProxyCores(), run.RestCores(), run.Errors)
					rep.Runs = append(rep.Runs, run)
				}
			}
		}
	}
	if o.Profile {
		ps := setups[0]
		for _, x := range setups {
			if x.name == PlacementOwnCPU { // the placement a gateway has
				ps = x
			}
		}
		rep.ProfilePlacement = ps.name
		for _, mode := range proxyModes {
			top, err := s.profileSMG(ctx, ps, dir, scripts[mode], o)
			if err != nil {
				return nil, fmt.Errorf("profile %s: %w", mode, err)
			}
			rep.Profiles[mode] = top
		}
	}
	rep.LoadAvgEnd = loadAvg()
	return rep, s.writeJSON("proxy.json", rep)
}

// profileSMG runs one more smg launch, placed as ps places its proxies,
// with its CPU profiled under a mode's load and returns the profile's top
// entries.
func (s *Suite) profileSMG(ctx context.Context, ps *proxySetup, dir, script string, o ProxyOptions) (string, error) {
	path := filepath.Join(dir, "cpu.pprof")
	gw, err := startGatewayEnv(ctx, ps.proxyPin, s.Bin, ps.fleet.URLs, nil, []string{"SMG_CPU_PROFILE=" + path})
	if err != nil {
		return "", err
	}
	prof := &proxySetup{placement: ps.placement, fleet: ps.fleet,
		proxies: map[string]*Proc{"smg": gw.Proc}, urls: map[string]string{"smg": gw.URL}}
	_, err = prof.run(ctx, "smg", script, o.Clients, o.Duration)
	gw.Stop(10 * time.Second) // the profile is written as the process exits
	if err != nil {
		return "", err
	}
	out, err := exec.CommandContext(ctx, "go", "tool", "pprof", "-top", "-nodecount=20", s.Bin, path).Output()
	if err != nil {
		return "", fmt.Errorf("go tool pprof: %w", err)
	}
	// Keep the table: from the column heads on.
	text := string(out)
	if i := strings.Index(text, "      flat"); i >= 0 {
		text = text[i:]
	}
	return strings.TrimRight(text, "\n"), nil
}

// wrkScript makes wrk POST a 4-token chat completion.
func wrkScript(stream bool) string {
	return fmt.Sprintf(`wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"sim-model","messages":[{"role":"user","content":"Say hello in a few words, please"}],"max_tokens":%d,"stream":%t}'
`, proxyMaxTokens, stream)
}

var (
	wrkRequestsRe = regexp.MustCompile(`(\d+) requests in ([0-9.]+)(ms|s|m)`)
	wrkNon2xxRe   = regexp.MustCompile(`Non-2xx or 3xx responses: (\d+)`)
	wrkSocketRe   = regexp.MustCompile(`Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)`)
)

// cpuReading is the CPU time of a proxy's process group and the engines',
// and each CPU's times, at one moment.
type cpuReading struct {
	proxy, rest time.Duration
	stat        []cpuStat
}

func readCPU(pgid, restPgid int) (r cpuReading, err error) {
	if r.proxy, err = groupCPU(pgid); err != nil {
		return r, err
	}
	if r.rest, err = groupCPU(restPgid); err != nil {
		return r, err
	}
	r.stat, err = readCPUStat()
	return r, err
}

// run runs one closed-loop wrk run (placed with the engines) against
// proxy p and measures the CPU time the proxy, the engines and wrk spent
// meanwhile, and each CPU's busy time.
func (ps *proxySetup) run(ctx context.Context, p, script string, clients int, d time.Duration) (ProxyRun, error) {
	pgid, restPgid := ps.proxies[p].Cmd.Process.Pid, ps.fleet.Cmd.Process.Pid
	before, err := readCPU(pgid, restPgid)
	if err != nil {
		return ProxyRun{}, err
	}
	args := append(slices.Clone(ps.restPin), "wrk", "-t1", "-c"+strconv.Itoa(clients),
		"-d"+strconv.Itoa(int(d.Seconds()))+"s", "-s", script, ps.urls[p]+"/v1/chat/completions")
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return ProxyRun{}, fmt.Errorf("wrk: %w: %s", err, out)
	}
	after, err := readCPU(pgid, restPgid)
	if err != nil {
		return ProxyRun{}, err
	}
	run, err := parseWrk(string(out), after.proxy-before.proxy)
	wrkCPU := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	run.RestCPUSeconds = (after.rest - before.rest + wrkCPU).Seconds()
	run.CPUBusy = cpuBusy(before.stat, after.stat)
	return run, err
}

func parseWrk(out string, cpu time.Duration) (ProxyRun, error) {
	m := wrkRequestsRe.FindStringSubmatch(out)
	if m == nil {
		return ProxyRun{}, fmt.Errorf("wrk printed no request count: %s", out)
	}
	run := ProxyRun{CPUSeconds: cpu.Seconds()}
	run.Requests, _ = strconv.ParseInt(m[1], 10, 64)
	secs, _ := strconv.ParseFloat(m[2], 64)
	switch m[3] {
	case "ms":
		secs /= 1000
	case "m":
		secs *= 60
	}
	run.Seconds = secs
	if m := wrkNon2xxRe.FindStringSubmatch(out); m != nil {
		n, _ := strconv.ParseInt(m[1], 10, 64)
		run.Errors += n
	}
	if m := wrkSocketRe.FindStringSubmatch(out); m != nil {
		for _, v := range m[1:] {
			n, _ := strconv.ParseInt(v, 10, 64)
			run.Errors += n
		}
	}
	if run.Requests == 0 || run.Seconds <= 0 {
		return run, fmt.Errorf("wrk completed no request: %s", out)
	}
	return run, nil
}

// clockTick is the unit of /proc/PID/stat's CPU times (USER_HZ, 100 on
// every Linux architecture Go supports).
const clockTick = 10 * time.Millisecond

// groupCPU sums user and system CPU time over the live processes of process
// group pgid (nginx's master and workers; smg's one process).
func groupCPU(pgid int) (time.Duration, error) {
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		return 0, err
	}
	var total time.Duration
	found := false
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // exited meanwhile
		}
		group, cpu, ok := parseStat(b)
		if ok && group == pgid {
			total += cpu
			found = true
		}
	}
	if !found {
		return 0, fmt.Errorf("no process in group %d", pgid)
	}
	return total, nil
}

// parseStat reads the process group and user + system time from a
// /proc/PID/stat line (fields after the command, which may hold spaces).
func parseStat(b []byte) (pgid int, cpu time.Duration, ok bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 { // state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
		return 0, 0, false
	}
	pg, err1 := strconv.Atoi(f[2])
	ut, err2 := strconv.ParseInt(f[11], 10, 64)
	st, err3 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return 0, 0, false
	}
	return pg, time.Duration(ut+st) * clockTick, true
}

// cpuStat is one CPU's busy and total time from /proc/stat, in ticks.
type cpuStat struct{ busy, total uint64 }

// readCPUStat reads each CPU's times from /proc/stat, by CPU number.
func readCPUStat() ([]cpuStat, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil, err
	}
	return parseCPUStat(string(b)), nil
}

// parseCPUStat reads the "cpuN user nice system idle iowait ..." lines:
// idle and iowait are idle, the rest busy.
func parseCPUStat(text string) []cpuStat {
	var out []cpuStat
	for l := range strings.Lines(text) {
		f := strings.Fields(l)
		if len(f) < 6 || !strings.HasPrefix(f[0], "cpu") || f[0] == "cpu" {
			continue
		}
		n, err := strconv.Atoi(f[0][3:])
		if err != nil || n < 0 {
			continue
		}
		var st cpuStat
		for i, v := range f[1:] {
			t, _ := strconv.ParseUint(v, 10, 64)
			if i >= 8 { // guest time is counted in user already
				break
			}
			st.total += t
			if i != 3 && i != 4 {
				st.busy += t
			}
		}
		for len(out) <= n {
			out = append(out, cpuStat{})
		}
		out[n] = st
	}
	return out
}

// cpuBusy is each CPU's busy fraction between two readings.
func cpuBusy(before, after []cpuStat) []float64 {
	out := make([]float64, min(len(before), len(after)))
	for i := range out {
		if dt := after[i].total - before[i].total; dt > 0 {
			out[i] = float64(after[i].busy-before[i].busy) / float64(dt)
		}
	}
	return out
}

func findNginx() (string, error) {
	if p, err := exec.LookPath("nginx"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/nginx"); err == nil {
		return "/usr/sbin/nginx", nil
	}
	return "", errors.New("nginx not found: make bench-proxy installs it (apt-get install nginx)")
}

// startNginx runs nginx in the foreground with workers worker processes,
// least_conn over the engines and a keepalive pool to them, on a free port,
// under pin (see startProc).
func startNginx(bin, dir string, engines []string, maxConns, workers int, pin []string) (*Proc, string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	addr := ln.Addr().String()
	ln.Close()
	// max_conns counts per worker process unless the upstream has a shared
	// zone: with one, the cap holds across both workers.
	capStr, zone := "", ""
	if maxConns > 0 {
		capStr, zone = fmt.Sprintf(" max_conns=%d", maxConns), "    zone engines 64k;\n"
	}
	var servers strings.Builder
	for _, u := range engines {
		fmt.Fprintf(&servers, "    server %s%s;\n", strings.TrimPrefix(strings.TrimPrefix(u, "http://"), "https://"), capStr)
	}
	conf := fmt.Sprintf(`worker_processes %[5]d;
daemon off;
pid %[1]s/nginx.pid;
error_log %[1]s/nginx-error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_buffer_size 1m;
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
  upstream engines {
    least_conn;
%[4]s%[2]s    keepalive 64;
  }
  server {
    listen %[3]s;
    location / {
      proxy_pass http://engines;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
`, dir, servers.String(), addr, zone, workers)
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		return nil, "", err
	}
	proc, err := startProc(pin, bin, []string{"-c", path, "-e", filepath.Join(dir, "nginx-error.log")}, nil)
	if err != nil {
		return nil, "", err
	}
	p := proc.Proc
	// Ready once it accepts.
	for deadline := time.Now().Add(10 * time.Second); ; {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return proc, "http://" + addr, nil
		}
		if p.Exited() || time.Now().After(deadline) {
			proc.Stop(time.Second)
			log, _ := os.ReadFile(filepath.Join(dir, "nginx-error.log"))
			return nil, "", fmt.Errorf("nginx did not start: %s%s", p.Log(), log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ProxyRatio is one mode's smg/nginx ratios over the pairs, in one
// placement.
type ProxyRatio struct {
	Mode, Placement          string
	NginxCPU, SMGCPU         float64 // µs per request, medians over the pairs
	NginxRPS, SMGRPS         float64 // medians
	CPURatio, RPSRatio       float64 // medians of the pairs' ratios
	CPURatioMin, CPURatioMax float64
	RPSRatioMin, RPSRatioMax float64
	Pairs                    int
	Errors                   int64
	// Use is what each proxy's runs used of the CPUs, medians.
	Use map[string]ProxyUse
}

// ProxyUse is what a proxy's runs used of the CPUs: the proxy's and the
// engines' and wrk's own CPU time over the run's length, and each CPU's
// busy fraction whatever ran on it.
type ProxyUse struct {
	ProxyCores, RestCores float64
	// ProxyPerRequest and RestPerRequest are the CPU µs a request takes on
	// each side: which CPU a quiet box would fill first.
	ProxyPerRequest, RestPerRequest float64
	CPUBusy                         []float64
}

// Ratios pairs each smg run with the nginx run of the same pair, mode and
// placement.
func (rep *ProxyReport) Ratios() []ProxyRatio {
	var out []ProxyRatio
	placements := rep.Options.Placements
	if len(placements) == 0 {
		placements = []string{""}
	}
	for _, mode := range proxyModes {
		for _, pl := range placements {
			if r, ok := rep.ratio(mode, pl); ok {
				out = append(out, r)
			}
		}
	}
	return out
}

func (rep *ProxyReport) ratio(mode, placement string) (ProxyRatio, bool) {
	r := ProxyRatio{Mode: mode, Placement: placement, Use: map[string]ProxyUse{}}
	var ncpu, scpu, nrps, srps, cpuR, rpsR []float64
	var paired []*ProxyRun
	for pair := range rep.Options.Pairs {
		var n, sm *ProxyRun
		for i := range rep.Runs {
			run := &rep.Runs[i]
			if run.Mode != mode || run.Placement != placement || run.Pair != pair {
				continue
			}
			if run.Proxy == "nginx" {
				n = run
			} else {
				sm = run
			}
			r.Errors += run.Errors
		}
		if n == nil || sm == nil {
			continue
		}
		paired = append(paired, n, sm)
		ncpu, scpu = append(ncpu, n.CPUPerRequest()), append(scpu, sm.CPUPerRequest())
		nrps, srps = append(nrps, n.ReqPerSec()), append(srps, sm.ReqPerSec())
		cpuR = append(cpuR, sm.CPUPerRequest()/n.CPUPerRequest())
		rpsR = append(rpsR, sm.ReqPerSec()/n.ReqPerSec())
	}
	if r.Pairs = len(cpuR); r.Pairs == 0 {
		return r, false
	}
	r.NginxCPU, r.SMGCPU, r.NginxRPS, r.SMGRPS = median(ncpu), median(scpu), median(nrps), median(srps)
	r.CPURatio, r.RPSRatio = median(cpuR), median(rpsR)
	r.CPURatioMin, r.CPURatioMax = slices.Min(cpuR), slices.Max(cpuR)
	r.RPSRatioMin, r.RPSRatioMax = slices.Min(rpsR), slices.Max(rpsR)
	for _, proxy := range []string{"nginx", "smg"} {
		var pc, rc, pr, rr []float64
		var busy [][]float64
		for _, run := range paired {
			if run.Proxy != proxy {
				continue
			}
			pc, rc = append(pc, run.ProxyCores()), append(rc, run.RestCores())
			pr, rr = append(pr, run.CPUPerRequest()), append(rr, run.RestCPUSeconds*1e6/float64(max(run.Requests, 1)))
			for i, b := range run.CPUBusy {
				for len(busy) <= i {
					busy = append(busy, nil)
				}
				busy[i] = append(busy[i], b)
			}
		}
		u := ProxyUse{ProxyCores: median(pc), RestCores: median(rc), ProxyPerRequest: median(pr), RestPerRequest: median(rr)}
		for _, b := range busy {
			u.CPUBusy = append(u.CPUBusy, median(b))
		}
		r.Use[proxy] = u
	}
	return r, true
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}

// proxySection is where make bench-proxy writes.
var proxySection = docSection{
	heading: "## Proxy cost: smg beside nginx",
	intro:   "Generated by `make bench-proxy`.",
}

// WriteProxyTable writes the ratios as a markdown table, then what each
// proxy used of the CPUs.
func WriteProxyTable(w *bytes.Buffer, rep *ProxyReport) {
	rs := rep.Ratios()
	fmt.Fprintf(w, "| load | placement | nginx CPU | smg CPU | CPU smg/nginx (median, range) | nginx req/s | smg req/s | req/s smg/nginx (median, range) | errors |\n")
	fmt.Fprintf(w, "|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		unit, div := "µs/request", 1.0
		if r.Mode == "stream" {
			unit, div = "µs/token", proxyMaxTokens
		}
		fmt.Fprintf(w, "| %s | %s | %.1f %s | %.1f %s | **%.2f** (%.2f-%.2f) | %.0f | %.0f | **%.2f** (%.2f-%.2f) | %d |\n",
			modeLabel(r.Mode), r.Placement, r.NginxCPU/div, unit, r.SMGCPU/div, unit, r.CPURatio, r.CPURatioMin, r.CPURatioMax,
			r.NginxRPS, r.SMGRPS, r.RPSRatio, r.RPSRatioMin, r.RPSRatioMax, r.Errors)
	}
	cpus := rep.CPUs
	if len(cpus) < 2 {
		return
	}
	fmt.Fprintf(w, "\nWhat bounds req/s: each proxy's CPU time and the engines' and wrk's, over the run's length (cores) and per request (µs), "+
		"and each CPU's busy fraction whatever ran on it (/proc/stat, other jobs included); medians over the pairs. "+
		"In %s, CPU %d runs wrk and the engines and CPU %d the proxy: the CPU its own processes fill bounds req/s; "+
		"where other jobs fill both, the side that needs more µs per request is the one a quiet box fills first (by demand).\n\n",
		PlacementOwnCPU, cpus[0], cpus[1])
	fmt.Fprintf(w, "| load | placement | proxy | req/s | proxy (cores) | engines + wrk (cores) | proxy µs/request | engines + wrk µs/request | CPU %d busy | CPU %d busy | bound by |\n", cpus[0], cpus[1])
	fmt.Fprintf(w, "|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		for _, proxy := range []string{"nginx", "smg"} {
			u := r.Use[proxy]
			rps := r.NginxRPS
			if proxy == "smg" {
				rps = r.SMGRPS
			}
			fmt.Fprintf(w, "| %s | %s | %s | %.0f | %.2f | %.2f | %.1f | %.1f | %.0f%% | %.0f%% | %s |\n", modeLabel(r.Mode), r.Placement, proxy, rps,
				u.ProxyCores, u.RestCores, u.ProxyPerRequest, u.RestPerRequest, 100*busyOf(u, cpus[0]), 100*busyOf(u, cpus[1]),
				boundBy(r.Placement, u, busyOf(u, cpus[0]), busyOf(u, cpus[1])))
		}
	}
}

func modeLabel(mode string) string {
	if mode == "stream" {
		return "chat, streaming"
	}
	return "chat, non-streaming"
}

func busyOf(u ProxyUse, cpu int) float64 {
	if cpu < len(u.CPUBusy) {
		return u.CPUBusy[cpu]
	}
	return 0
}

// fullCPU is the share of a CPU past which a run counts as bounded by it.
const fullCPU = 0.9

// boundBy names what bounds a closed loop's req/s in a placement: the CPU
// its own processes fill; where other jobs fill a CPU too, the side that
// needs more CPU per request (a quiet box fills it first). In the shared
// placement everything takes from the same cores.
func boundBy(placement string, u ProxyUse, restBusy, proxyBusy float64) string {
	switch {
	case placement != PlacementOwnCPU:
		return "the shared cores"
	case u.ProxyCores >= fullCPU:
		return "the proxy's CPU"
	case u.RestCores >= fullCPU:
		return "the engines' CPU"
	case restBusy < fullCPU && proxyBusy < fullCPU:
		return "neither CPU full"
	case u.RestPerRequest >= u.ProxyPerRequest:
		return "the engines' CPU, by demand (other jobs on the CPUs)"
	}
	return "the proxy's CPU, by demand (other jobs on the CPUs)"
}

// PublishProxy writes the table and the profiles into docs/benchmarks.md.
func (s *Suite) PublishProxy(rep *ProxyReport) error {
	var b bytes.Buffer
	o := rep.Options
	fmt.Fprintf(&b, "`smg launch` (defaults) and nginx (`least_conn`, `keepalive 64`, `proxy_buffering off`) "+
		"in front of the same %d `smg sim` engines (%s), measured in turn: %d pairs per load and placement, %s per run, "+
		"`wrk -t1 -c%d` sending chat completions of %d tokens (streamed tokens: %d per request). "+
		"Placements: **%s**, wrk, the engines and the proxy all on the box's CPUs (nginx 2 workers, smg's GOMAXPROCS the CPU count); "+
		"**%s**, the proxy alone on one CPU (nginx 1 worker, smg's GOMAXPROCS 1, following its affinity) and wrk and the engines on another (`taskset -c`), "+
		"as a gateway runs on its own machine. "+
		"CPU is each proxy's user + system time from /proc (nginx: master and workers) over the run. "+
		"Load average (1, 5, 15 min) %s at the start, %s at the end, on %s, shared with other jobs: "+
		"absolute figures move with the box, the ratios of runs taken side by side much less.\n\n",
		proxyEngines, strings.Join(proxySimArgs, " "), o.Pairs, o.Duration, o.Clients, proxyMaxTokens, proxyMaxTokens,
		PlacementShared, PlacementOwnCPU, rep.LoadAvgStart, rep.LoadAvgEnd, Machine())
	WriteProxyTable(&b, rep)
	for _, mode := range proxyModes {
		if top := rep.Profiles[mode]; top != "" {
			fmt.Fprintf(&b, "\nsmg's CPU profile under the %s load, %s placement (`SMG_CPU_PROFILE`, `go tool pprof -top`):\n\n```\n%s\n```\n", mode, rep.ProfilePlacement, top)
		}
	}
	return replaceSectionBlock(filepath.Join(s.DocsDir, "benchmarks.md"), proxySection, "bench-proxy", b.String())
}
