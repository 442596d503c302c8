package chaos

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/smg-project/smg/internal/netlab"
)

// A row of the results table (docs/benchmarks.md "Network faults").
type result struct {
	Scenario  string         `json:"scenario"`
	Exclusion string         `json:"exclusion"` // time from the fault to what it must cause, or "-"
	Recovery  string         `json:"recovery"`  // time from healing to back to normal
	Requests  int            `json:"requests"`
	Failed    map[string]int `json:"failed"`
	Note      string         `json:"note"`
}

var (
	resultsMu sync.Mutex
	results   []result
)

// report logs the row and appends it to $CHAOS_OUT (JSON lines) when set.
func report(t *testing.T, r result) {
	t.Helper()
	t.Logf("| %s | %s | %s | %d | %s | %s |", r.Scenario, r.Exclusion, r.Recovery, r.Requests, causes(r.Failed), r.Note)
	resultsMu.Lock()
	results = append(results, r)
	resultsMu.Unlock()
	if path := os.Getenv("CHAOS_OUT"); path != "" {
		f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Error(err)
			return
		}
		defer f.Close()
		_ = json.NewEncoder(f).Encode(r)
	}
}

func causes(m map[string]int) string {
	if len(m) == 0 {
		return "0"
	}
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%d %s", v, k))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

func secs(d time.Duration) string { return fmt.Sprintf("%.2f s", d.Seconds()) }

// cutFor is how long a link stays cut: past the gRPC keepalive (5 s ping,
// 3 s timeout) so both ends notice, and past the stale bound (4 s here).
func cutFor() time.Duration {
	if short {
		return 10 * time.Second
	}
	return 15 * time.Second
}

// sampler records a worker's verdicts every 100 ms until stopped.
type sampler struct {
	stop   chan struct{}
	done   chan struct{}
	mu     sync.Mutex
	vetoed map[string]int // url -> samples with a veto
	seen   map[string]string
	n      int
}

func (f *fleet) sampleVerdicts() *sampler {
	s := &sampler{stop: make(chan struct{}), done: make(chan struct{}), vetoed: map[string]int{}, seen: map[string]string{}}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
			ws, err := f.workers()
			if err != nil {
				continue
			}
			s.mu.Lock()
			s.n++
			for _, w := range ws {
				if w.Verdict.Vetoed {
					s.vetoed[w.Spec.URL]++
					s.seen[w.Spec.URL] = w.Verdict.Veto
				}
			}
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *sampler) finish() (samples int, vetoed map[string]int, why map[string]string) {
	close(s.stop)
	<-s.done
	return s.n, s.vetoed, s.seen
}

// A router cut off from the control plane keeps its last snapshot, fails open
// after the stale bound, and is back within 2 s of the link returning, with
// no request failed by the cut.
func TestRouterCutFromControlPlane(t *testing.T) {
	f := newFleet(t, "rcp", fleetOptions{routers: 1, engines: 2})
	r := f.routers[0]
	cut := cutFor()
	ld := f.startLoad(0, 8, cut+8*time.Second)
	time.Sleep(2 * time.Second) // steady load before the fault

	failOpenAfter, healAt := f.cutRouterFrom(t, r, f.cp, cut)
	back := f.routerSeenAfter(f.cp, "r1", healAt, 10*time.Second)
	recs := ld.wait(t)
	fails := failures(recs)
	report(t, result{Scenario: "router cut from the control plane (drop, both ways, " + secs(cut) + ")",
		Exclusion: "fail open after " + secs(failOpenAfter), Recovery: secs(back), Requests: len(recs), Failed: fails,
		Note: "stale bound 4 s"})
	if failOpenAfter == 0 {
		t.Errorf("the router never failed open during a %v cut (stale bound %s s)", cut, staleSecs)
	}
	if back > 2*time.Second {
		t.Errorf("the router was back %v after the link returned, want within 2 s", back)
	}
	if n := total(fails); n > 0 {
		t.Errorf("%d requests failed during the cut: %v", n, fails)
	}
}

// cutRouterFrom drops every packet between router r and control plane cp
// for cut, and returns how long after the cut the router failed open (0:
// never) and when the link was healed.
func (f *fleet) cutRouterFrom(t *testing.T, r, cp *netlab.Host, cut time.Duration) (failOpenAfter time.Duration, healAt time.Time) {
	t.Helper()
	url := "http://" + r.Addr(routerPort)
	failOpen0, _ := f.metric(url, "smg_router_fail_open_total")
	fault, err := r.Cut(cp, 0, netlab.Drop, netlab.Both)
	if err != nil {
		t.Fatal(err)
	}
	cutAt := time.Now()
	for time.Since(cutAt) < cut {
		if failOpenAfter == 0 {
			if v, err := f.metric(url, "smg_router_fail_open_total"); err == nil && v > failOpen0 {
				failOpenAfter = time.Since(cutAt)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := fault.Heal(); err != nil {
		t.Fatal(err)
	}
	return failOpenAfter, time.Now()
}

// routerSeenAfter waits until control plane cp has heard from the router
// after t0 (a report on a live or new watch stream) and returns how long that took.
func (f *fleet) routerSeenAfter(cp *netlab.Host, id string, t0 time.Time, within time.Duration) time.Duration {
	f.t.Helper()
	var took time.Duration
	f.eventually(within, "router "+id+" back on the control plane", func() error {
		a, err := f.get("http://" + cp.Addr(cpHTTPPort) + "/routers")
		if err != nil {
			return err
		}
		var body struct {
			Routers []struct {
				ID       string    `json:"router_id"`
				LastSeen time.Time `json:"last_seen"`
				Lag      any       `json:"lag"`
			} `json:"routers"`
		}
		if err := json.Unmarshal(a.body, &body); err != nil {
			return err
		}
		for _, r := range body.Routers {
			if r.ID == id && r.LastSeen.After(t0) {
				took = time.Since(t0)
				return nil
			}
		}
		return fmt.Errorf("not seen since the heal: %s", tail(string(a.body), 300))
	})
	return took
}

// An agent cut off from the control plane: the control plane's own polls
// take over, and no veto flaps.
func TestAgentCutFromControlPlane(t *testing.T) {
	f := newFleet(t, "acp", fleetOptions{routers: 1, engines: 2})
	cut := cutFor()
	ld := f.startLoad(0, 8, cut+8*time.Second)
	time.Sleep(2 * time.Second)
	s := f.sampleVerdicts()
	fault, err := f.agent.Cut(f.cp, 0, netlab.Drop, netlab.Both)
	if err != nil {
		t.Fatal(err)
	}
	cutAt := time.Now()
	var takeover time.Duration
	for time.Since(cutAt) < cut {
		if takeover == 0 {
			if ws, err := f.workers(); err == nil && noAgent(ws) {
				takeover = time.Since(cutAt)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := fault.Heal(); err != nil {
		t.Fatal(err)
	}
	healAt := time.Now()
	var back time.Duration
	f.eventually(10*time.Second, "the agent feeding its engines again", func() error {
		ws, err := f.workers()
		if err != nil {
			return err
		}
		for _, w := range ws {
			if w.Agent == "" {
				return fmt.Errorf("%s not fed by the agent", w.Spec.URL)
			}
		}
		back = time.Since(healAt)
		return nil
	})
	recs := ld.wait(t)
	samples, vetoed, why := s.finish()
	fails := failures(recs)
	report(t, result{Scenario: "agent cut from the control plane (drop, both ways, " + secs(cut) + ")",
		Exclusion: "polls take over after " + secs(takeover), Recovery: secs(back), Requests: len(recs), Failed: fails,
		Note: fmt.Sprintf("vetoed samples %d of %d", sum(vetoed), samples)})
	if takeover == 0 {
		t.Errorf("the control plane's polls never took over during a %v cut", cut)
	}
	if len(vetoed) > 0 {
		t.Errorf("vetoes flapped while the agent was cut off: %v (%v)", vetoed, why)
	}
	if n := total(fails); n > 0 {
		t.Errorf("%d requests failed: %v", n, fails)
	}
}

func noAgent(ws []worker) bool {
	for _, w := range ws {
		if w.Agent != "" {
			return false
		}
	}
	return len(ws) > 0
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// An agent cut off from one engine (dropped, then rejected) while the routers
// still reach it: the worker stays routable (the routers' contact clears the
// unreachable rule), its overload veto fails open, nothing flaps.
func TestAgentCutFromOneEngine(t *testing.T) {
	f := newFleet(t, "aeng", fleetOptions{routers: 1, engines: 2})
	phase := cutFor() / 2
	ld := f.startLoad(0, 8, 2*phase+6*time.Second)
	time.Sleep(2 * time.Second)
	s := f.sampleVerdicts()
	e1 := f.engineURL(0)
	for _, action := range []netlab.Action{netlab.Drop, netlab.Reject} {
		fault, err := f.agent.Cut(f.engines[0], enginePort, action, netlab.Outbound)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(phase)
		if err := fault.Heal(); err != nil {
			t.Fatal(err)
		}
	}
	recs := ld.wait(t)
	samples, vetoed, why := s.finish()
	fails := failures(recs)
	report(t, result{Scenario: "agent cut from one engine (drop " + secs(phase) + ", then reject " + secs(phase) + ")",
		Exclusion: "-", Recovery: "-", Requests: len(recs), Failed: fails,
		Note: fmt.Sprintf("samples with %s vetoed: %d of %d", "e1", vetoed[e1], samples)})
	if vetoed[e1] > 0 {
		t.Errorf("e1 was vetoed in %d of %d samples (%v) although the routers reach it", vetoed[e1], samples, why)
	}
	if n := total(fails); n > 0 {
		t.Errorf("%d requests failed: %v", n, fails)
	}
}

// A router cut off from one engine: that worker is excluded within the
// unreachable bound and comes back on contact.
func TestRouterCutFromOneEngine(t *testing.T) {
	f := newFleet(t, "reng", fleetOptions{routers: 1, engines: 2,
		routerArgs: []string{"--cb-failure-threshold", "3", "--cb-timeout-duration-secs", "2"}})
	cut := cutFor() / 2
	ld := f.startLoad(0, 8, cut+8*time.Second)
	time.Sleep(2 * time.Second)
	open0, _ := f.metric(f.routerURL(0), "smg_router_circuit_breaker_transitions_total", `to="open"`)
	closed0, _ := f.metric(f.routerURL(0), "smg_router_circuit_breaker_transitions_total", `to="closed"`)
	fault, err := f.routers[0].Cut(f.engines[0], enginePort, netlab.Reject, netlab.Outbound)
	if err != nil {
		t.Fatal(err)
	}
	cutAt := time.Now()
	var excluded time.Duration
	for time.Since(cutAt) < cut {
		if excluded == 0 {
			if v, err := f.metric(f.routerURL(0), "smg_router_circuit_breaker_transitions_total", `to="open"`); err == nil && v > open0 {
				excluded = time.Since(cutAt)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := fault.Heal(); err != nil {
		t.Fatal(err)
	}
	healAt := time.Now()
	var back time.Duration
	f.eventually(15*time.Second, "e1's breaker closed again", func() error {
		v, err := f.metric(f.routerURL(0), "smg_router_circuit_breaker_transitions_total", `to="closed"`)
		if err != nil || v <= closed0 {
			return fmt.Errorf("closed transitions %v (%v)", v, err)
		}
		back = time.Since(healAt)
		return nil
	})
	recs := ld.wait(t)
	fails := failures(recs)
	report(t, result{Scenario: "router cut from one engine (reject, " + secs(cut) + ")",
		Exclusion: "breaker open after " + secs(excluded), Recovery: "closed " + secs(back) + " after heal", Requests: len(recs), Failed: fails,
		Note: "--cb-failure-threshold 3, --cb-timeout-duration-secs 2; retries move refused requests; failures are streams under way at the cut"})
	if excluded == 0 {
		t.Errorf("e1 was never excluded by the router during a %v cut", cut)
	}
	// A reset kills the streams already under way on e1 (no retry after the
	// first byte); every request that started after the cut must succeed.
	for _, r := range recs {
		startedAt := ld.start.Add(time.Duration(r.Start * float64(time.Second)))
		if !r.Completed && startedAt.After(cutAt) {
			t.Errorf("a request started %v after the cut failed: %+v", startedAt.Sub(cutAt), r)
		}
	}
}

// One-way loss between router and engine (replies dropped, requests
// delivered): requests end in an explicit error within the request timeout,
// never hang.
func TestOneWayLossRouterEngine(t *testing.T) {
	const timeout = 4 // --request-timeout-secs
	f := newFleet(t, "oneway", fleetOptions{routers: 1, engines: 2,
		routerArgs: []string{"--request-timeout-secs", fmt.Sprint(timeout)}})
	cut := cutFor() / 2
	ld := f.startLoad(0, 8, cut+4*time.Second)
	time.Sleep(2 * time.Second)
	fault, err := f.engines[0].Cut(f.routers[0], 0, netlab.Drop, netlab.Outbound)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(cut)
	if err := fault.Heal(); err != nil {
		t.Fatal(err)
	}
	recs := ld.wait(t)
	fails := failures(recs)
	var longest float64
	var hung, unexplained int
	for _, r := range recs {
		longest = max(longest, r.E2E)
		if r.E2E > timeout+2 {
			hung++
		}
		if !r.Completed && r.Status == 0 {
			unexplained++
		}
	}
	report(t, result{Scenario: "one-way loss router <- engine (replies dropped, " + secs(cut) + ")",
		Exclusion: "-", Recovery: "-", Requests: len(recs), Failed: fails,
		Note: fmt.Sprintf("longest request %.2f s (--request-timeout-secs %d)", longest, timeout)})
	if hung > 0 {
		t.Errorf("%d requests took longer than the request timeout (%d s) + 2 s", hung, timeout)
	}
	if unexplained > 0 {
		t.Errorf("%d requests ended without an HTTP answer (a hang or a cut connection): %v", unexplained, fails)
	}
}
