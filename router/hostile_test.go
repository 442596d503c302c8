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
	go func() { _ = srv.Serve(r.Listener(ln)) }()
	t.Cleanup(func() {
		_ = srv.Close()
		time.Sleep(time.Second) // fake time: lets closing connections finish
	})
	return r, ln
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
	synctest.Test(t, func(t *testing.T) {
		r, ln := bubbleRouter(t, func(o *Options) { o.BodyReadTimeoutSecs = 5 })
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
	synctest.Test(t, func(t *testing.T) {
		_, ln := bubbleRouter(t, func(o *Options) { o.BodyReadTimeoutSecs = 3 })
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
// more than --max-connections are held at once.
func TestIdleTimeoutAndConnectionCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, ln := bubbleRouter(t, func(o *Options) { o.IdleTimeoutSecs = 10; o.MaxConnections = 3 })
		var held []net.Conn
		for range 3 {
			c := ln.dial(t)
			if c == nil {
				t.Fatal("a connection under the cap was not accepted")
			}
			held = append(held, c)
		}
		if c := ln.dial(t); c != nil {
			t.Fatal("a fourth connection was accepted past --max-connections 3")
		}
		synctest.Wait()
		if n := testutil.ToFloat64(r.metrics.connections); n != 3 {
			t.Fatalf("smg_router_connections = %v, want 3", n)
		}
		// One request makes a connection idle-after-use; then nothing.
		go func() { _, _ = io.WriteString(held[0], "GET /health HTTP/1.1\r\nHost: r\r\n\r\n") }()
		if resp, _ := readAnswer(t, held[0]); resp.StatusCode != http.StatusOK {
			t.Fatalf("/health: %d", resp.StatusCode)
		}
		time.Sleep(11 * time.Second) // fake time: past the idle timeout
		synctest.Wait()
		if _, err := held[0].Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("idle connection still open after the idle timeout: %v", err)
		}
		synctest.Wait()
		if c := ln.dial(t); c == nil {
			t.Fatal("a freed connection slot was not reused")
		} else {
			c.Close()
		}
		for _, c := range held {
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
