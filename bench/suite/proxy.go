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

	"github.com/smg-project/smg/internal/testutil"
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
	Pairs    int           // runs of each proxy per mode, alternating
	Duration time.Duration // one run
	Clients  int           // wrk connections
	Profile  bool          // also run a CPU-profiled smg per mode, for the top entries
}

// ProxyRun is one proxy under one mode's load.
type ProxyRun struct {
	Proxy      string  `json:"proxy"` // nginx or smg
	Mode       string  `json:"mode"`  // chat or stream
	Pair       int     `json:"pair"`
	Requests   int64   `json:"requests"`
	Errors     int64   `json:"errors"` // non-2xx answers and socket errors
	Seconds    float64 `json:"seconds"`
	CPUSeconds float64 `json:"cpu_seconds"` // the proxy's processes, user + system
}

// CPUPerRequest is the proxy's CPU time per request, in microseconds.
func (r ProxyRun) CPUPerRequest() float64 { return r.CPUSeconds * 1e6 / float64(max(r.Requests, 1)) }

// ReqPerSec is the run's throughput.
func (r ProxyRun) ReqPerSec() float64 { return float64(r.Requests) / r.Seconds }

// ProxyReport is a proxy benchmark's runs and the profile of smg's request
// path under each mode.
type ProxyReport struct {
	Options      ProxyOptions      `json:"options"`
	Runs         []ProxyRun        `json:"runs"`
	Profiles     map[string]string `json:"profiles,omitempty"` // mode -> `go tool pprof -top`
	LoadAvgStart string            `json:"load_avg_start"`
	LoadAvgEnd   string            `json:"load_avg_end"`
}

var proxyModes = []string{"chat", "stream"}

// Proxy runs the proxy benchmark.
func (s *Suite) Proxy(ctx context.Context, o ProxyOptions) (*ProxyReport, error) {
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
	f, err := StartFleet(ctx, s.Bin, proxyEngines, proxySimArgs)
	if err != nil {
		return nil, err
	}
	defer f.Stop(5 * time.Second)
	gw, err := StartGateway(ctx, s.Bin, f.URLs, nil)
	if err != nil {
		return nil, err
	}
	defer gw.Stop(5 * time.Second)
	ng, ngURL, err := startNginx(nginxBin, dir, f.URLs, 0)
	if err != nil {
		return nil, err
	}
	defer ng.Stop(5 * time.Second)
	scripts := map[string]string{}
	for _, mode := range proxyModes {
		scripts[mode] = filepath.Join(dir, mode+".lua")
		if err := os.WriteFile(scripts[mode], []byte(wrkScript(mode == "stream")), 0o644); err != nil {
			return nil, err
		}
	}
	proxies := map[string]struct {
		url  string
		pgid int
	}{"nginx": {ngURL, ng.Cmd.Process.Pid}, "smg": {gw.URL, gw.Cmd.Process.Pid}}
	rep := &ProxyReport{Options: o, LoadAvgStart: loadAvg(), Profiles: map[string]string{}}
	// A short warm-up of each: connections open, pools fill.
	for _, p := range []string{"nginx", "smg"} {
		if _, err := runWrk(ctx, proxies[p].url, scripts["chat"], o.Clients, 2*time.Second, proxies[p].pgid); err != nil {
			return nil, fmt.Errorf("%s warm-up: %w", p, err)
		}
	}
	for pair := range o.Pairs {
		for _, mode := range proxyModes {
			order := []string{"nginx", "smg"}
			if pair%2 == 1 {
				order = []string{"smg", "nginx"} // neither always runs first
			}
			for _, p := range order {
				run, err := runWrk(ctx, proxies[p].url, scripts[mode], o.Clients, o.Duration, proxies[p].pgid)
				if err != nil {
					return nil, fmt.Errorf("%s %s: %w", p, mode, err)
				}
				run.Proxy, run.Mode, run.Pair = p, mode, pair
				s.logf("  pair %d %-6s %-5s %6.0f req/s  %6.1f µs CPU/request  errors %d", pair, mode, p,
					run.ReqPerSec(), run.CPUPerRequest(), run.Errors)
				rep.Runs = append(rep.Runs, run)
			}
		}
	}
	if o.Profile {
		for _, mode := range proxyModes {
			top, err := s.profileSMG(ctx, f.URLs, dir, scripts[mode], o)
			if err != nil {
				return nil, fmt.Errorf("profile %s: %w", mode, err)
			}
			rep.Profiles[mode] = top
		}
	}
	rep.LoadAvgEnd = loadAvg()
	return rep, s.writeJSON("proxy.json", rep)
}

