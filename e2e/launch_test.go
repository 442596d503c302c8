package e2e

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// startLaunch runs `smg launch` in front of workerURLs on free ports and
// waits for /readyz; it returns the HTTP base URL and the gRPC port.
func startLaunch(t *testing.T, name string, workerURLs []string, extra ...string) (base string, grpcPort int) {
	t.Helper()
	port, grpcPort := freePort(t), freePort(t)
	args := []string{"launch", "--port", strconv.Itoa(port), "--grpc-port", strconv.Itoa(grpcPort)}
	if len(workerURLs) > 0 {
		args = append(append(args, "--worker-urls"), workerURLs...)
	}
	args = append(args, extra...)
	p := startSMG(t, name, args...)
	base = fmt.Sprintf("http://127.0.0.1:%d", port)
	waitHTTP200(t, p, base+"/readyz")
	return base, grpcPort
}

// waitHTTP200 waits until GET url answers 200, failing fast if p died.
func waitHTTP200(t *testing.T, p *proc, url string) {
	t.Helper()
	waitFor(t, 20*time.Second, "GET "+url+" to answer 200", func() (bool, string) {
		if p.exitedEarly() {
			t.Fatalf("%s exited: %s", p.name, tail(p.stderr.String(), 3000))
		}
		resp, err := client.Get(url)
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
}

// The README's `make run`: three simulated engines and `smg launch --port P
// --worker-urls u1 u2 u3` with every other flag at its default. It becomes
// ready, registers the three engines and serves chat completions, plain and
// streamed.
func TestLaunchLikeMakeRun(t *testing.T) {
	sims := startSims(t, 3)
	base, _ := startLaunch(t, "launch", sims)
	a := admin{base: base}
	ws := a.waitReady(t, sims...)
	for _, u := range sims {
		if ws[u].Model != model {
			t.Errorf("worker %s: model %q, want %q discovered from /v1/models", u, ws[u].Model, model)
		}
	}
	// Ready workers reach the router through the watch stream.
	a.waitRoutersApplied(t, 1)
	if err := chat(base, 16, false, 30*time.Second).completeJSON(); err != nil {
		t.Errorf("chat completion: %v", err)
	}
	if err := chat(base, 16, true, 30*time.Second).completeStream(); err != nil {
		t.Errorf("streamed chat completion: %v", err)
	}
	m, err := scrape(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	// The spec's metric families are exported on launch's port, the shed
	// counter pre-created at 0 so that alerts have a series to read.
	for _, name := range []string{"smg_worker_overload_fallback_total", "smg_worker_overload_shed_total"} {
		if !hasSeries(m, name) {
			t.Errorf("/metrics has no %s series", name)
		}
	}
}

func hasSeries(exposition, name string) bool {
	for _, line := range strings.Split(exposition, "\n") {
		if len(line) > len(name) && line[:len(name)] == name && (line[len(name)] == '{' || line[len(name)] == ' ') {
			return true
		}
	}
	return false
}
