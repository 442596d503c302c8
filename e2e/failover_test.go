package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	cpadmin "github.com/smg-project/smg/controlplane/admin"
)

// haRouter runs `smg router` against every replica and waits for /readyz.
func haRouter(t *testing.T, id, cpAddrs string, extra ...string) string {
	t.Helper()
	port := freePort(t)
	p := startSMG(t, id, append([]string{"router", "--port", strconv.Itoa(port), "--controlplane", cpAddrs, "--router-id", id,
		"--load-monitor-interval", "1"}, extra...)...)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	waitHTTP200(t, p, base+"/readyz")
	return base
}

// benchResult is the part of `smg bench --out` the tests read.
type benchResult struct {
	Records []struct {
		Start     float64 `json:"start"`
		Status    int     `json:"status"`
		ErrorCode string  `json:"error_code"`
		Error     string  `json:"error"`
		Completed bool    `json:"completed"`
	} `json:"records"`
}

func readBench(t *testing.T, path string) benchResult {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var r benchResult
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return r
}

// awaitExit waits for p to exit on its own.
func awaitExit(t *testing.T, p *proc, timeout time.Duration) {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(timeout):
		t.Fatalf("%s did not finish within %s", p.name, timeout)
	}
}

// The failover proof (docs/ha.md): 3 replicas, 3 routers, 1 agent, 4 simulated
// engines and steady load from `smg bench` through every router. The leader
// is killed with SIGKILL mid-run: a new leader serves within the bound, no
// request fails, and the new leader's verdicts are back within one agent
// report.
func TestHAFailoverUnderLoad(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs a 3-replica fleet under load for about 15 s")
	}
	simP := startSMG(t, "sim", "sim", "--count", "4", "--port", "0", "--itl-ms", "10", "--log-level", "warn")
	sims := simP.lines(4, 20*time.Second)
	c := startHACluster(t, 3, "--load-monitor-interval", "1", "--health-success-threshold", "1",
		"--worker-urls", sims[0], sims[1], sims[2])
	leader := c.leader(15 * time.Second)
	// Engine 3 has a token-usage ceiling it exceeds while held busy: a
	// standing overload veto that the new leader must rebuild.
	code, b, err := leader.admin.do(http.MethodPost, "/workers", []byte(`{"url":"`+sims[3]+`","overload":{"token_usage":0.01}}`))
	if err != nil || code != http.StatusAccepted {
		t.Fatalf("register %s: %d %s %v", sims[3], code, b, err)
	}
	const poll = 200 * time.Millisecond
	startSMG(t, "agent", append([]string{"agent", "--controlplane", c.grpcAddrs(), "--node", "ha-node",
		"--poll-interval", poll.String(), "--port", strconv.Itoa(freePort(t)), "--engine-urls"}, sims...)...)
	routers := map[string]string{}
	for i := range 3 {
		id := fmt.Sprintf("ha-router-%d", i)
		routers[id] = haRouter(t, id, c.grpcAddrs())
	}
	leader.admin.waitReady(t, sims...)
	release := loadEngine(t, sims[3], 2, 4000, 5000) // KV in use for the whole run
	defer release()
	leader.admin.waitVerdicts(t, map[string]bool{sims[0]: false, sims[3]: true})
	waitConverged(t, leader.admin, routers)

	dir := t.TempDir()
	var benches []*proc
	i := 0
	for _, base := range routers {
		out := filepath.Join(dir, fmt.Sprintf("bench-%d.json", i))
		i++
		benches = append(benches, startSMG(t, "bench", "bench", "--url", base, "--rate", "8", "--duration", "12s",
			"--prompt-tokens", "16-64", "--output-tokens", "8-24", "--timeout", "20s", "--seed", strconv.Itoa(i), "--out", out))
	}
	time.Sleep(4 * time.Second) // steady load before the kill (pacing, not an assertion)

	leader = c.leader(10 * time.Second) // leadership may have moved since (a loaded box)
	killed := time.Now()
	leader.proc.kill()
	next := c.leader(10*time.Second, leader)
	failover := time.Since(killed)
	serving := time.Now()
	// Verdicts are rebuilt from the agent's reports: engine 3 is vetoed
	// again, every engine has a load.
	waitFor(t, 10*time.Second, "the new leader's veto on the busy engine", func() (bool, string) {
		ws, err := next.admin.workers()
		if err != nil {
			return false, err.Error()
		}
		w := ws[sims[3]]
		return w.Verdict.Overloaded, fmt.Sprintf("%+v", w.Verdict)
	})
	vetoBack := time.Since(serving)
	t.Logf("leader %s killed: %s elected and serving after %s; veto back %s later (agent polls every %s)",
		leader.id, next.id, failover.Round(time.Millisecond), vetoBack.Round(time.Millisecond), poll)

	for _, p := range benches {
		awaitExit(t, p, 60*time.Second)
	}
	total, failed := 0, 0
	for j := range benches {
		r := readBench(t, filepath.Join(dir, fmt.Sprintf("bench-%d.json", j)))
		for _, rec := range r.Records {
			total++
			if !rec.Completed {
				failed++
				t.Errorf("request at %.2fs: status %d code %q error %q", rec.Start, rec.Status, rec.ErrorCode, rec.Error)
			}
		}
	}
	t.Logf("%d requests through 3 routers, %d without a full answer", total, failed)
	if total < 100 {
		t.Errorf("only %d requests: the load did not run", total)
	}
	if failover > 5*time.Second {
		t.Errorf("failover took %s; the target is 3 s", failover)
	}
	// One report of the agent, plus its reconnect (backoff capped at 1 s).
	if vetoBack > poll+3*time.Second {
		t.Errorf("veto back %s after the new leader served; want within one agent report of its reconnect", vetoBack)
	}

	// The killed replica comes back as a follower with every worker.
	c.start(leader)
	waitFor(t, 15*time.Second, "the restarted replica catching up", func() (bool, string) {
		st, err := jobStates(leader.admin, true)
		if err != nil {
			return false, err.Error()
		}
		return len(st) == 4, fmt.Sprintf("%d workers", len(st))
	})
}

