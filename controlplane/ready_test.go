package controlplane_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/smg-project/smg/internal/testutil"
)

// A one-node control plane with a data dir elects itself a moment after it
// starts: until then /readyz says not ready, and a write sent in that moment
// waits for the election instead of failing NO_LEADER. The wait is raised
// from its 2 s default: on a loaded box the election alone took longer.
func TestSingleNodeNotReadyUntilWritesAreTakenAndWritesWait(t *testing.T) {
	opts := fastOptions()
	opts.Cluster.DataDir = t.TempDir()
	opts.Cluster.RaftAddr = "127.0.0.1:0"
	opts.Cluster.LeaderWait = time.Minute
	h := startCP(t, opts)
	if r := h.do(t, http.MethodGet, "/readyz", ""); r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") != "1" {
		t.Fatalf("GET /readyz before the election = %d (Retry-After %q), want 503", r.status, r.header.Get("Retry-After"))
	}
	if r := h.do(t, http.MethodGet, "/health", ""); r.status != http.StatusOK {
		t.Fatalf("GET /health = %d: liveness holds while not ready", r.status)
	}
	engine := startSim(t, nil)
	if r := h.do(t, http.MethodPost, "/workers", fmt.Sprintf(`{"url":%q}`, engine.URL())); r.status != http.StatusAccepted {
		t.Fatalf("POST /workers right after the start = %d %s, want 202 (it waits for the election)", r.status, r.body)
	}
	if r := h.do(t, http.MethodGet, "/readyz", ""); r.status != http.StatusOK {
		t.Fatalf("GET /readyz once writes are taken = %d", r.status)
	}
}

// A replica that knows no leader (two of its three voters never came up)
// answers a read 503 NO_LEADER with Retry-After after a bounded wait, not
// 200 with whatever its copy holds; asked for its own copy it answers that,
// marked stale.
func TestFollowerWithoutLeaderRefusesReadsNotLocalOnes(t *testing.T) {
	p := []int{testutil.FreePort(t), testutil.FreePort(t), testutil.FreePort(t)}
	opts := fastOptions()
	opts.Cluster.DataDir = t.TempDir()
	opts.Cluster.NodeID = "cp0"
	opts.Cluster.RaftAddr = fmt.Sprintf("127.0.0.1:%d", p[0])
	for i, port := range p {
		opts.Cluster.Peers = append(opts.Cluster.Peers, fmt.Sprintf("cp%d=127.0.0.1:%d", i, port))
	}
	h := startCP(t, opts)
	start := time.Now()
	r := h.do(t, http.MethodGet, "/workers", "")
	if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" || r.errorCode(t) != "NO_LEADER" {
		t.Fatalf("GET /workers without a leader = %d %s (Retry-After %q), want 503 NO_LEADER", r.status, r.body, r.header.Get("Retry-After"))
	}
	if waited := time.Since(start); waited > 10*time.Second {
		t.Fatalf("the read waited %v for a leader; the wait is bounded", waited)
	}
	req, _ := http.NewRequest(http.MethodGet, h.http.URL+"/workers", nil)
	req.Header.Set("X-Smg-Read", "local")
	resp, err := h.http.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Smg-Stale") != "true" {
		t.Fatalf("GET /workers with X-Smg-Read: local = %d (X-Smg-Stale %q), want 200 marked stale", resp.StatusCode, resp.Header.Get("X-Smg-Stale"))
	}
	if r := h.do(t, http.MethodGet, "/readyz", ""); r.status != http.StatusServiceUnavailable {
		t.Fatalf("GET /readyz without a leader = %d, want 503", r.status)
	}
}
