package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Engines with a running window of one, so that a few long requests sent
// straight to an engine leave the rest waiting in its queue.
var narrowEngine = []string{"--max-running-requests", "1", "--itl-ms", "20"}

// An overloaded engine stops receiving new requests and comes back after a
// report under every threshold (spec: Excluding a Worker; no hysteresis).
func TestOverloadedEngineExcludedAndReadmitted(t *testing.T) {
	sims := startSims(t, 2, narrowEngine...)
	hot, cool := sims[0], sims[1]
	base, _ := startLaunch(t, "launch", sims, "--load-monitor-interval", "1",
		"--worker-overload-waiting-requests", "2", "--policy", "round_robin", "--health-success-threshold", "1")
	a := admin{base: base}
	a.waitReady(t, sims...)

	release := loadEngine(t, hot, 4, 4, 20000) // 1 running, 3 waiting >= 2, for minutes
	a.waitVerdicts(t, map[string]bool{hot: true, cool: false})
	ws, err := a.workers()
	if err != nil {
		t.Fatal(err)
	}
	if v := ws[hot].Verdict; !v.Vetoed || v.Liveness != "" {
		t.Fatalf("hot engine verdict %+v: want vetoed by overload alone", v)
	}
	a.waitRoutersApplied(t, 1)

	const n = 10
	hot0, cool0 := servedBy(t, hot), servedBy(t, cool)
	sendAll(t, base, n)
	if got := servedBy(t, hot) - hot0; got != 0 {
		t.Errorf("overloaded engine served %d of %d new requests, want 0", got, n)
	}
	if got := servedBy(t, cool) - cool0; got != n {
		t.Errorf("other engine served %d of %d new requests, want all", got, n)
	}

	release() // the engine aborts the held requests; its next report is under every threshold
	a.waitVerdicts(t, map[string]bool{hot: false, cool: false})
	a.waitRoutersApplied(t, 1)
	hot1 := servedBy(t, hot)
	sendAll(t, base, n)
	if got := servedBy(t, hot) - hot1; got == 0 {
		t.Errorf("re-admitted engine served none of %d round-robin requests", n)
	}
}

// sendAll sends n short chat completions to base one after the other,
// alternating plain and streamed, and requires each to be a whole answer.
func sendAll(t *testing.T, base string, n int) {
	t.Helper()
	for i := range n {
		stream := i%2 == 1
		a := chat(base, 2, stream, 20*time.Second)
		err := a.completeJSON()
		if stream {
			err = a.completeStream()
		}
		if err != nil {
			t.Fatalf("request %d (stream=%v): %v", i, stream, err)
		}
	}
}

