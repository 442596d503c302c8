package router

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/smg-project/smg/internal/identity"
)

// pipeListener hands out in-memory connections, so a server runs inside a
// synctest bubble and its deadlines follow the bubble's clock.
type pipeListener struct {
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), closed: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error   { l.once.Do(func() { close(l.closed) }); return nil }
func (l *pipeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// dial opens a client connection, or returns nil if the listener has not
// accepted it once the bubble is idle (the connection cap holds it back).
func (l *pipeListener) dial(t *testing.T) net.Conn {
	t.Helper()
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client
	case <-time.After(time.Millisecond): // fake time: fires once the bubble is blocked
		return nil
	}
}

// dialFrom is dial for a client at remote.
func (l *pipeListener) dialFrom(t *testing.T, remote net.Addr) net.Conn {
	t.Helper()
	client, server := net.Pipe()
	select {
	case l.conns <- remoteConn{server, remote}:
		return client
	case <-time.After(time.Millisecond): // fake time: fires once the bubble is blocked
		return nil
	}
}

// remoteConn is a pipe end that says it comes from remote.
type remoteConn struct {
	net.Conn
	remote net.Addr
}

func (c remoteConn) RemoteAddr() net.Addr { return c.remote }

// bubbleRouter serves a router through its own Server and Listener, as
// smg router does, on a pipe listener; the caller runs inside synctest.Test.
func bubbleRouter(t *testing.T, mutate func(*Options)) (*Router, *pipeListener) {
	opts := DefaultOptions()
	if mutate != nil {
		mutate(&opts)
	}
	r, err := New(opts, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ln := newPipeListener()
	srv := opts.Server(r.Handler())
	hs := opts.Serving(srv, false)
	go func() { _ = hs.Serve(r.Listener(ln, srv)) }()
	t.Cleanup(func() {
		_ = hs.Close()
		time.Sleep(time.Second) // fake time: lets closing connections finish
	})
	return r, ln
}

// onBothServers runs a bubble test on each --http-server.
func onBothServers(t *testing.T, test func(t *testing.T, server string)) {
	for _, server := range []string{HTTPServerLean, HTTPServerNet} {
		t.Run(server, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { test(t, server) })
		})
	}
}

func readAnswer(t *testing.T, c net.Conn) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// A header that claims the largest body allowed costs the router nothing
// until bytes arrive, and a body that never arrives is cut at
// --body-read-timeout-secs with 408 request_body_timeout.
func TestContentLengthClaimAllocatesNothingAndStalledBodyIsCut(t *testing.T) {
	onBothServers(t, func(t *testing.T, server string) {
		r, ln := bubbleRouter(t, func(o *Options) { o.HTTPServer = server; o.BodyReadTimeoutSecs = 5 })
		var before runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		var conns []net.Conn
		for range 2 {
			c := ln.dial(t)
			conns = append(conns, c)
			go func() {
				_, _ = io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"+
					"Content-Length: 536870912\r\n\r\n{\"model\":")
			}()
		}
		synctest.Wait() // both handlers wait for the rest of their bodies
		var during runtime.MemStats
		runtime.ReadMemStats(&during)
		if grew := int64(during.HeapAlloc) - int64(before.HeapAlloc); grew > 8<<20 {
			t.Fatalf("two header-only 512 MiB claims grew the heap by %d bytes", grew)
		}
		start := time.Now()
		for _, c := range conns {
			resp, body := readAnswer(t, c)
			if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(body, CodeBodyTimeout) {
				t.Fatalf("stalled body: %d %s", resp.StatusCode, body)
			}
			c.Close()
		}
		if waited := time.Since(start); waited != 5*time.Second {
			t.Fatalf("stalled body cut after %s, want the 5 s body timeout", waited)
		}
		if n := testutil.ToFloat64(r.metrics.refused.WithLabelValues(refusedBodyTimeout)); n != 2 {
			t.Fatalf("smg_router_refused_total{reason=body_timeout} = %v, want 2", n)
		}
	})
}