// profileSMG runs one more smg launch with its CPU profiled under a mode's
// load and returns the profile's top entries.
func (s *Suite) profileSMG(ctx context.Context, engines []string, dir, script string, o ProxyOptions) (string, error) {
	path := filepath.Join(dir, "cpu.pprof")
	gw, err := startGatewayEnv(ctx, s.Bin, engines, nil, []string{"SMG_CPU_PROFILE=" + path})
	if err != nil {
		return "", err
	}
	_, err = runWrk(ctx, gw.URL, script, o.Clients, o.Duration, gw.Cmd.Process.Pid)
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

// runWrk runs one closed-loop wrk run against url and measures the CPU time
// the process group pgid spent meanwhile.
func runWrk(ctx context.Context, url, script string, clients int, d time.Duration, pgid int) (ProxyRun, error) {
	before, err := groupCPU(pgid)
	if err != nil {
		return ProxyRun{}, err
	}
	out, err := exec.CommandContext(ctx, "wrk", "-t1", "-c"+strconv.Itoa(clients),
		"-d"+strconv.Itoa(int(d.Seconds()))+"s", "-s", script, url+"/v1/chat/completions").CombinedOutput()
	if err != nil {
		return ProxyRun{}, fmt.Errorf("wrk: %w: %s", err, out)
	}
	after, err := groupCPU(pgid)
	if err != nil {
		return ProxyRun{}, err
	}
	return parseWrk(string(out), after-before)
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

func findNginx() (string, error) {
	if p, err := exec.LookPath("nginx"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/nginx"); err == nil {
		return "/usr/sbin/nginx", nil
	}
	return "", errors.New("nginx not found: make bench-proxy installs it (apt-get install nginx)")
}

// startNginx runs nginx in the foreground with two workers, least_conn over
// the engines and a keepalive pool to them, on a free port.
func startNginx(bin, dir string, engines []string, maxConns int) (*Proc, string, error) {
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
	conf := fmt.Sprintf(`worker_processes 2;
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
`, dir, servers.String(), addr, zone)
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		return nil, "", err
	}
	p, err := testutil.Start("nginx", bin, []string{"-c", path, "-e", filepath.Join(dir, "nginx-error.log")}, testutil.Options{Group: true})
	if err != nil {
		return nil, "", err
	}
	proc := &Proc{Proc: p, done: p.Done()}
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

// ProxyRatio is one mode's smg/nginx ratios over the pairs.
type ProxyRatio struct {
	Mode                     string
	NginxCPU, SMGCPU         float64 // µs per request, medians over the pairs
	NginxRPS, SMGRPS         float64 // medians
	CPURatio, RPSRatio       float64 // medians of the pairs' ratios
	CPURatioMin, CPURatioMax float64
	RPSRatioMin, RPSRatioMax float64
	Pairs                    int
	Errors                   int64
}

// Ratios pairs each smg run with the nginx run of the same pair and mode.
func (rep *ProxyReport) Ratios() []ProxyRatio {
	var out []ProxyRatio
	for _, mode := range proxyModes {
		r := ProxyRatio{Mode: mode}
		var ncpu, scpu, nrps, srps, cpuR, rpsR []float64
		for pair := range rep.Options.Pairs {
			var n, sm *ProxyRun
			for i := range rep.Runs {
				run := &rep.Runs[i]
				if run.Mode != mode || run.Pair != pair {
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
			ncpu, scpu = append(ncpu, n.CPUPerRequest()), append(scpu, sm.CPUPerRequest())
			nrps, srps = append(nrps, n.ReqPerSec()), append(srps, sm.ReqPerSec())
			cpuR = append(cpuR, sm.CPUPerRequest()/n.CPUPerRequest())
			rpsR = append(rpsR, sm.ReqPerSec()/n.ReqPerSec())
		}
		if r.Pairs = len(cpuR); r.Pairs == 0 {
			continue
		}
		r.NginxCPU, r.SMGCPU, r.NginxRPS, r.SMGRPS = median(ncpu), median(scpu), median(nrps), median(srps)
		r.CPURatio, r.RPSRatio = median(cpuR), median(rpsR)
		r.CPURatioMin, r.CPURatioMax = slices.Min(cpuR), slices.Max(cpuR)
		r.RPSRatioMin, r.RPSRatioMax = slices.Min(rpsR), slices.Max(rpsR)
		out = append(out, r)
	}
	return out
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

// WriteProxyTable writes the ratios as a markdown table.
func WriteProxyTable(w *bytes.Buffer, rep *ProxyReport) {
	fmt.Fprintf(w, "| load | nginx CPU | smg CPU | CPU smg/nginx (median, range) | nginx req/s | smg req/s | req/s smg/nginx (median, range) | errors |\n")
	fmt.Fprintf(w, "|---|---|---|---|---|---|---|---|\n")
	for _, r := range rep.Ratios() {
		unit, div := "µs/request", 1.0
		label := "chat, non-streaming"
		if r.Mode == "stream" {
			unit, div, label = "µs/token", proxyMaxTokens, "chat, streaming"
		}
		fmt.Fprintf(w, "| %s | %.1f %s | %.1f %s | **%.2f** (%.2f-%.2f) | %.0f | %.0f | **%.2f** (%.2f-%.2f) | %d |\n",
			label, r.NginxCPU/div, unit, r.SMGCPU/div, unit, r.CPURatio, r.CPURatioMin, r.CPURatioMax,
			r.NginxRPS, r.SMGRPS, r.RPSRatio, r.RPSRatioMin, r.RPSRatioMax, r.Errors)
	}
}

// PublishProxy writes the table and the profiles into docs/benchmarks.md.
func (s *Suite) PublishProxy(rep *ProxyReport) error {
	var b bytes.Buffer
	o := rep.Options
	fmt.Fprintf(&b, "`smg launch` (defaults) and nginx (2 workers, `least_conn`, `keepalive 64`, `proxy_buffering off`) "+
		"in front of the same %d `smg sim` engines (%s), measured in turn: %d pairs per load, %s per run, "+
		"`wrk -t1 -c%d` sending chat completions of %d tokens (streamed tokens: %d per request). "+
		"CPU is each proxy's user + system time from /proc (nginx: master and workers) over the run. "+
		"Load average (1, 5, 15 min) %s at the start, %s at the end, on %s, shared with other jobs: "+
		"absolute figures move with the box, the ratios of runs taken side by side much less.\n\n",
		proxyEngines, strings.Join(proxySimArgs, " "), o.Pairs, o.Duration, o.Clients, proxyMaxTokens, proxyMaxTokens,
		rep.LoadAvgStart, rep.LoadAvgEnd, Machine())
	WriteProxyTable(&b, rep)
	for _, mode := range proxyModes {
		if top := rep.Profiles[mode]; top != "" {
			fmt.Fprintf(&b, "\nsmg's CPU profile under the %s load (`SMG_CPU_PROFILE`, `go tool pprof -top`):\n\n```\n%s\n```\n", mode, top)
		}
	}
	return replaceSectionBlock(filepath.Join(s.DocsDir, "benchmarks.md"), proxySection, "bench-proxy", b.String())
}
