package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// haNode is one replica of a replicated control plane, on fixed ports and
// its own data dir, so it can be killed and started again as itself.
type haNode struct {
	id               string
	http, grpc, raft int
	dir              string
	args             []string
	proc             *proc
	admin            admin
	stopped          bool // SIGSTOPped
}

// haCluster is several replicas.
type haCluster struct {
	t     *testing.T
	nodes []*haNode
}

// haView is GET /cluster.
type haView struct {
	Node    string `json:"node"`
	State   string `json:"state"`
	Serving bool   `json:"serving"`
	Term    uint64 `json:"term"`
	Leader  string `json:"leader"`
	Members []struct {
		ID   string `json:"id"`
		GRPC string `json:"grpc"`
	} `json:"members"`
}

// startHACluster starts n replicas bootstrapped together.
func startHACluster(t *testing.T, n int, extra ...string) *haCluster {
	t.Helper()
	c := &haCluster{t: t}
	base := t.TempDir()
	var peers []string
	for i := range n {
		nd := &haNode{id: fmt.Sprintf("cp%d", i), http: freePort(t), grpc: freePort(t), raft: freePort(t)}
		nd.dir = filepath.Join(base, nd.id)
		nd.admin = admin{base: fmt.Sprintf("http://127.0.0.1:%d", nd.http)}
		peers = append(peers, fmt.Sprintf("%s=127.0.0.1:%d", nd.id, nd.raft))
		c.nodes = append(c.nodes, nd)
	}
	for _, nd := range c.nodes {
		nd.args = append([]string{"controlplane", "--port", strconv.Itoa(nd.http), "--grpc-port", strconv.Itoa(nd.grpc),
			"--data-dir", nd.dir, "--node-id", nd.id, "--raft-addr", fmt.Sprintf("127.0.0.1:%d", nd.raft), "--raft-peers"}, peers...)
		nd.args = append(nd.args, extra...)
		c.start(nd)
	}
	return c
}

// start runs a replica's process and waits for its HTTP port.
func (c *haCluster) start(nd *haNode) {
	c.t.Helper()
	nd.proc = startSMG(c.t, nd.id, nd.args...)
	nd.stopped = false
	waitHTTP200(c.t, nd.proc, nd.admin.base+"/health")
}

// grpcAddrs is the --controlplane value naming every replica.
func (c *haCluster) grpcAddrs() string {
	var a []string
	for _, nd := range c.nodes {
		a = append(a, fmt.Sprintf("127.0.0.1:%d", nd.grpc))
	}
	return strings.Join(a, ",")
}

func (nd *haNode) view() (haView, error) {
	var v haView
	code, b, err := nd.admin.do(http.MethodGet, "/cluster", nil)
	if err != nil {
		return v, err
	}
	if code != http.StatusOK {
		return v, fmt.Errorf("GET /cluster: %d %s", code, b)
	}
	return v, json.Unmarshal(b, &v)
}

// leader waits until one live replica leads and every other live replica
// names it; it returns that replica.
func (c *haCluster) leader(timeout time.Duration, except ...*haNode) *haNode {
	c.t.Helper()
	var found *haNode
	waitFor(c.t, timeout, "one leader all live replicas agree on", func() (bool, string) {
		found = nil
		leaderID := ""
		for _, nd := range c.nodes {
			if nd.proc.exitedEarly() || nd.stopped || contains2(except, nd) {
				continue
			}
			v, err := nd.view()
			if err != nil {
				return false, err.Error()
			}
			if v.Leader == "" || (leaderID != "" && v.Leader != leaderID) {
				return false, fmt.Sprintf("%s sees leader %q", nd.id, v.Leader)
			}
			leaderID = v.Leader
			if v.State == "Leader" && v.Serving {
				found = nd
			}
		}
		if found == nil || found.id != leaderID {
			return false, "leader " + leaderID + " not among the live replicas"
		}
		return true, ""
	})
	return found
}

func contains2(list []*haNode, nd *haNode) bool {
	for _, x := range list {
		if x == nd {
			return true
		}
	}
	return false
}

// fakeEngines is one HTTP server standing for many engines: every path
// prefix /eN is an engine that lists one model and is healthy. The registry
// tests need many distinct, reachable engine URLs, not inference.
func fakeEngines(t *testing.T) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/v1/models") {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"object":"list","data":[{"id":"sim-model","object":"model"}]}`))
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(s.Close)
	return s
}

// register posts a worker; it returns the worker id from a 202.
func register(a admin, url string) (int, string, error) {
	code, b, err := a.do(http.MethodPost, "/workers", []byte(`{"url":"`+url+`"}`))
	if err != nil {
		return 0, "", err
	}
	var r struct {
		WorkerID string `json:"worker_id"`
	}
	_ = json.Unmarshal(b, &r)
	if code != http.StatusAccepted {
		return code, "", fmt.Errorf("POST /workers %s: %d %s", url, code, b)
	}
	return code, r.WorkerID, nil
}