// A body trickled a byte at a time is cut at the same deadline: progress
// does not extend it.
func TestTrickledBodyIsCut(t *testing.T) {
	onBothServers(t, func(t *testing.T, server string) {
		_, ln := bubbleRouter(t, func(o *Options) { o.HTTPServer = server; o.BodyReadTimeoutSecs = 3 })
		c := ln.dial(t)
		defer c.Close()
		ctx, stop := context.WithCancel(t.Context())
		defer stop()
		go func() {
			_, _ = io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Length: 1000\r\n\r\n")
			for ctx.Err() == nil {
				if _, err := c.Write([]byte{' '}); err != nil {
					return
				}
				time.Sleep(time.Second)
			}
		}()
		start := time.Now()
		resp, _ := readAnswer(t, c)
		if resp.StatusCode != http.StatusRequestTimeout || time.Since(start) > 4*time.Second {
			t.Fatalf("trickled body: %d after %s", resp.StatusCode, time.Since(start))
		}
	})
}

// Idle keep-alive connections are closed after --idle-timeout-secs, and no
// more than --max-connections are held at once: past the cap a new client
// waits while every connection is busy, and takes the place of the first
// one to go idle.
func TestIdleTimeoutAndConnectionCap(t *testing.T) {
	onBothServers(t, func(t *testing.T, server string) {
		r, ln := bubbleRouter(t, func(o *Options) { o.HTTPServer = server; o.IdleTimeoutSecs = 10; o.MaxConnections = 3 })
		var held []net.Conn
		for range 3 {
			c := ln.dial(t)
			if c == nil {
				t.Fatal("a connection under the cap was not accepted")
			}
			go func() { _, _ = io.WriteString(c, busyRequest) }()
			held = append(held, c)
		}
		synctest.Wait()
		// The fourth is taken from the backlog and waits for a slot; a fifth
		// stays in the backlog.
		fourth := ln.dial(t)
		if fourth == nil {
			t.Fatal("the listener stopped taking connections at the cap")
		}
		if c := ln.dial(t); c != nil {
			t.Fatal("a fifth connection was taken past --max-connections 3 with every connection busy")
		}
		answered := make(chan int, 1)
		go func() {
			_, _ = io.WriteString(fourth, "GET /health HTTP/1.1\r\nHost: r\r\n\r\n")
			resp, _ := readAnswer(t, fourth)
			answered <- resp.StatusCode
		}()
		synctest.Wait()
		select {
		case <-answered:
			t.Fatal("a connection past the cap was served while every connection was busy")
		default:
		}
		if n := testutil.ToFloat64(r.metrics.connections); n != 3 {
			t.Fatalf("smg_router_connections = %v, want 3", n)
		}
		// held[0] leaves: its slot goes to the waiting client.
		held[0].Close()
		if code := <-answered; code != http.StatusOK {
			t.Fatalf("the waiting client: %d", code)
		}
		// The fourth is idle now: a new client takes its place at once.
		fifth := ln.dial(t)
		go func() { _, _ = io.WriteString(fifth, "GET /health HTTP/1.1\r\nHost: r\r\n\r\n") }()
		if resp, _ := readAnswer(t, fifth); resp.StatusCode != http.StatusOK {
			t.Fatalf("/health: %d", resp.StatusCode)
		}
		if _, err := fourth.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("the idle connection was not closed for the new client: %v", err)
		}
		if n := testutil.ToFloat64(r.metrics.connsClosed.WithLabelValues(connClosedIdleAtCap)); n != 1 {
			t.Fatalf("smg_router_connections_closed_total{reason=idle_at_cap} = %v, want 1", n)
		}
		// Nothing else arrives: the idle timeout closes the fifth.
		time.Sleep(11 * time.Second) // fake time: past the idle timeout
		synctest.Wait()
		if _, err := fifth.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("idle connection still open after the idle timeout: %v", err)
		}
		for _, c := range held[1:] {
			c.Close()
		}
	})
}

