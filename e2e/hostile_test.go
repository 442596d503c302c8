package e2e

// Hostile clients, a compromised node and lying URLs (docs/security.md),
// replayed against the real binaries on loopback: each test is one threat.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// procStatus reads one "Name: value kB" field of /proc/<pid>/status, in bytes.
func procStatus(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

func openFDs(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// launchProc is startLaunch that also returns the process.
func launchProc(t *testing.T, name string, workerURLs []string, extra ...string) (*proc, string) {
	t.Helper()
	port, grpcPort := freePort(t), freePort(t)
	args := []string{"launch", "--port", strconv.Itoa(port), "--grpc-port", strconv.Itoa(grpcPort), "--log-level", "warn"}
	if len(workerURLs) > 0 {
		args = append(append(args, "--worker-urls"), workerURLs...)
	}
	p := startSMG(t, name, append(args, extra...)...)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	waitHTTP200(t, p, base+"/readyz")
	return p, base
}

// rawConn opens a TCP connection to base's host and writes s.
func rawConn(t *testing.T, base, s string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if s != "" {
		if _, err := io.WriteString(c, s); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

const claim512MiB = "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\nContent-Length: 536870912\r\n\r\n{\"model\":"

// Item 1: two connections that send only headers claiming the default
// --max-payload-size cost the router nothing (RSS bound), and are cut with
// 408 at --body-read-timeout-secs; so is a body trickled a byte at a time.
func TestHostileHeaderOnlyClaimsAndTrickledBodies(t *testing.T) {
	sims := startSims(t, 1)
	p, base := launchProc(t, "launch", sims, "--body-read-timeout-secs", "3")
	admin{base: base}.waitReady(t, sims...)
	pid := p.cmd.Process.Pid
	before := procStatus(t, pid, "VmRSS")

	start := time.Now()
	claims := []net.Conn{rawConn(t, base, claim512MiB), rawConn(t, base, claim512MiB)}
	trickle := rawConn(t, base, "POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Length: 100000\r\n\r\n")
	stop := make(chan struct{})
	defer close(stop)
	go func() { // one byte every 500 ms: progress, but never a whole body
		for {
			select {
			case <-stop:
				return
			case <-time.After(500 * time.Millisecond):
				if _, err := trickle.Write([]byte{' '}); err != nil {
					return
				}
			}
		}
	}()
	// While the claims are open, sample the router's RSS.
	var peak int64
	for time.Since(start) < 2500*time.Millisecond {
		peak = max(peak, procStatus(t, pid, "VmRSS"))
		time.Sleep(50 * time.Millisecond) // sampling interval, not an assertion
	}
	t.Logf("router RSS %.1f MiB before, peak %.1f MiB with two header-only 512 MiB claims open (before the fix: 1.08 GB)",
		float64(before)/(1<<20), float64(peak)/(1<<20))
	if peak-before > 64<<20 {
		t.Fatalf("two header-only claims grew the router's RSS by %.1f MiB (bound 64 MiB)", float64(peak-before)/(1<<20))
	}
	for i, c := range append(claims, trickle) {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("connection %d: no answer: %v", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusRequestTimeout || resp.Header.Get("X-SMG-Error-Code") != "request_body_timeout" {
			t.Fatalf("connection %d: %d %s, want 408 request_body_timeout", i, resp.StatusCode, body)
		}
	}
	if took := time.Since(start); took < 3*time.Second || took > 8*time.Second {
		t.Fatalf("bodies cut after %s, want about the 3 s --body-read-timeout-secs", took)
	}
	exp, err := scrape(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if n := metricSum(exp, "smg_router_refused_total", "reason", "body_timeout"); n != 3 {
		t.Fatalf("smg_router_refused_total{reason=body_timeout} = %v, want 3", n)
	}
	// The router still serves.
	if err := chat(base, 4, false, 20*time.Second).completeJSON(); err != nil {
		t.Fatalf("after the hostile bodies: %v", err)
	}
}

// Item 7: idle keep-alive connections are closed after --idle-timeout-secs
// and no more than --max-connections are held at once.
func TestHostileIdleConnectionsAreBounded(t *testing.T) {
	sims := startSims(t, 1)
	p, base := launchProc(t, "launch", sims, "--max-connections", "64", "--idle-timeout-secs", "2")
	admin{base: base}.waitReady(t, sims...)
	pid := p.cmd.Process.Pid
	before := openFDs(t, pid)
	const clients, keepAlive = 200, 32
	conns := make([]net.Conn, clients)
	readers := make([]*bufio.Reader, clients)
	for i := range conns {
		conns[i] = rawConn(t, base, "")
		readers[i] = bufio.NewReader(conns[i])
	}
	// The first ones make one keep-alive request, then go quiet; the rest
	// never send a byte.
	for i := range keepAlive {
		if _, err := io.WriteString(conns[i], "GET /health HTTP/1.1\r\nHost: r\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(readers[i], nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	// Every connection ends: the first 64 by the idle timeout, the rest as
	// slots free. Meanwhile the router never holds more than the cap.
	var wg sync.WaitGroup
	closed := make([]time.Duration, clients)
	start := time.Now()
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
			_, err := readers[i].ReadByte()
			if err == io.EOF {
				closed[i] = time.Since(start)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	peak := 0
	for waiting := true; waiting; {
		select {
		case <-done:
			waiting = false
		case <-time.After(50 * time.Millisecond): // sampling interval
			peak = max(peak, openFDs(t, pid))
		}
	}
	t.Logf("router file handles: %d before, peak %d with %d idle clients (--max-connections 64, --idle-timeout-secs 2); all closed within %s",
		before, peak, clients, time.Since(start).Round(time.Millisecond))
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("closing %d idle clients 64 at a time took %s, want about 4 rounds of the 2 s idle timeout", clients, took)
	}
	if peak > before+64+16 {
		t.Fatalf("the router held %d file handles (%d before): more than --max-connections 64 allows", peak, before)
	}
	for i, d := range closed {
		if d == 0 {
			t.Fatalf("idle connection %d was never closed by the router", i)
		}
	}
}

// A client holding 5,000 keep-alive connections from one address, more than
// --max-connections (4096), does not lock other clients out: its new
// connections take the place of its own oldest idle ones
// (--max-connections-per-client), or of anyone's oldest idle ones at the
// global cap, so a fresh client from another address is answered at once
// rather than after the idle timeout (60 s).
func TestHostileIdleFloodFromOneClient(t *testing.T) {
	sims := startSims(t, 1)
	for _, c := range []struct {
		name  string
		extra []string
	}{
		{"per_client_cap", nil},
		{"global_cap_only", []string{"--max-connections-per-client", "0"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, base := launchProc(t, "launch", sims, c.extra...)
			pid := p.cmd.Process.Pid
			rssBefore := procStatus(t, pid, "VmRSS")
			answered, closed := idleFlood(t, base, "127.0.0.2", 5000)
			start := time.Now()
			code, err := getFrom(base, "127.0.0.3", "/health", 70*time.Second)
			took := time.Since(start)
			t.Logf("%s: 5,000 keep-alive connections from 127.0.0.2 (%d answered, %d closed unanswered); "+
				"a fresh client from 127.0.0.3 answered %d in %s (%v); router %d open file handles, RSS %d MiB -> %d MiB",
				c.name, answered, closed, code, took.Round(time.Millisecond), err, openFDs(t, pid), rssBefore>>20, procStatus(t, pid, "VmRSS")>>20)
			if err != nil || code != http.StatusOK || took > time.Second {
				t.Fatalf("a fresh client beside 5,000 keep-alive connections of another: %d %v after %s, want 200 within 1 s", code, err, took)
			}
		})
	}
}

// idleFlood opens n connections to base from the local address from, each
// making one keep-alive request and then staying open, and returns once the
// router has answered or closed as many as it will hold (4096 by default).
func idleFlood(t *testing.T, base, from string, n int) (answered, closed int64) {
	t.Helper()
	addr := strings.TrimPrefix(base, "http://")
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 10 * time.Second}
	var ans, cls atomic.Int64
	conns := make(chan net.Conn, n)
	t.Cleanup(func() {
		close(conns)
		for c := range conns {
			c.Close()
		}
	})
	sem := make(chan struct{}, 64) // dials at once
	for range n {
		sem <- struct{}{}
		c, err := d.Dial("tcp", addr)
		<-sem
		if err != nil {
			t.Fatalf("dial from %s: %v", from, err)
		}
		conns <- c
		go func() {
			_, _ = io.WriteString(c, "GET /health HTTP/1.1\r\nHost: r\r\n\r\n")
			_ = c.SetReadDeadline(time.Now().Add(90 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				cls.Add(1)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			ans.Add(1)
		}()
	}
	waitFor(t, 60*time.Second, "the router to answer or close 4096 of the flood", func() (bool, string) {
		a, c := ans.Load(), cls.Load()
		return a+c >= 4096, fmt.Sprintf("%d answered, %d closed", a, c)
	})
	return ans.Load(), cls.Load()
}

// getFrom sends GET path to base from the local address from on a new
// connection and returns the status.
func getFrom(base, from, path string, timeout time.Duration) (int, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c := &http.Client{Timeout: timeout, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
	resp, err := c.Get(base + path)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// Item 2: a worker URL that is an smg router or control plane is refused
// with 400, also when it comes from --worker-urls (the registration fails),
// and a request that already passed a router gets 508 loop_detected.
func TestHostileRoutingLoops(t *testing.T) {
	sims := startSims(t, 1)
	_, base := launchProc(t, "launch", sims)
	a := admin{base: base}
	a.waitReady(t, sims...)
	other := newControlPlane(t, nil)
	for name, url := range map[string]string{"router": base, "controlplane": other.admin.base} {
		code, body, err := a.do(http.MethodPost, "/workers", fmt.Appendf(nil, `{"url":%q}`, url))
		if err != nil || code != http.StatusBadRequest || !bytes.Contains(body, []byte("answers as an smg "+name)) ||
			!bytes.Contains(body, []byte(`"param":"url"`)) {
			t.Fatalf("registering the %s %s: %d %s %v, want 400 naming url", name, url, code, body, err)
		}
	}
	// A static worker that is a router: its registration fails, never loops.
	_, base2 := launchProc(t, "launch2", []string{base})
	waitFor(t, 20*time.Second, "the static registration of a router to fail", func() (bool, string) {
		_, b, err := admin{base: base2}.do(http.MethodGet, "/jobs", nil)
		return err == nil && bytes.Contains(b, []byte(`"failed"`)) && bytes.Contains(b, []byte("answers as an smg router")), string(b)
	})
	// The hop header: a request that passed a router is refused.
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(chatBody(4, false)))
	req.Header.Set("X-SMG-Hop", "1")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusLoopDetected || resp.Header.Get("X-SMG-Error-Code") != "loop_detected" ||
		!bytes.Contains(body, []byte(`"code":"loop_detected"`)) {
		t.Fatalf("a looped request: %d %s", resp.StatusCode, body)
	}
}

// Items 5 and 8 through the admin API, and the behaviour that held:
// concurrent duplicate registrations, malformed and deeply nested JSON.
func TestHostileAdminInput(t *testing.T) {
	sims := startSims(t, 2)
	p, base := launchProc(t, "launch", sims[:1], "--admin-api-key", "admin-key-0123456789")
	a := admin{base: base, token: "admin-key-0123456789"}
	a.waitReady(t, sims[0])
	upper := strings.Replace(sims[0], "http://", "HTTP://", 1) + "/"
	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		param                    string
	}{
		{"password in the URL", "POST", "/workers", `{"url":"http://ops:hunter2@127.0.0.1:9"}`, 400, "url"},
		{"alias: case and trailing slash", "POST", "/workers", fmt.Sprintf(`{"url":%q}`, upper), 409, "url"},
		{"cloud metadata", "POST", "/workers", `{"url":"http://169.254.169.254/latest"}`, 400, "url"},
		{"port 99999", "POST", "/workers", `{"url":"http://127.0.0.1:99999"}`, 400, "url"},
		{"one worker stops its model's polls", "POST", "/workers", `{"url":"http://127.0.0.1:9","load_monitor_interval_secs":2147483647}`, 400, "load_monitor_interval_secs"},
		{"infinite cost", "POST", "/workers", `{"url":"http://127.0.0.1:9","cost":"Infinity"}`, 400, "cost"},
		{"null body", "POST", "/workers", `null`, 400, ""},
		{"wrong method", "DELETE", "/workers", ``, 405, ""},
	} {
		code, body, err := a.do(tc.method, tc.path, []byte(tc.body))
		if err != nil || code != tc.status || (tc.param != "" && !bytes.Contains(body, []byte(`"param":"`+tc.param+`"`))) {
			t.Errorf("%s: %d %s %v, want %d naming %q", tc.name, code, body, err, tc.status, tc.param)
		}
		if bytes.Contains(body, []byte("hunter2")) {
			t.Errorf("%s: the answer echoes the password: %s", tc.name, body)
		}
	}
	// Auth before parsing: no key and a broken body is 401, not 422.
	if code, body, _ := (admin{base: base}).do("POST", "/workers", []byte(`{"url":`)); code != http.StatusUnauthorized {
		t.Errorf("unauthenticated broken body: %d %s, want 401", code, body)
	}
	// Concurrent duplicate registrations: exactly one is accepted.
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	spec := fmt.Appendf(nil, `{"url":%q,"api_key":"engine-sekrit-42"}`, sims[1])
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, _, _ := a.do("POST", "/workers", spec)
			mu.Lock()
			codes[code]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if codes[http.StatusAccepted] != 1 || codes[http.StatusConflict] != 15 {
		t.Fatalf("16 concurrent registrations of one URL: %v, want one 202 and 15 409", codes)
	}
	a.waitReady(t, sims[1])
	// No secret is shown anywhere a user looks.
	loads, _ := scrape(base + "/loads")
	metrics, _ := scrape(base + "/metrics")
	_, workers, _ := a.do("GET", "/workers", nil)
	for where, text := range map[string]string{"/loads": loads, "/metrics": metrics, "/workers": string(workers), "the log": p.stderr.String()} {
		if strings.Contains(text, "engine-sekrit-42") || strings.Contains(text, "hunter2") {
			t.Errorf("%s shows a secret", where)
		}
	}
	// The router: null, deeply nested JSON and a wrong method.
	nested := `{"model":"sim-model","messages":` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + `}`
	for name, tc := range map[string]struct {
		method, body string
		status       int
	}{
		"null":          {"POST", "null", 400},
		"deeply nested": {"POST", nested, 400},
		"wrong method":  {"GET", "", 405},
	} {
		req, _ := http.NewRequest(tc.method, base+"/v1/chat/completions", strings.NewReader(tc.body))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || !bytes.Contains(body, []byte(`"error"`)) {
			t.Errorf("router, %s body: %d %s, want %d with the JSON error body", name, resp.StatusCode, body, tc.status)
		}
		if tc.status == 405 && resp.Header.Get("Allow") != "POST" {
			t.Errorf("405 without Allow: POST")
		}
	}
	if err := chat(base, 4, false, 20*time.Second).completeJSON(); err != nil {
		t.Fatalf("after the hostile input: %v", err)
	}
}

const (
	tokenN1 = "token-node-one-0123456789"
	tokenN2 = "token-node-two-0123456789"
)

func tokenFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "agents")
	if err := os.WriteFile(path, []byte("# token node [addresses]\n"+tokenN1+" n1\n"+tokenN2+" n2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

type nodeView struct {
	URL       string
	AgentNode string
	Labels    map[string]string
}

func nodeViews(a admin) (map[string]nodeView, error) {
	code, b, err := a.do("GET", "/workers", nil)
	if err != nil || code != 200 {
		return nil, fmt.Errorf("GET /workers: %d %v", code, err)
	}
	var list struct {
		Workers []struct {
			Spec struct {
				URL    string            `json:"url"`
				Labels map[string]string `json:"labels"`
			} `json:"spec"`
			AgentNode string `json:"agent_node"`
		} `json:"workers"`
	}
	if err := json.Unmarshal(b, &list); err != nil {
		return nil, err
	}
	out := map[string]nodeView{}
	for _, w := range list.Workers {
		out[w.Spec.URL] = nodeView{URL: w.Spec.URL, AgentNode: w.AgentNode, Labels: w.Spec.Labels}
	}
	return out, nil
}

// Item 3: an agent's token names its node. An agent with n2's token feeds
// n2's worker but not n1's, even when it polls n1's engine; n1's token cannot
// speak for n2.
func TestHostileAgentIsScopedToItsNode(t *testing.T) {
	sims := startSims(t, 2)
	cp := newControlPlane(t, nil, "--agent-token-file", tokenFile(t))
	for i, node := range []string{"n1", "n2"} {
		if code, body, err := cp.admin.do("POST", "/workers", fmt.Appendf(nil, `{"url":%q,"node":%q}`, sims[i], node)); err != nil || code != 202 {
			t.Fatalf("register %s: %d %s %v", sims[i], code, body, err)
		}
	}
	cp.admin.waitReady(t, sims...)
	cpAddr := fmt.Sprintf("127.0.0.1:%d", cp.grpcPort)
	startSMG(t, "agent-n2", "agent", "--port", "0", "--controlplane", cpAddr, "--node", "n2", "--token", tokenN2,
		"--poll-interval", "100ms", "--engine-urls", sims[0]) // n1's engine, named by n2's agent
	waitFor(t, 15*time.Second, "n2's agent to feed n2's worker", func() (bool, string) {
		ws, err := nodeViews(cp.admin)
		if err != nil {
			return false, err.Error()
		}
		return ws[sims[1]].AgentNode == "n2", fmt.Sprint(ws)
	})
	waitFor(t, 10*time.Second, "the control plane to refuse n1's worker from n2's agent", func() (bool, string) {
		return strings.Contains(cp.proc.stderr.String(), "not on the agent's node"), "no refusal logged yet"
	})
	ws, _ := nodeViews(cp.admin)
	if ws[sims[0]].AgentNode != "" {
		t.Fatalf("n1's worker is fed by agent %q", ws[sims[0]].AgentNode)
	}
	// n1's token naming n2: refused, and the agent exits with the reason.
	imposter := startSMG(t, "agent-imposter", "agent", "--port", "0", "--controlplane", cpAddr, "--node", "n2", "--token", tokenN1,
		"--engine-urls", sims[1])
	select {
	case <-imposter.exited:
	case <-time.After(15 * time.Second):
		t.Fatal("an agent whose token is for another node kept running")
	}
	if log := imposter.stderr.String(); !strings.Contains(log, `for node \"n1\", not \"n2\"`) && !strings.Contains(log, `for node "n1", not "n2"`) {
		t.Fatalf("the imposter's log does not say why: %s", tail(log, 2000))
	}
}

// Registration: an agent registers only an engine whose model the admin
// allowed agents to serve and whose model it can read, and the worker goes
// once the agent is gone past the stale bound.
func TestHostileAgentRegistration(t *testing.T) {
	allowed := startSims(t, 1)
	other := startSims(t, 1, "--model", "not-allowed")
	cp := newControlPlane(t, nil, "--agent-token-file", tokenFile(t), "--agent-models", "sim-model",
		"--worker-stale-secs", "3", "--load-monitor-interval", "1")
	agent := startSMG(t, "agent-n1", "agent", "--port", "0", "--controlplane", fmt.Sprintf("127.0.0.1:%d", cp.grpcPort),
		"--node", "n1", "--token", tokenN1, "--poll-interval", "100ms", "--register",
		"--engine-urls", allowed[0], other[0], "http://127.0.0.2:9")
	cp.admin.waitReady(t, allowed...)
	ws, _ := nodeViews(cp.admin)
	if w := ws[allowed[0]]; w.Labels["smg.agent-registered"] != "n1" {
		t.Fatalf("the agent's worker is not marked as n1's: %+v", w)
	}
	waitFor(t, 10*time.Second, "both refusals logged", func() (bool, string) {
		log := cp.proc.stderr.String()
		return strings.Contains(log, "not one the admin allowed") && strings.Contains(log, "its model could not be read"), ""
	})
	if ws, _ := nodeViews(cp.admin); len(ws) != 1 {
		t.Fatalf("workers %v, want only the allowed engine", ws)
	}
	// The bound runs from the agent's last record, which is at most one poll
	// interval (100 ms) before the kill.
	gone := time.Now()
	agent.kill() // gone for good
	waitFor(t, 15*time.Second, "the agent's worker removed after the stale bound", func() (bool, string) {
		ws, err := nodeViews(cp.admin)
		return err == nil && len(ws) == 0, fmt.Sprint(ws, err)
	})
	if d := time.Since(gone); d < 3*time.Second-100*time.Millisecond {
		t.Fatalf("removed %s after the kill, before the 3 s stale bound from its last record", d)
	}
}

// Item 6: a control plane bound beyond loopback without its keys warns
// loudly, says so on /metrics, and logs the address it really bound.
func TestHostileExposedListenerWarns(t *testing.T) {
	for _, tc := range []struct {
		name  string
		extra []string
		want  float64
	}{
		{"no keys", nil, 1},
		{"every key", []string{"--admin-api-key", "k-0123456789abcdef", "--watch-token", "w-0123456789abcdef", "--agent-token", "a-0123456789abcdef"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			port := freePort(t)
			args := append([]string{"launch", "--host", "0.0.0.0", "--port", strconv.Itoa(port), "--grpc-port", "0"}, tc.extra...)
			p := startSMG(t, "launch", args...)
			base := fmt.Sprintf("http://127.0.0.1:%d", port)
			waitHTTP200(t, p, base+"/health")
			exp, err := scrape(base + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			if v := metricSum(exp, "smg_insecure_listener"); v != tc.want || !hasSeries(exp, "smg_insecure_listener") {
				t.Fatalf("smg_insecure_listener = %v, want %v", v, tc.want)
			}
			log := p.stderr.String()
			if warned := strings.Contains(log, "INSECURE LISTENER"); warned != (tc.want == 1) {
				t.Fatalf("warned %v: %s", warned, tail(log, 2000))
			}
			if !strings.Contains(log, fmt.Sprintf("http=0.0.0.0:%d", port)) && !strings.Contains(log, fmt.Sprintf("http=[::]:%d", port)) {
				t.Fatalf("the start-up log does not print the address bound: %s", tail(log, 2000))
			}
		})
	}
}