// Every candidate overloaded: steered by default (counted in
// smg_worker_overload_fallback_total), shed with the spec's exact answer under
// --worker-overload-shed. The spec's per-worker curl line works against a
// launch started with --admin-api-key.
//
// The engines are overloaded by KV token usage, not by their queue, so that
// steered requests run at once instead of waiting behind the load.
func TestAllOverloadedSteerOrShed(t *testing.T) {
	sims := startSims(t, 3, "--kv-capacity-tokens", "16000", "--itl-ms", "20")
	pool, spare := sims[:2], sims[2]
	const token = "e2e-admin-token"
	steer, _ := startLaunch(t, "launch-steer", pool, "--load-monitor-interval", "1",
		"--worker-overload-token-usage", "0.3", "--health-success-threshold", "1", "--admin-api-key", token)
	// Retry-After must be this launch's interval, so it differs from the other's.
	shed, _ := startLaunch(t, "launch-shed", pool, "--load-monitor-interval", "2",
		"--worker-overload-token-usage", "0.3", "--health-success-threshold", "1", "--worker-overload-shed")
	as, ad := admin{base: steer, token: token}, admin{base: shed}
	as.waitReady(t, pool...)
	ad.waitReady(t, pool...)

	for _, u := range pool {
		loadEngine(t, u, 2, 4000, 3000) // KV usage about 0.5 for a minute
	}
	all := map[string]bool{pool[0]: true, pool[1]: true}
	as.waitVerdicts(t, all)
	ad.waitVerdicts(t, all)
	as.waitRoutersApplied(t, 1)
	ad.waitRoutersApplied(t, 1)

	t.Run("steered by default", func(t *testing.T) {
		before := fallbacks(t, steer)
		const n = 4
		sendAll(t, steer, n)
		if got := fallbacks(t, steer) - before; got != n {
			t.Errorf("smg_worker_overload_fallback_total rose by %v, want %d", got, n)
		}
	})

	t.Run("shed with --worker-overload-shed", func(t *testing.T) {
		status, headers, body := rawPost(t, strings.TrimPrefix(shed, "http://"), "/v1/chat/completions", chatBody(2, false))
		if status != "HTTP/1.1 503 Service Unavailable" {
			t.Errorf("status line %q, want HTTP/1.1 503 Service Unavailable", status)
		}
		for _, want := range []string{
			"Content-Type: application/json",
			"Retry-After: 2",
			"X-SMG-Error-Code: worker_overload_protection_shed",
		} {
			if !contains(headers, want) {
				t.Errorf("header line %q missing; got %q", want, headers)
			}
		}
		wantBody := `{"error":{"type":"server_error","code":"worker_overload_protection_shed","message":"All workers for model 'sim-model' are overloaded","param":null}}`
		if string(body) != wantBody {
			t.Errorf("body\n got %s\nwant %s", body, wantBody)
		}
		// A streamed request is refused the same way, before any event.
		a := chat(shed, 2, true, 10*time.Second)
		if a.status != http.StatusServiceUnavailable || string(a.body) != wantBody || a.header.Get("Retry-After") != "2" {
			t.Errorf("streamed request: %d %v %s, want the same shed", a.status, a.header, a.body)
		}
		m, err := scrape(shed + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		if got := metricSum(m, "smg_worker_overload_shed_total", "stage", "selection"); got != 2 {
			t.Errorf("smg_worker_overload_shed_total{stage=selection} = %v, want 2", got)
		}
		if got := metricSum(m, "smg_worker_overload_fallback_total"); got != 0 {
			t.Errorf("shedding launch steered %v requests, want 0", got)
		}
	})

	t.Run("per-worker block via the admin API", func(t *testing.T) {
		spec := fmt.Sprintf(`{"url": "%s", "overload": {"waiting_requests": 4, "token_usage": 0.7}}`, spare)
		if code, b, err := (admin{base: steer}).do(http.MethodPost, "/workers", []byte(spec)); err != nil || code != http.StatusUnauthorized {
			t.Errorf("POST /workers without the key: %d %s %v, want 401", code, b, err)
		}
		code, b, err := as.do(http.MethodPost, "/workers", []byte(spec))
		if err != nil || code != http.StatusAccepted {
			t.Fatalf("POST /workers: %d %s %v, want 202 Accepted", code, b, err)
		}
		w := as.waitReady(t, spare)[spare]
		if o := w.Spec.Overload; o == nil || o.WaitingRequests == nil || *o.WaitingRequests != 4 || o.TokenUsage == nil || *o.TokenUsage != 0.7 {
			t.Errorf("GET /workers spec.overload = %s, want waiting_requests 4, token_usage 0.7", jsonOf(o))
		}
		if w.Thresholds.WaitingRequests != 4 || w.Thresholds.TokenUsage != 0.7 {
			t.Errorf("resolved thresholds %+v, want the block's 4 and 0.7", w.Thresholds)
		}
		// The new worker is under its ceilings, so it takes requests without steering.
		as.waitVerdicts(t, map[string]bool{spare: false})
		as.waitRoutersApplied(t, 1)
		before, served := fallbacks(t, steer), servedBy(t, spare)
		sendAll(t, steer, 2)
		if got := fallbacks(t, steer) - before; got != 0 {
			t.Errorf("%v requests steered with a worker under its ceilings, want 0", got)
		}
		if got := servedBy(t, spare) - served; got != 2 {
			t.Errorf("the worker under its ceilings served %d of 2 requests", got)
		}
	})
}

func fallbacks(t *testing.T, base string) float64 {
	t.Helper()
	m, err := scrape(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	return metricSum(m, "smg_worker_overload_fallback_total", "stage", "selection")
}

// rawPost sends one HTTP/1.1 request on a fresh connection and returns the
// status line, the header lines as written on the wire, and the body.
func rawPost(t *testing.T, hostport, path string, body []byte) (status string, headers []string, respBody []byte) {
	t.Helper()
	c, err := net.DialTimeout("tcp", hostport, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		path, hostport, len(body), body)
	raw, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read answer: %v (%q)", err, raw)
	}
	head, respBody, ok := bytes.Cut(raw, []byte("\r\n\r\n"))
	if !ok {
		t.Fatalf("no header end in %q", raw)
	}
	lines := strings.Split(string(head), "\r\n")
	return lines[0], lines[1:], respBody
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