// jobStates reads GET /workers: worker id -> its job state.
func jobStates(a admin, local bool) (map[string]string, error) {
	req, err := http.NewRequest(http.MethodGet, a.base+"/workers", nil)
	if err != nil {
		return nil, err
	}
	if local {
		req.Header.Set("X-Smg-Read", "local")
	}
	resp, err := a.httpClient().Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var list struct {
		Workers []struct {
			WorkerID  string `json:"worker_id"`
			JobStatus *struct {
				State string `json:"state"`
			} `json:"job_status"`
		} `json:"workers"`
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /workers: %d", resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, w := range list.Workers {
		st := ""
		if w.JobStatus != nil {
			st = w.JobStatus.State
		}
		out[w.WorkerID] = st
	}
	return out, nil
}

// One node with --data-dir: 100 registrations survive kill -9, same ids.
func TestDataDirKeepsRegistrationsThroughKill9(t *testing.T) {
	eng := fakeEngines(t)
	c := startHACluster(t, 1)
	nd := c.nodes[0]
	c.leader(10 * time.Second)
	const n = 100
	ids := map[string]bool{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, id, err := register(nd.admin, fmt.Sprintf("%s/e%d", eng.URL, i))
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			ids[id] = true
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "every registration done", func() (bool, string) {
		st, err := jobStates(nd.admin, false)
		if err != nil {
			return false, err.Error()
		}
		done := 0
		for id := range ids {
			if st[id] == "done" {
				done++
			}
		}
		return done == n, fmt.Sprintf("%d of %d done", done, n)
	})
	nd.proc.kill() // SIGKILL: no chance to flush anything
	c.start(nd)
	c.leader(10 * time.Second)
	st, err := jobStates(nd.admin, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != n {
		t.Errorf("after kill -9 and restart: %d workers, want %d", len(st), n)
	}
	for id := range ids {
		if st[id] != "done" {
			t.Errorf("worker %s after restart: job %q, want it back with its registration done", id, st[id])
		}
	}
}

// Bad input: a data dir of another node, a peer list that disagrees with the
// stored configuration, and a corrupt log are refused at start with the
// reason, and the data dir is left as it was.
func TestDataDirBadInput(t *testing.T) {
	c := startHACluster(t, 1)
	nd := c.nodes[0]
	c.leader(10 * time.Second)
	nd.proc.kill()
	run := func(name string, args ...string) string {
		p := startSMG(t, name, args...)
		select {
		case <-p.exited:
		case <-time.After(20 * time.Second):
			t.Fatalf("%s did not exit", name)
		}
		return p.stderr.String()
	}
	other := []string{"controlplane", "--port", strconv.Itoa(freePort(t)), "--grpc-port", strconv.Itoa(freePort(t)),
		"--data-dir", nd.dir, "--raft-addr", fmt.Sprintf("127.0.0.1:%d", nd.raft)}
	if out := run("foreign", append(other, "--node-id", "intruder")...); !strings.Contains(out, `belongs to node "cp0"`) {
		t.Errorf("foreign data dir: want an error naming its owner, got:\n%s", tail(out, 1500))
	}
	peers := append(append([]string{}, other...), "--node-id", "cp0", "--raft-peers",
		fmt.Sprintf("cp0=127.0.0.1:%d", nd.raft), fmt.Sprintf("cp9=127.0.0.1:%d", freePort(t)))
	if out := run("peers", peers...); !strings.Contains(out, "--raft-peers disagrees with the configuration stored") {
		t.Errorf("peer list disagreeing with the stored one: want a clear error, got:\n%s", tail(out, 1500))
	}
	// The refusals changed nothing: the node starts as itself.
	c.start(nd)
	c.leader(10 * time.Second)
	nd.proc.kill()

	corrupt := t.TempDir()
	if err := os.WriteFile(filepath.Join(corrupt, "node.json"), []byte(`{"node_id":"cp0"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(corrupt, "raft.db"), []byte(strings.Repeat("not a bolt file ", 512)), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := []string{"controlplane", "--port", strconv.Itoa(freePort(t)), "--grpc-port", strconv.Itoa(freePort(t)),
		"--data-dir", corrupt, "--node-id", "cp0", "--raft-addr", fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	out := run("corrupt", bad...)
	if !strings.Contains(out, "cannot open raft.db") || strings.Contains(out, "panic") {
		t.Errorf("corrupt log: want a clear error and no panic, got:\n%s", tail(out, 1500))
	}
}

// A node joins a running cluster through any member (--join); a second node
// claiming a node id already in use at another address is refused and
// exits with the reason.
func TestJoinAndNodeIDInUse(t *testing.T) {
	c := startHACluster(t, 1)
	first := c.leader(15 * time.Second)
	joiner := &haNode{id: "cp1", http: freePort(t), grpc: freePort(t), raft: freePort(t), dir: filepath.Join(t.TempDir(), "cp1")}
	joiner.admin = admin{base: fmt.Sprintf("http://127.0.0.1:%d", joiner.http)}
	joiner.args = []string{"controlplane", "--port", strconv.Itoa(joiner.http), "--grpc-port", strconv.Itoa(joiner.grpc),
		"--data-dir", joiner.dir, "--node-id", joiner.id, "--raft-addr", fmt.Sprintf("127.0.0.1:%d", joiner.raft), "--join", first.admin.base}
	c.nodes = append(c.nodes, joiner)
	c.start(joiner)
	waitFor(t, 15*time.Second, "the joined node listed with its addresses", func() (bool, string) {
		v, err := joiner.view()
		if err != nil {
			return false, err.Error()
		}
		ids := 0
		for _, m := range v.Members {
			if m.GRPC != "" {
				ids++
			}
		}
		// Either member may lead by now (an election on a loaded box).
		return len(v.Members) == 2 && ids == 2 && v.Leader != "", fmt.Sprintf("%+v", v)
	})
	// Writes through the new member reach the leader.
	eng := fakeEngines(t)
	if _, _, err := register(joiner.admin, eng.URL+"/joined"); err != nil {
		t.Fatal(err)
	}

	imposter := startSMG(t, "imposter", "controlplane", "--port", strconv.Itoa(freePort(t)), "--grpc-port", strconv.Itoa(freePort(t)),
		"--data-dir", t.TempDir(), "--node-id", "cp1", "--raft-addr", fmt.Sprintf("127.0.0.1:%d", freePort(t)), "--join", first.admin.base)
	select {
	case <-imposter.exited:
	case <-time.After(20 * time.Second):
		t.Fatal("a node joining with an id in use kept running")
	}
	if out := imposter.stderr.String(); !strings.Contains(out, "node id cp1 is already a member") {
		t.Errorf("want the reason named, got:\n%s", tail(out, 1500))
	}
}

// The measured failure, repeated with --data-dir: workers registered
// through the admin API, routers under steady load, the control plane killed
// with SIGKILL and restarted 2 s later. The restarted control plane pushes
// the registered workers (presumed Ready), not an empty fleet: every request
// gets a full answer, none a 404 model_not_found or 503 no_available_workers.
func TestDataDirRestartUnderLoadNoClientErrors(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("restarts a control plane under load for several seconds")
	}
	sims := startSims(t, 2, "--itl-ms", "10")
	c := startHACluster(t, 1, "--load-monitor-interval", "1", "--health-success-threshold", "1")
	nd := c.nodes[0]
	c.leader(15 * time.Second)
	for _, u := range sims {
		if _, _, err := register(nd.admin, u); err != nil {
			t.Fatal(err)
		}
	}
	routers := map[string]string{}
	for i := range 2 {
		id := fmt.Sprintf("dd-router-%d", i)
		routers[id] = haRouter(t, id, fmt.Sprintf("127.0.0.1:%d", nd.grpc))
	}
	nd.admin.waitReady(t, sims...)
	waitConverged(t, nd.admin, routers)
	bases := []string{routers["dd-router-0"], routers["dd-router-1"]}

	var (
		mu      sync.Mutex
		results []outcome
	)
	stop := untilStopped(6, func(w, i int) {
		stream := (w+i)%2 == 1
		o := classify(chat(bases[(w+i)%2], 8, stream, 30*time.Second), stream)
		mu.Lock()
		results = append(results, o)
		mu.Unlock()
	})
	time.Sleep(2 * time.Second) // load before the kill (pacing)
	nd.proc.kill()
	time.Sleep(2 * time.Second) // the outage
	c.start(nd)
	c.leader(15 * time.Second)
	time.Sleep(3 * time.Second) // load after the restart, while the new leader rebuilds
	stop()

	codes := map[string]int{}
	full := 0
	for _, r := range results {
		switch {
		case r.full:
			full++
		case r.code != "":
			codes[r.code]++
		default:
			codes["lost: "+r.problem]++
		}
	}
	t.Logf("%d requests: %d full answers, errors %v", len(results), full, codes)
	if len(codes) > 0 {
		t.Errorf("requests failed across the restart: %v", codes)
	}
	// Same workers, same ids, after the restart; the routers follow the new epoch.
	st, err := jobStates(nd.admin, false)
	if err != nil || len(st) != 2 {
		t.Fatalf("after the restart: %v %v, want the 2 registered workers", st, err)
	}
	waitConverged(t, nd.admin, routers)
}
