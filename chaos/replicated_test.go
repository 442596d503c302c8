package chaos

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/smg-project/smg/internal/netlab"
)

// partition cuts h from every other replica (all ports, both ways); routers,
// agents and clients still reach it.
func (f *fleet) partition(t *testing.T, h *netlab.Host) func() {
	t.Helper()
	var faults []*netlab.Fault
	for _, o := range f.cps {
		if o == h {
			continue
		}
		fl, err := h.Cut(o, 0, netlab.Drop, netlab.Both)
		if err != nil {
			t.Fatal(err)
		}
		faults = append(faults, fl)
	}
	return func() {
		for _, fl := range faults {
			if err := fl.Heal(); err != nil {
				t.Error(err)
			}
		}
	}
}

// leaderWatch samples every replica's GET /cluster every 50 ms and records
// each term in which two replicas said they were the serving leader.
type leaderWatch struct {
	stop, done chan struct{}
	mu         sync.Mutex
	leaders    map[uint64]map[string]bool // term -> replicas serving as leader in it
	samples    int
}

func (f *fleet) watchLeaders() *leaderWatch {
	w := &leaderWatch{stop: make(chan struct{}), done: make(chan struct{}), leaders: map[uint64]map[string]bool{}}
	go func() {
		defer close(w.done)
		for {
			select {
			case <-w.stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			for _, h := range f.cps {
				v, err := f.cluster(h)
				if err != nil || v.State != "Leader" || !v.Serving {
					continue
				}
				w.mu.Lock()
				if w.leaders[v.Term] == nil {
					w.leaders[v.Term] = map[string]bool{}
				}
				w.leaders[v.Term][h.Name] = true
				w.samples++
				w.mu.Unlock()
			}
		}
	}()
	return w
}

// splitBrains lists the terms with more than one serving leader.
func (w *leaderWatch) finish() []string {
	close(w.stop)
	<-w.done
	var out []string
	for term, who := range w.leaders {
		if len(who) > 1 {
			out = append(out, fmt.Sprintf("term %d: %v", term, who))
		}
	}
	return out
}

// workerURLs is GET /workers of one replica, by URL.
func (f *fleet) workerURLs(h *netlab.Host) (map[string]bool, error) {
	a, err := f.get("http://" + h.Addr(cpHTTPPort) + "/workers")
	if err != nil {
		return nil, err
	}
	var body struct {
		Workers []worker `json:"workers"`
	}
	if err := json.Unmarshal(a.body, &body); err != nil {
		return nil, fmt.Errorf("%s GET /workers: %v: %s", h.Name, err, tail(string(a.body), 200))
	}
	out := map[string]bool{}
	for _, w := range body.Workers {
		out[w.Spec.URL] = true
	}
	return out, nil
}

// One replica (the leader) partitioned from the other two: the majority
// elects a leader, no two replicas serve as leader in one term, a write sent
// to the minority is refused with 503 and Retry-After, a write acknowledged
// by the majority is on every replica after the heal, and routers keep
// serving throughout.
func TestReplicaPartitionedFromItsPeers(t *testing.T) {
	f := newFleet(t, "rpart", fleetOptions{routers: 1, engines: 2, spare: 1, replicas: 3})
	old := f.leader(10 * time.Second)
	ld := f.startLoad(0, 8, cutFor()+10*time.Second)
	time.Sleep(2 * time.Second)
	lw := f.watchLeaders()

	heal := f.partition(t, old)
	cutAt := time.Now()
	others := []*netlab.Host{}
	for _, h := range f.cps {
		if h != old {
			others = append(others, h)
		}
	}
	// The majority elects a new leader.
	var newLeader *netlab.Host
	f.eventually(10*time.Second, "a new leader among the majority", func() error {
		for _, h := range others {
			v, err := f.cluster(h)
			if err == nil && v.State == "Leader" && v.Serving {
				newLeader = h
				return nil
			}
		}
		return fmt.Errorf("no serving leader among %s, %s yet", others[0].Name, others[1].Name)
	})
	elected := time.Since(cutAt)

	// The old leader steps down: a write sent to it is refused, not lost.
	var refused answer
	f.eventually(5*time.Second, "a write to the minority refused with 503 and Retry-After", func() error {
		a, err := f.post("http://"+old.Addr(cpHTTPPort)+"/workers", `{"url":"http://198.18.250.250:8000","node":"agent"}`)
		if err != nil {
			return err
		}
		refused = a
		if a.status != http.StatusServiceUnavailable || a.header.Get("Retry-After") == "" {
			return fmt.Errorf("minority answered %d (Retry-After %q): %s", a.status, a.header.Get("Retry-After"), tail(string(a.body), 200))
		}
		return nil
	})
	// A write to the majority is acknowledged and its job reaches done.
	acked := f.engineURL(2) // the spare engine
	a, err := f.post("http://"+newLeader.Addr(cpHTTPPort)+"/workers", fmt.Sprintf(`{"url":%q,"node":"agent"}`, acked))
	if err != nil || a.status != http.StatusAccepted {
		t.Fatalf("a write to the majority's leader: %d %s %v", a.status, a.body, err)
	}
	f.eventually(10*time.Second, "the majority's registration done", func() error {
		urls, err := f.workerURLs(newLeader)
		if err != nil || !urls[acked] {
			return fmt.Errorf("%s not on %s yet (%v)", acked, newLeader.Name, err)
		}
		return nil
	})
	time.Sleep(time.Until(cutAt.Add(cutFor())))
	heal()
	healAt := time.Now()

	// After the heal every replica has the acknowledged write and none has the refused one.
	var converged time.Duration
	f.eventually(15*time.Second, "every replica holds the acknowledged write", func() error {
		for _, h := range f.cps {
			urls, err := f.workerURLs(h)
			if err != nil {
				return err
			}
			if !urls[acked] {
				return fmt.Errorf("%s lacks %s", h.Name, acked)
			}
			if urls["http://198.18.250.250:8000"] {
				return fmt.Errorf("%s holds the write the minority refused", h.Name)
			}
		}
		converged = time.Since(healAt)
		return nil
	})
	recs := ld.wait(t)
	splits := lw.finish()
	fails := failures(recs)
	report(t, result{Scenario: fmt.Sprintf("leader %s partitioned from its 2 peers (drop, %s)", old.Name, secs(cutFor())),
		Exclusion: "new leader in " + secs(elected), Recovery: "all replicas agree " + secs(converged) + " after the heal",
		Requests: len(recs), Failed: fails,
		Note: fmt.Sprintf("minority write: %d, Retry-After %s; terms with two leaders: %d", refused.status, refused.header.Get("Retry-After"), len(splits))})
	if len(splits) > 0 {
		t.Errorf("split brain: %s", strings.Join(splits, "; "))
	}
	if n := total(fails); n > 0 {
		t.Errorf("%d requests failed: %v; %s", n, fails, failureTimes(ld, recs, cutAt, healAt))
	}
}

// failureTimes says when the failed requests started, relative to the cut
// and the heal: which moment of the failover they belong to.
func failureTimes(ld *load, recs []record, cutAt, healAt time.Time) string {
	var parts []string
	for _, r := range recs {
		if r.Completed {
			continue
		}
		at := ld.start.Add(time.Duration(r.Start * float64(time.Second)))
		parts = append(parts, fmt.Sprintf("cut%+.2fs/heal%+.2fs %s", at.Sub(cutAt).Seconds(), at.Sub(healAt).Seconds(), r.ErrorCode))
	}
	return strings.Join(parts, ", ")
}

// The leader cut off from the routers but not from its peers: it stays the
// leader; routers keep their snapshot, fail open only past the stale bound,
// and are back within 3 s of the link returning; no request fails.
func TestLeaderCutFromRouters(t *testing.T) {
	f := newFleet(t, "lrout", fleetOptions{routers: 1, engines: 2, replicas: 3})
	ldr := f.leader(10 * time.Second)
	cut := cutFor()
	ld := f.startLoad(0, 8, cut+8*time.Second)
	time.Sleep(2 * time.Second)
	failOpenAfter, healAt := f.cutRouterFrom(t, f.routers[0], ldr, cut)
	if still := f.leader(5 * time.Second); still != ldr {
		t.Errorf("the leader changed from %s to %s although it kept its peers", ldr.Name, still.Name)
	}
	back := f.routerSeenAfter(ldr, "r1", healAt, 10*time.Second)
	recs := ld.wait(t)
	fails := failures(recs)
	report(t, result{Scenario: "leader cut from the routers, not from its peers (drop, both ways, " + secs(cut) + ")",
		Exclusion: fmt.Sprintf("fail open after %s", secs(failOpenAfter)), Recovery: secs(back), Requests: len(recs), Failed: fails,
		Note: "followers name the leader; the router keeps its snapshot until the stale bound (4 s)"})
	// One hop more than the single control plane's 2 s: while cut, the router's
	// connection cycles through the followers, which name the leader it cannot
	// reach, so after the heal it may first have to come back from a follower.
	if back > 3*time.Second {
		t.Errorf("the router was back %v after the link returned, want within 3 s", back)
	}
	if n := total(fails); n > 0 {
		t.Errorf("%d requests failed: %v", n, fails)
	}
}
