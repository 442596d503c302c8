package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// controlPlane is a `smg controlplane` on fixed ports, so it can be killed and
// started again where its routers expect it.
type controlPlane struct {
	httpPort, grpcPort int
	args               []string
	proc               *proc
	admin              admin
}

func newControlPlane(t *testing.T, workerURLs []string, extra ...string) *controlPlane {
	t.Helper()
	cp := &controlPlane{httpPort: freePort(t), grpcPort: freePort(t)}
	cp.args = []string{"controlplane", "--port", strconv.Itoa(cp.httpPort), "--grpc-port", strconv.Itoa(cp.grpcPort)}
	if len(workerURLs) > 0 {
		cp.args = append(append(cp.args, "--worker-urls"), workerURLs...)
	}
	cp.args = append(cp.args, extra...)
	cp.admin = admin{base: fmt.Sprintf("http://127.0.0.1:%d", cp.httpPort)}
	cp.start(t)
	return cp
}

// start runs the control plane process and waits for its HTTP port.
func (cp *controlPlane) start(t *testing.T) {
	t.Helper()
	cp.proc = startSMG(t, "controlplane", cp.args...)
	waitHTTP200(t, cp.proc, cp.admin.base+"/health")
}

// startRouter runs `smg router` against the control plane's gRPC port and
// waits until it holds a snapshot (/readyz 200).
func startRouter(t *testing.T, id string, cpGRPC int, extra ...string) string {
	t.Helper()
	port := freePort(t)
	args := append([]string{"router", "--port", strconv.Itoa(port), "--controlplane", fmt.Sprintf("127.0.0.1:%d", cpGRPC),
		"--router-id", id}, extra...)
	p := startSMG(t, id, args...)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	waitHTTP200(t, p, base+"/readyz")
	return base
}

// routerLoads is the part of a router's GET /loads the tests read.
type routerLoads struct {
	Revision uint64 `json:"revision"`
	Epoch    string `json:"epoch"`
	FailOpen bool   `json:"fail_open"`
	Workers  []struct {
		URL     string `json:"url"`
		Healthy bool   `json:"healthy"`
		Veto    string `json:"veto"`
	} `json:"workers"`
}

func getRouterLoads(base string) (routerLoads, error) {
	var l routerLoads
	resp, err := client.Get(base + "/loads")
	if err != nil {
		return l, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return l, err
	}
	if resp.StatusCode != http.StatusOK {
		return l, fmt.Errorf("GET %s/loads: %d %s", base, resp.StatusCode, b)
	}
	return l, json.Unmarshal(b, &l)
}

// fleetView is a comparable summary of a fleet: "url veto" per worker, sorted.
func fleetView(entries map[string]string) string {
	var lines []string
	for u, v := range entries {
		lines = append(lines, u+" "+v)
	}
	slices.Sort(lines)
	return strings.Join(lines, ", ")
}