// busyRequest keeps a connection busy: its handler waits for the body.
const busyRequest = "POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Length: 100\r\n\r\n{"

// At the cap, a connection that has sent nothing since it opened counts as
// idle once it has been silent for a second, and is closed for a new client;
// a younger one is not (its request may be on its way).
func TestSilentConnectionsGiveWayAtTheCap(t *testing.T) {
	onBothServers(t, func(t *testing.T, server string) {
		r, ln := bubbleRouter(t, func(o *Options) { o.HTTPServer = server; o.MaxConnections = 2 })
		silent := []net.Conn{ln.dial(t), ln.dial(t)}
		synctest.Wait()
		start := time.Now()
		c := ln.dial(t)
		go func() { _, _ = io.WriteString(c, "GET /health HTTP/1.1\r\nHost: r\r\n\r\n") }()
		if resp, _ := readAnswer(t, c); resp.StatusCode != http.StatusOK {
			t.Fatalf("/health: %d", resp.StatusCode)
		}
		if waited := time.Since(start); waited != freshGrace {
			t.Fatalf("the new client was served after %s, want %s (two silent connections at the cap)", waited, freshGrace)
		}
		if _, err := silent[0].Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("the oldest silent connection was not closed: %v", err)
		}
		if n := testutil.ToFloat64(r.metrics.connsClosed.WithLabelValues(connClosedIdleAtCap)); n != 1 {
			t.Fatalf("smg_router_connections_closed_total{reason=idle_at_cap} = %v, want 1", n)
		}
		silent[1].Close()
		c.Close()
	})
}

// One client (one address) holds at most --max-connections-per-client: its
// new connection takes the place of its own oldest idle one, or is closed
// when all of its connections are busy; another client is served meanwhile.
func TestPerClientConnectionCap(t *testing.T) {
	onBothServers(t, func(t *testing.T, server string) {
		r, ln := bubbleRouter(t, func(o *Options) { o.HTTPServer = server; o.MaxConnectionsPerClient = 2 })
		a := &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 1000}
		request := func(c net.Conn) {
			t.Helper()
			go func() { _, _ = io.WriteString(c, "GET /health HTTP/1.1\r\nHost: r\r\n\r\n") }()
			if resp, _ := readAnswer(t, c); resp.StatusCode != http.StatusOK {
				t.Fatalf("/health: %d", resp.StatusCode)
			}
			// A server marks its connection idle after the client has the
			// answer: settle, so "oldest idle" is the order of the requests.
			synctest.Wait()
		}
		idle := []net.Conn{ln.dialFrom(t, a), ln.dialFrom(t, a)}
		request(idle[0])
		request(idle[1])
		third := ln.dialFrom(t, a)
		request(third)
		if _, err := idle[0].Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("the client's oldest idle connection was not closed at its cap: %v", err)
		}
		if n := testutil.ToFloat64(r.metrics.connsClosed.WithLabelValues(connClosedIdleAtClientCap)); n != 1 {
			t.Fatalf("smg_router_connections_closed_total{reason=idle_at_client_cap} = %v, want 1", n)
		}
		// Both of its connections busy: a third is closed at once.
		for _, c := range []net.Conn{idle[1], third} {
			go func() { _, _ = io.WriteString(c, busyRequest) }()
		}
		synctest.Wait()
		refused := ln.dialFrom(t, a)
		synctest.Wait() // the listener has taken it, before the clock can move
		if _, err := refused.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("a connection past the client's cap with all busy was not closed: %v", err)
		}
		if n := testutil.ToFloat64(r.metrics.connsClosed.WithLabelValues(connClosedClientCap)); n != 1 {
			t.Fatalf("smg_router_connections_closed_total{reason=client_cap} = %v, want 1 (idle_at_client_cap %v)", n, testutil.ToFloat64(r.metrics.connsClosed.WithLabelValues(connClosedIdleAtClientCap)))
		}
		// Another client, and the same client's IPv6 neighbour in another
		// /64, are served.
		request(ln.dialFrom(t, &net.TCPAddr{IP: net.IPv4(10, 0, 0, 2), Port: 1000}))
		v6 := net.ParseIP("2001:db8::1")
		for range 3 {
			request(ln.dialFrom(t, &net.TCPAddr{IP: v6, Port: 1000})) // one /64: its own idle ones give way
		}
		if n := testutil.ToFloat64(r.metrics.connsClosed.WithLabelValues(connClosedIdleAtClientCap)); n != 2 {
			t.Fatalf("an IPv6 /64 is one client: idle_at_client_cap = %v, want 2", n)
		}
		for _, c := range []net.Conn{idle[1], third} {
			c.Close()
		}
	})
}

