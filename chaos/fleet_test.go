// Package chaos is the network-fault suite (make chaos, docs/chaos.md): real
// smg binaries, each in a network namespace of internal/netlab, under faults
// injected with iptables while traffic flows, checked against what the spec
// promises. It drives the binaries from outside only and leaves the
// machine's own interfaces and rules alone.
package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/smg-project/smg/internal/netlab"
	"github.com/smg-project/smg/internal/testutil"
)

// smgBin is the binary every host runs (built once in TestMain).
var smgBin string

// short is the CI variant: shorter cuts and loads, the same assertions.
var short = os.Getenv("SHORT") == "1"

func TestMain(m *testing.M) {
	if os.Getenv("SMG_CHAOS") != "1" {
		fmt.Println("chaos: skipped (run `make chaos`, which sets SMG_CHAOS=1; it needs root)")
		os.Exit(0)
	}
	if err := netlab.Check(); err != nil {
		fmt.Fprintln(os.Stderr, "chaos: refusing to run:", err)
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "smg-chaos")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	smgBin = os.Getenv("SMG_BIN")
	if smgBin == "" {
		smgBin = filepath.Join(dir, "smg")
		build := exec.Command("go", "build", "-race", "-o", smgBin, "../cmd/smg")
		build.Stdout, build.Stderr = os.Stdout, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "chaos: build smg:", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// Ports every host uses on its own address.
const (
	enginePort = 8000
	cpHTTPPort = 30001
	cpGRPCPort = 30002
	agentPort  = 30003
	routerPort = 30000
	raftPort   = 30004
)

// proc is one smg process inside a host's namespace.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  *syncBuffer
	done chan struct{}
}

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer = testutil.SyncBuffer

// fleet is a lab with a control plane, routers, one agent, engines and a client host.
type fleet struct {
	t       *testing.T
	lab     *netlab.Lab
	cp      *netlab.Host   // the control plane (the first replica when replicated)
	cps     []*netlab.Host // every replica
	routers []*netlab.Host
	agent   *netlab.Host
	engines []*netlab.Host
	client  *netlab.Host
	http    *http.Client // dials from the client host
	procs   map[string]*proc
	mu      sync.Mutex
}

type fleetOptions struct {
	routers, engines int
	replicas         int      // control planes; more than 1 replicates the registry with Raft
	spare            int      // extra engines started but not registered (a scenario registers them)
	cpArgs           []string // extra control-plane flags
	routerArgs       []string // extra router flags
	agentPoll        string
}

// Timing every scenario shares: short enough for CI, long enough to tell the
// rules apart on a loaded 2-core machine.
var (
	staleSecs = "4" // --worker-stale-secs on control plane and routers
	stallSecs = "1" // --worker-stall-secs
)

func newFleet(t *testing.T, id string, o fleetOptions) *fleet {
	t.Helper()
	netlab.Sweep(id)
	lab, err := netlab.New(id)
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{t: t, lab: lab, procs: map[string]*proc{}}
	t.Cleanup(func() {
		f.stopAll()
		if err := lab.Close(); err != nil {
			t.Errorf("lab cleanup: %v", err)
		}
	})
	host := func(name string) *netlab.Host {
		h, err := lab.AddHost(name)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	if o.replicas < 1 {
		o.replicas = 1
	}
	for i := range o.replicas {
		name := "cp"
		if o.replicas > 1 {
			name = fmt.Sprintf("cp%d", i+1)
		}
		f.cps = append(f.cps, host(name))
	}
	f.cp = f.cps[0]
	for i := range o.routers {
		f.routers = append(f.routers, host(fmt.Sprintf("r%d", i+1)))
	}
	f.agent = host("agent")
	for i := range o.engines + o.spare {
		f.engines = append(f.engines, host(fmt.Sprintf("e%d", i+1)))
	}
	f.client = host("client")
	f.http = &http.Client{Transport: &http.Transport{DialContext: f.client.DialContext, MaxIdleConnsPerHost: 16}}

	var urls []string
	for i, e := range f.engines {
		f.start(fmt.Sprintf("e%d", i+1), e, "sim", "--host", e.IP, "--port", fmt.Sprint(enginePort), "--log-level", "warn")
		urls = append(urls, f.engineURL(i))
	}
	for i := range f.engines {
		f.waitHTTP(f.engineURL(i)+"/health", 10*time.Second)
	}
	cpArgs := []string{"controlplane", "--host", f.cp.IP, "--port", fmt.Sprint(cpHTTPPort), "--grpc-port", fmt.Sprint(cpGRPCPort),
		"--worker-stale-secs", staleSecs, "--worker-stall-secs", stallSecs, "--load-monitor-interval", "1",
		"--health-check-interval-secs", "1"}
	var peers []string
	for i, h := range f.cps {
		peers = append(peers, fmt.Sprintf("cp%d=%s", i+1, h.Addr(raftPort)))
	}
	for i, h := range f.cps {
		args := append([]string{}, cpArgs...)
		args[2] = h.IP // --host
		if len(f.cps) > 1 {
			args = append(args, "--data-dir", filepath.Join(f.t.TempDir(), "data"), "--node-id", fmt.Sprintf("cp%d", i+1),
				"--raft-addr", h.Addr(raftPort), "--raft-peers", strings.Join(peers, ","))
		}
		f.start(h.Name, h, append(args, o.cpArgs...)...)
	}
	for _, h := range f.cps {
		f.waitHTTP("http://"+h.Addr(cpHTTPPort)+"/health", 15*time.Second)
	}
	if len(f.cps) > 1 {
		f.leader(15 * time.Second)
	}
	// Registered on the agent's node: the agent feeds only its node's workers.
	for _, u := range urls[:o.engines] {
		f.register(u, "agent")
	}
	poll := o.agentPoll
	if poll == "" {
		poll = "100ms"
	}
	f.start("agent", f.agent, append([]string{"agent", "--host", f.agent.IP, "--port", fmt.Sprint(agentPort),
		"--controlplane", f.cpAddrs(), "--node", "agent", "--poll-interval", poll, "--engine-urls"}, urls...)...)
	for i, r := range f.routers {
		f.start(fmt.Sprintf("r%d", i+1), r, append([]string{"router", "--host", r.IP, "--port", fmt.Sprint(routerPort),
			"--controlplane", f.cpAddrs(), "--router-id", fmt.Sprintf("r%d", i+1),
			"--worker-stale-secs", staleSecs, "--load-monitor-interval", "1"}, o.routerArgs...)...)
	}
	for i := range f.routers {
		f.waitHTTP(f.routerURL(i)+"/readyz", 10*time.Second)
	}
	// Every worker Ready, with no veto and fed by the agent, before the scenario starts.
	f.eventually(15*time.Second, "every worker ready, unvetoed and fed by the agent", func() error {
		ws, err := f.workers()
		if err != nil {
			return err
		}
		if len(ws) != o.engines {
			return fmt.Errorf("%d workers, want %d", len(ws), o.engines)
		}
		for _, w := range ws {
			if !w.Ready || w.Verdict.Vetoed || w.Agent != "agent" {
				return fmt.Errorf("%s: ready %v, verdict %+v, agent %q", w.Spec.URL, w.Ready, w.Verdict, w.Agent)
			}
		}
		return nil
	})
	return f
}

// register submits a worker through the admin API and waits for its job.
func (f *fleet) register(url, node string) {
	f.t.Helper()
	// A 503 with Retry-After (no leader at this instant) is retried, as a client should.
	f.eventually(15*time.Second, "register "+url, func() error {
		a, err := f.post(f.cpURL()+"/workers", fmt.Sprintf(`{"url":%q,"node":%q}`, url, node))
		if err != nil {
			return err
		}
		if a.status != http.StatusAccepted {
			var views []string
			for _, h := range f.cps {
				v, _ := f.cluster(h)
				views = append(views, fmt.Sprintf("%+v", v))
			}
			return fmt.Errorf("%d %s (cluster: %s)", a.status, a.body, strings.Join(views, " "))
		}
		return nil
	})
}

// post sends a JSON body and returns the answer with its headers.
func (f *fleet) post(url, body string) (answer, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := f.http.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, body: b, header: resp.Header}, err
}

// cpAddrs is the --controlplane value naming every replica.
func (f *fleet) cpAddrs() string {
	var a []string
	for _, h := range f.cps {
		a = append(a, h.Addr(cpGRPCPort))
	}
	return strings.Join(a, ",")
}

// clusterView is GET /cluster of one replica.
type clusterView struct {
	Node    string `json:"node"`
	State   string `json:"state"`
	Serving bool   `json:"serving"`
	Term    uint64 `json:"term"`
	Leader  string `json:"leader"`
}

func (f *fleet) cluster(h *netlab.Host) (clusterView, error) {
	var v clusterView
	a, err := f.get("http://" + h.Addr(cpHTTPPort) + "/cluster")
	if err != nil {
		return v, err
	}
	return v, json.Unmarshal(a.body, &v)
}

// leader waits until every replica names the same serving leader and returns it.
func (f *fleet) leader(within time.Duration, except ...*netlab.Host) *netlab.Host {
	f.t.Helper()
	var found *netlab.Host
	f.eventually(within, "one leader every replica names", func() error {
		found = nil
		id := ""
		for _, h := range f.cps {
			if slices.Contains(except, h) {
				continue
			}
			v, err := f.cluster(h)
			if err != nil {
				return err
			}
			if v.Leader == "" || (id != "" && v.Leader != id) {
				return fmt.Errorf("%s names leader %q", h.Name, v.Leader)
			}
			id = v.Leader
			if v.State == "Leader" && v.Serving {
				found = h
			}
		}
		if found == nil || found.Name != id {
			return fmt.Errorf("leader %q not serving among the replicas asked", id)
		}
		return nil
	})
	return found
}

func (f *fleet) engineURL(i int) string { return "http://" + f.engines[i].Addr(enginePort) }
func (f *fleet) cpURL() string          { return "http://" + f.cp.Addr(cpHTTPPort) }
func (f *fleet) routerURL(i int) string { return "http://" + f.routers[i].Addr(routerPort) }

func (f *fleet) start(name string, h *netlab.Host, args ...string) *proc {
	f.t.Helper()
	p := &proc{name: name, log: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = h.Command(smgBin, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		f.t.Fatalf("start %s: %v", name, err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	f.mu.Lock()
	f.procs[name] = p
	f.mu.Unlock()
	return p
}

func (f *fleet) stopAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for name, p := range f.procs {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
		if strings.Contains(p.log.String(), "WARNING: DATA RACE") {
			f.t.Errorf("%s reported a data race:\n%s", name, tail(p.log.String(), 6000))
		} else if f.t.Failed() {
			f.t.Logf("%s log tail:\n%s", name, tail(p.log.String(), 2500))
		}
	}
}

var tail = testutil.Tail

func (f *fleet) waitHTTP(url string, within time.Duration) {
	f.t.Helper()
	f.eventually(within, url, func() error {
		resp, err := f.get(url)
		if err != nil {
			return err
		}
		if resp.status != http.StatusOK {
			return fmt.Errorf("status %d", resp.status)
		}
		return nil
	})
}

// eventually polls check every 50 ms until it passes or within runs out.
func (f *fleet) eventually(within time.Duration, what string, check func() error) {
	f.t.Helper()
	deadline := time.Now().Add(within)
	var err error
	for time.Now().Before(deadline) {
		if err = check(); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	f.t.Fatalf("%s: not within %v: %v", what, within, err)
}

type answer struct {
	status int
	body   []byte
	header http.Header
}

func (f *fleet) get(url string) (answer, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := f.http.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, b, resp.Header}, err
}

type worker struct {
	ID   string `json:"worker_id"`
	Spec struct {
		URL string `json:"url"`
	} `json:"spec"`
	Ready   bool   `json:"ready"`
	Health  string `json:"health"`
	Agent   string `json:"agent_node"`
	Verdict struct {
		Vetoed   bool   `json:"vetoed"`
		Veto     string `json:"veto"`
		Liveness string `json:"liveness"`
	} `json:"verdict"`
}

func (f *fleet) workers() ([]worker, error) {
	a, err := f.get(f.cpURL() + "/workers")
	if err != nil {
		return nil, err
	}
	var body struct {
		Workers []worker `json:"workers"`
	}
	if err := json.Unmarshal(a.body, &body); err != nil {
		return nil, fmt.Errorf("GET /workers: %v: %s", err, tail(string(a.body), 300))
	}
	return body.Workers, nil
}

// metric reads one sample (the sum over series whose labels contain every
// given name="value" pair) from a /metrics page.
func (f *fleet) metric(url, name string, labels ...string) (float64, error) {
	a, err := f.get(url + "/metrics")
	if err != nil {
		return 0, err
	}
	var sum float64
	found := false
	sc := bufio.NewScanner(bytes.NewReader(a.body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || (len(line) > len(name) && line[len(name)] != '{' && line[len(name)] != ' ') {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(line, l) {
				ok = false
			}
		}
		if !ok {
			continue
		}
		var v float64
		if _, err := fmt.Sscanf(line[strings.LastIndexByte(line, ' ')+1:], "%g", &v); err == nil {
			sum += v
			found = true
		}
	}
	if !found {
		return 0, fmt.Errorf("%s%v not on %s/metrics", name, labels, url)
	}
	return sum, nil
}

// load is steady traffic from `smg bench` on the client host to one router.
type load struct {
	start time.Time
	cmd   *exec.Cmd
	out   string
	done  chan struct{}
	log   *syncBuffer
}

func (f *fleet) startLoad(router int, rate float64, d time.Duration, extra ...string) *load {
	f.t.Helper()
	l := &load{out: filepath.Join(f.t.TempDir(), "bench.json"), done: make(chan struct{}), log: &syncBuffer{}}
	args := append([]string{"bench", "--url", f.routerURL(router), "--rate", fmt.Sprint(rate), "--duration", d.String(),
		"--prompt-tokens", "64-128", "--output-tokens", "8-16", "--timeout", "20s", "--out", l.out}, extra...)
	l.cmd = f.client.Command(smgBin, args...)
	l.cmd.Stdout, l.cmd.Stderr = l.log, l.log
	l.start = time.Now()
	if err := l.cmd.Start(); err != nil {
		f.t.Fatal(err)
	}
	go func() { _ = l.cmd.Wait(); close(l.done) }()
	return l
}

// record is one request of a bench run (bench.Record's JSON).
type record struct {
	Start     float64 `json:"start"`
	Status    int     `json:"status"`
	ErrorCode string  `json:"error_code"`
	Error     string  `json:"error"`
	Shed      bool    `json:"shed"`
	E2E       float64 `json:"e2e"`
	Completed bool    `json:"completed"`
}

// wait ends the load and returns its records, with Start as wall time.
func (l *load) wait(t *testing.T) []record {
	t.Helper()
	select {
	case <-l.done:
	case <-time.After(90 * time.Second):
		_ = l.cmd.Process.Kill()
		t.Fatalf("smg bench did not finish: %s", tail(l.log.String(), 2000))
	}
	b, err := os.ReadFile(l.out)
	if err != nil {
		t.Fatalf("bench result: %v\n%s", err, tail(l.log.String(), 2000))
	}
	var res struct {
		Records []record `json:"records"`
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	return res.Records
}

// failures counts the records that did not complete, by cause.
func failures(recs []record) map[string]int {
	out := map[string]int{}
	for _, r := range recs {
		if r.Completed {
			continue
		}
		cause := r.ErrorCode
		switch {
		case cause != "":
		case r.Status != 0:
			cause = fmt.Sprintf("http_%d", r.Status)
		case r.Error != "":
			cause = r.Error
			if len(cause) > 60 {
				cause = cause[:60]
			}
		default:
			cause = "incomplete"
		}
		out[cause]++
	}
	return out
}

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