// waitConverged waits until the control plane lists exactly the given routers,
// each having applied (acked, and shown on its own GET /loads) at least the
// revision the control plane was at when the wait began, and every router's
// snapshot shows the control plane's Ready workers with its overload vetoes.
// "At least", not "at": the revision is never still for long (the load monitor
// commits every poll; load_revision moves even when an idle engine's figures
// do not), and with loads paced (the default --watch-load-interval) routers
// hold each poll's revision only from the next instant of the grid to the next
// poll, a few ms when the polls land just after the grid (docs/watch.md, Loads
// paced). A new epoch (a failover) restarts the count: the target follows it.
func waitConverged(t *testing.T, cp admin, routers map[string]string) {
	t.Helper()
	var target uint64
	waitFor(t, 20*time.Second, "routers to converge", func() (bool, string) {
		rev, rs, err := cp.routers()
		if err != nil {
			return false, err.Error()
		}
		if target == 0 || rev < target {
			target = rev
		}
		if len(rs) != len(routers) {
			return false, fmt.Sprintf("control plane lists %d routers, want %d: %+v", len(rs), len(routers), rs)
		}
		for _, r := range rs {
			if _, ok := routers[r.RouterID]; !ok || uint64(r.AppliedRevision) < target {
				return false, fmt.Sprintf("router %s applied %d, control plane at %d (want at least %d)", r.RouterID, r.AppliedRevision, rev, target)
			}
		}
		ws, err := cp.workers()
		if err != nil {
			return false, err.Error()
		}
		want := map[string]string{}
		for u, w := range ws {
			if w.Ready {
				want[u] = map[bool]string{true: "overload", false: ""}[w.Verdict.Overloaded]
			}
		}
		for id, base := range routers {
			l, err := getRouterLoads(base)
			if err != nil {
				return false, err.Error()
			}
			if l.Revision < target {
				return false, fmt.Sprintf("router %s snapshot at %d, want at least %d", id, l.Revision, target)
			}
			have := map[string]string{}
			for _, w := range l.Workers {
				if w.Healthy {
					have[w.URL] = w.Veto
				}
			}
			if fleetView(have) != fleetView(want) {
				return false, fmt.Sprintf("router %s sees [%s], control plane [%s]", id, fleetView(have), fleetView(want))
			}
		}
		return true, ""
	})
}

// Three routers on one control plane converge on the same revision after
// workers are registered, removed, and a verdict changes.
func TestThreeRoutersConverge(t *testing.T) {
	sims := startSims(t, 3, narrowEngine...)
	// Loads at once: paced, routers are a revision behind nearly all the
	// time when the polls land just after the grid (see waitConverged).
	cp := newControlPlane(t, sims[:2], "--load-monitor-interval", "1", "--health-success-threshold", "1",
		"--worker-overload-waiting-requests", "2", "--watch-load-interval", "0")
	routers := map[string]string{}
	for i := range 3 {
		id := fmt.Sprintf("e2e-router-%d", i+1)
		routers[id] = startRouter(t, id, cp.grpcPort, "--load-monitor-interval", "1")
	}
	cp.admin.waitReady(t, sims[:2]...)
	waitConverged(t, cp.admin, routers)

	// Register a worker.
	code, b, err := cp.admin.do(http.MethodPost, "/workers", []byte(fmt.Sprintf(`{"url":%q}`, sims[2])))
	if err != nil || code != http.StatusAccepted {
		t.Fatalf("POST /workers: %d %s %v", code, b, err)
	}
	ws := cp.admin.waitReady(t, sims...)
	waitConverged(t, cp.admin, routers)

	// Remove one.
	code, b, err = cp.admin.do(http.MethodDelete, "/workers/"+ws[sims[0]].WorkerID, nil)
	if err != nil || code >= 300 {
		t.Fatalf("DELETE /workers/%s: %d %s %v", ws[sims[0]].WorkerID, code, b, err)
	}
	waitFor(t, 20*time.Second, "the removed worker to leave GET /workers", func() (bool, string) {
		ws, err := cp.admin.workers()
		if err != nil {
			return false, err.Error()
		}
		_, still := ws[sims[0]]
		return !still, fmt.Sprintf("%d workers", len(ws))
	})
	waitConverged(t, cp.admin, routers)

	// A verdict change: overload one engine.
	loadEngine(t, sims[1], 4, 4, 20000)
	cp.admin.waitVerdicts(t, map[string]bool{sims[1]: true, sims[2]: false})
	waitConverged(t, cp.admin, routers)
	for id, base := range routers {
		l, err := getRouterLoads(base)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range l.Workers {
			if w.URL == sims[0] {
				t.Errorf("router %s still routes to the removed worker", id)
			}
			if w.URL == sims[1] && w.Veto != "overload" {
				t.Errorf("router %s: overloaded worker has veto %q", id, w.Veto)
			}
		}
	}
}