// A worker URL that loops back to the router through a proxy hiding
// /smg/identity (so registration could not see it) answers every request
// with the router's own 508. That is a failure before the first byte: the
// request is retried on a healthy worker, and the loop counts for the
// looping worker's breaker until it opens.
func TestLoopThroughProxyIsRetriedElsewhere(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.Policy = PolicyRoundRobin })
	target, err := url.Parse(h.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == identity.Path {
			http.NotFound(w, r) // hides the router
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	good := newEngine(t, "good", nil)
	h.apply(Worker{ID: "loop", URL: proxy.URL, Model: testModel, Type: TypeRegular, Healthy: true}, good.worker())

	const n = 30
	for i := range n {
		if a := h.post(testModel, "", fmt.Sprint("loop ", i)); a.status != http.StatusOK || a.servedBy() != "good" {
			t.Fatalf("request %d through the loop: %d %s (served by %q)", i, a.status, a.body, a.servedBy())
		}
	}
	if got := good.hits.Load(); got != n {
		t.Fatalf("the healthy worker answered %d of %d", got, n)
	}
	if got := testutil.ToFloat64(h.r.metrics.refused.WithLabelValues(refusedLoop)); got < 1 {
		t.Fatalf("no request looped back (refused{loop} = %v): the test proves nothing", got)
	}
	v := h.r.view.Load()
	if st := v.states[v.index("loop")].breaker.state.Load(); st != breakerOpen {
		t.Fatalf("the looping worker's breaker is in state %d after %d loops, want open", st,
			int(testutil.ToFloat64(h.r.metrics.refused.WithLabelValues(refusedLoop))))
	}
}

// A request that already passed an smg router is refused with 508
// loop_detected; the router marks what it forwards.
func TestHopHeaderRefusesLoops(t *testing.T) {
	h := newHarness(t, nil)
	var forwarded http.Header
	e := newEngine(t, "w", func(w http.ResponseWriter, r *http.Request) {
		forwarded = r.Header.Clone()
		_, _ = io.Copy(io.Discard, r.Body)
	})
	h.apply(e.worker())
	if a := h.post(testModel, "", "hi"); a.status != http.StatusOK || forwarded.Get(identity.HopHeader) == "" {
		t.Fatalf("first hop: %d, forwarded hop header %q", a.status, forwarded.Get(identity.HopHeader))
	}
	req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"x"}`))
	req.Header.Set(identity.HopHeader, "1")
	a := do(t, req)
	if a.status != http.StatusLoopDetected || a.errorCode() != CodeLoopDetected || a.header.Get(ErrorCodeHeader) != CodeLoopDetected {
		t.Fatalf("looped request: %d %s", a.status, a.body)
	}
	if e.hits.Load() != 1 {
		t.Fatalf("the looped request reached the worker (%d hits)", e.hits.Load())
	}
	if a := h.get(identity.Path); a.status != 200 || !strings.Contains(a.body, `"smg":"router"`) {
		t.Fatalf("identity: %d %s", a.status, a.body)
	}
}