var leaderLine = regexp.MustCompile(`msg="This control plane is the leader" node_id=(\S+) term=(\d+)`)

// leaderTerms reads which terms each replica led, from their logs.
func leaderTerms(c *haCluster, procs []*proc) map[uint64][]string {
	terms := map[uint64][]string{}
	for _, p := range procs {
		for _, m := range leaderLine.FindAllStringSubmatch(p.stderr.String(), -1) {
			term, _ := strconv.ParseUint(m[2], 10, 64)
			terms[term] = append(terms[term], m[1])
		}
	}
	return terms
}

// A leader paused for 10 s (SIGSTOP: a partition from the others' point of
// view) steps down when it resumes; a write queued on it meanwhile is never
// acknowledged by it in its old term, and nothing acknowledged is lost.
func TestHAPausedLeaderStepsDown(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("pauses a replica for 10 s")
	}
	eng := fakeEngines(t)
	c := startHACluster(t, 3)
	old := c.leader(15 * time.Second)
	acked := map[string]string{} // url -> id
	reg := func(a admin, url string) {
		if _, id, err := register(a, url); err == nil {
			acked[url] = id
		} else {
			t.Logf("register %s: %v", url, err)
		}
	}
	reg(old.admin, eng.URL+"/before")
	old = c.leader(10 * time.Second) // leadership may have moved since (a loaded box)
	oldView, err := old.view()
	if err != nil {
		t.Fatal(err)
	}

	lvSignal(t, old.proc, syscall.SIGSTOP)
	old.stopped = true
	paused := time.Now()
	next := c.leader(10*time.Second, old)
	t.Logf("leader %s paused: %s leads after %s", old.id, next.id, time.Since(paused).Round(time.Millisecond))
	reg(next.admin, eng.URL+"/during")
	// A write sent to the paused leader waits in its socket until it resumes.
	queued := make(chan error, 1)
	go func() {
		code, id, err := register(old.admin, eng.URL+"/queued")
		if err == nil {
			acked[eng.URL+"/queued"] = id
		}
		queued <- fmt.Errorf("%d %v", code, err)
	}()
	time.Sleep(time.Until(paused.Add(10 * time.Second))) // the leader stays paused 10 s
	lvSignal(t, old.proc, syscall.SIGCONT)
	old.stopped = false
	t.Logf("queued write on the resumed old leader: %v", <-queued)
	waitFor(t, 10*time.Second, "the resumed replica to follow", func() (bool, string) {
		v, err := old.view()
		if err != nil {
			return false, err.Error()
		}
		return v.State == "Follower" && v.Leader == next.id && v.Term > oldView.Term, fmt.Sprintf("%+v", v)
	})
	reg(old.admin, eng.URL+"/after") // through the follower, forwarded

	// No term had two leaders.
	var procs []*proc
	for _, nd := range c.nodes {
		procs = append(procs, nd.proc)
	}
	for term, ids := range leaderTerms(c, procs) {
		if len(ids) > 1 {
			t.Errorf("term %d was led by %v", term, ids)
		}
	}
	// Every acknowledged registration is done and on every replica.
	checkEverywhere(t, c, acked, nil)
}

// checkEverywhere waits for every replica to hold exactly present's ids (and
// none of absent's), each registration done.
func checkEverywhere(t *testing.T, c *haCluster, present map[string]string, absent map[string]bool) {
	t.Helper()
	for _, nd := range c.nodes {
		waitFor(t, 20*time.Second, nd.id+" holding every acknowledged worker", func() (bool, string) {
			st, err := jobStates(nd.admin, true)
			if err != nil {
				return false, err.Error()
			}
			var missing []string
			for url, id := range present {
				if st[id] != "done" {
					missing = append(missing, fmt.Sprintf("%s (%s: %q)", url, id, st[id]))
				}
			}
			var extra []string
			for id := range st {
				if absent[id] {
					extra = append(extra, id)
				}
			}
			sort.Strings(missing)
			return len(missing) == 0 && len(extra) == 0, fmt.Sprintf("missing %v, present but refused or deleted %v", missing, extra)
		})
	}
}

