package router

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// countingEngine counts the connections an engine accepted.
func countingEngine(t *testing.T, h http.HandlerFunc) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &conns
}

func testUpstream() *upstream {
	return newUpstream(&net.Dialer{Timeout: time.Second}, nil, 4, 90*time.Second)
}

func post(t *testing.T, u *upstream, ctx context.Context, url, body string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return u.RoundTrip(ctx, req)
}

// An answer read to its end leaves its connection for the next request; one
// closed early, or marked Connection: close, does not.
func TestUpstreamReusesConnectionsOfCompleteAnswers(t *testing.T) {
	srv, conns := countingEngine(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.URL.Query().Get("close") != "" {
			w.Header().Set("Connection", "close")
		}
		_, _ = w.Write(append([]byte("echo:"), b...))
	})
	u := testUpstream()
	for i := range 5 {
		resp, err := post(t, u, context.Background(), srv.URL+"/v1/completions", "hello")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != "echo:hello" {
			t.Fatalf("request %d: answer %q", i, b)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections for 5 sequential requests, want 1", n)
	}
	resp, err := post(t, u, context.Background(), srv.URL+"/v1/completions?close=1", "x")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	resp, err = post(t, u, context.Background(), srv.URL+"/v1/completions", "y")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close() // unread: the connection is not reused either
	resp, err = post(t, u, context.Background(), srv.URL+"/v1/completions", "z")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if n := conns.Load(); n != 3 {
		t.Fatalf("%d connections, want 3 (after Connection: close and after an unread answer)", n)
	}
}

// A kept-alive connection the engine closed while it sat idle is dialled
// afresh: the request succeeds.
func TestUpstreamRedialsAConnectionClosedWhileIdle(t *testing.T) {
	srv, conns := countingEngine(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "ok")
	})
	u := testUpstream()
	for i := range 2 {
		resp, err := post(t, u, context.Background(), srv.URL+"/generate", "{}")
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		_, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		srv.CloseClientConnections() // the engine's keep-alive timeout, say
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2", n)
	}
}

// A cancelled request ends at once, with the context's error, and its
// connection is not reused.
func TestUpstreamCancelEndsAWaitingRequest(t *testing.T) {
	release, arrived := make(chan struct{}), make(chan struct{}, 1)
	srv, _ := countingEngine(t, func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	u := testUpstream()
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-arrived; cancel() }()
	_, err := post(t, u, ctx, srv.URL+"/generate", "{}")
	if err != context.Canceled {
		t.Fatalf("error %v, want context.Canceled", err)
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, list := range u.idle {
		if len(list) > 0 {
			t.Fatal("the cancelled request's connection went back to the pool")
		}
	}
}