// regOutcome is what a client learned of one write.
type regOutcome int

const (
	outAcked   regOutcome = iota // 202: committed
	outRefused                   // a definite refusal: never made
	outUnknown                   // no answer, or an answer that says it may be stored
)

func classifyWrite(code int, body []byte, err error) regOutcome {
	switch {
	case err != nil && strings.Contains(err.Error(), "connection refused"):
		return outRefused // never reached a replica
	case err != nil:
		return outUnknown
	case code == http.StatusAccepted:
		return outAcked
	case code == http.StatusServiceUnavailable && strings.Contains(string(body), "OUTCOME_UNKNOWN"):
		return outUnknown
	case code >= 400 && code < 600:
		return outRefused
	}
	return outUnknown
}

// A register check in the style of Jepsen's: while the leader is killed and
// restarted again and again, clients register and delete workers through
// every replica. Afterwards every replica holds the same registry: every
// acknowledged registration that was not deleted is there (and done),
// nothing refused is there, and every acknowledged deletion holds.
func TestHARegistryThroughLeaderKills(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills and restarts leaders for about 20 s")
	}
	eng := fakeEngines(t)
	c := startHACluster(t, 3)
	c.leader(15 * time.Second)

	type op struct {
		url    string
		reg    regOutcome
		del    regOutcome // valid when deleted
		delete bool
	}
	var (
		mu  sync.Mutex
		ops []*op
	)
	stop := untilStopped(3, func(client, i int) {
		nd := c.nodes[(client+i)%len(c.nodes)]
		o := &op{url: fmt.Sprintf("%s/c%d-%d", eng.URL, client, i)}
		code, b, err := nd.admin.do(http.MethodPost, "/workers", []byte(`{"url":"`+o.url+`"}`))
		o.reg = classifyWrite(code, b, err)
		if o.reg == outAcked && i%3 == 0 {
			// Delete every third acknowledged worker, once its
			// registration is done, through another replica.
			id := workerIDOf(b)
			other := c.nodes[(client+i+1)%len(c.nodes)]
			for range 50 {
				if st, err := jobStates(other.admin, false); err == nil && st[id] == "done" {
					break
				}
				time.Sleep(50 * time.Millisecond) // polling the job, not an assertion
			}
			code, b, err := other.admin.do(http.MethodDelete, "/workers/"+id, nil)
			o.delete, o.del = true, classifyWrite(code, b, err)
		}
		mu.Lock()
		ops = append(ops, o)
		mu.Unlock()
		time.Sleep(20 * time.Millisecond) // pacing
	})
	const kills = 5
	for k := range kills {
		time.Sleep(1500 * time.Millisecond) // writes under this leader (pacing)
		l := c.leader(15 * time.Second)
		l.proc.kill()
		c.leader(15*time.Second, l)
		c.start(l) // back as a follower, from its data dir
		t.Logf("kill %d: %s killed and restarted", k+1, l.id)
	}
	time.Sleep(time.Second)
	stop()

	present := map[string]string{} // url -> id: must be on every replica, done
	absent := map[string]bool{}    // ids that must be on none
	var acked, refused, unknown, deleted int
	for _, o := range ops {
		id := workerIDFromURL(o.url)
		switch o.reg {
		case outAcked:
			acked++
		case outRefused:
			refused++
			absent[id] = true
			continue
		default:
			unknown++
			continue
		}
		switch {
		case !o.delete || o.del == outRefused:
			present[o.url] = id
		case o.del == outAcked:
			deleted++
			absent[id] = true
		}
	}
	t.Logf("%d registrations: %d acknowledged, %d refused, %d unknown; %d acknowledged deletions", len(ops), acked, refused, unknown, deleted)
	if acked < 20 {
		t.Errorf("only %d acknowledged registrations: the clients did not get through", acked)
	}
	checkEverywhere(t, c, present, absent)
	// And the replicas agree with each other exactly.
	var first map[string]string
	for _, nd := range c.nodes {
		st, err := jobStates(nd.admin, true)
		if err != nil {
			t.Fatal(err)
		}
		if first == nil {
			first = st
			continue
		}
		if len(st) != len(first) {
			t.Errorf("%s holds %d workers, %s %d", nd.id, len(st), c.nodes[0].id, len(first))
		}
	}
}

func workerIDOf(body []byte) string {
	var r struct {
		WorkerID string `json:"worker_id"`
	}
	_ = json.Unmarshal(body, &r)
	return r.WorkerID
}

// workerIDFromURL is the id the control plane derives from a worker URL.
func workerIDFromURL(url string) string { return cpadmin.WorkerID(url) }
