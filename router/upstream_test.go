package router

import (
	"bufio"
	"context"
	"hash/crc32"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
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
	deadline, _ := ctx.Deadline()
	return u.RoundTrip(ctx, req, deadline, nil)
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

// rawEngine answers every request with raw bytes, then closes the
// connection: an engine that speaks broken HTTP.
func rawEngine(t *testing.T, raw string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, req.Body)
				_, _ = io.WriteString(c, raw)
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}

// Whatever an engine sends, the client gets a full answer or an explicit
// error, never a hang: a malformed or oversized head is a 502 naming it; a
// body cut short cuts the client's connection (an SSE stream after an error
// event), so the client never reads a clean end.
func TestBadUpstreamAnswersEndExplicitly(t *testing.T) {
	for _, tc := range []struct {
		name, raw string
		status    int    // 0: the head was sent, the body must fail
		want      string // in the 502's body, or in what the client read
	}{
		{"malformed status line", "HTTP/1.1 2x0 OK\r\nContent-Length: 2\r\n\r\n{}", 502, "malformed HTTP status line"},
		{"not HTTP", "SSH-2.0-OpenSSH_9.6\r\n", 502, "malformed HTTP status line"},
		{"oversized head", "HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("a", 70<<10) + "\r\n\r\n{}", 502, "answer head larger than"},
		{"malformed field", "HTTP/1.1 200 OK\r\nBroken header\r\n\r\n{}", 502, "malformed HTTP header field"},
		{"unsupported coding", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n{}", 502, "unsupported Transfer-Encoding"},
		{"closed before the head ended", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n", 502, "unexpected EOF"},
		{"closed mid-body", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"partial\":", 0, `{"partial":`},
		{"chunked body cut short", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n20\r\n{\"partial\":", 0, `{"partial":`},
		{"malformed chunk", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}XX0\r\n\r\n", 0, `{}`},
		{"stream cut short", "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
			"e\r\ndata: {\"a\":1}\n\n\r\n", 0, `"code":"upstream_error"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(o *Options) { o.DisableRetries = true })
			h.apply(Worker{ID: "raw", URL: rawEngine(t, tc.raw), Model: testModel, Type: TypeRegular, Healthy: true})
			body := `{"model":"` + testModel + `","messages":[{"role":"user","content":"x"}]}`
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // a hang fails, not blocks
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/v1/chat/completions", strings.NewReader(body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				if tc.status == 0 && ctx.Err() == nil {
					return // cut before the head: the router held the short answer whole
				}
				t.Fatal(err)
			}
			defer resp.Body.Close()
			got, rerr := io.ReadAll(resp.Body)
			if ctx.Err() != nil {
				t.Fatal("the client waited for an answer that never ended")
			}
			if tc.status != 0 {
				if resp.StatusCode != tc.status || rerr != nil || resp.Header.Get(ErrorCodeHeader) != CodeUpstreamError ||
					!strings.Contains(string(got), tc.want) {
					t.Fatalf("%d %q (%v), code %q; want %d naming %q", resp.StatusCode, got, rerr,
						resp.Header.Get(ErrorCodeHeader), tc.status, tc.want)
				}
				return
			}
			if rerr == nil || !strings.Contains(string(got), tc.want) {
				t.Fatalf("read %q, %v; want %q and then a cut connection", got, rerr, tc.want)
			}
		})
	}
}

// On plain TCP the request's tail goes out with the wait for the answer
// (sendAndWait); bodies of every size, the socket taking them whole or
// not, still arrive byte for byte, on one connection.
func TestUpstreamSendsAndWaitsOnPlainTCP(t *testing.T) {
	srv, conns := countingEngine(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		_, _ = w.Write([]byte(strconv.Itoa(len(b)) + ":" + strconv.FormatUint(uint64(crc32.ChecksumIEEE(b)), 16)))
	})
	u := testUpstream()
	for _, size := range []int{1, 4000, 5000, 64 << 10, 8 << 20} {
		body := strings.Repeat("0123456789abcdef", size/16+1)[:size]
		resp, err := post(t, u, context.Background(), srv.URL+"/v1/completions", body)
		if err != nil {
			t.Fatalf("%d bytes: %v", size, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := strconv.Itoa(size) + ":" + strconv.FormatUint(uint64(crc32.ChecksumIEEE([]byte(body))), 16); string(b) != want {
			t.Fatalf("%d bytes: the engine read %q, want %q", size, b, want)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections, want 1", n)
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, list := range u.idle {
		for _, pc := range list {
			if !pc.sw.Socket() || pc.sw.Held() {
				t.Fatalf("a plain TCP connection without its raw path (%v) or with a tail left (%v)", !pc.sw.Socket(), pc.sw.Held())
			}
		}
	}
}

// closeBlocks is a connection whose Close blocks until release is closed, as
// a TLS close does while the engine reads nothing of its close_notify.
type closeBlocks struct {
	net.Conn
	closing chan struct{}
	release chan struct{}
}

func (c *closeBlocks) Close() error {
	close(c.closing)
	<-c.release
	return nil
}

// An idle connection past the idle timeout is closed with no lock held:
// one whose close blocks holds up neither the request that found it nor
// the other engines' requests.
func TestUpstreamClosesExpiredConnectionsOutsideTheLock(t *testing.T) {
	u := newUpstream(&net.Dialer{Timeout: time.Second}, nil, 4, time.Minute)
	key := upKey{host: "engine-a:8000"}
	stuck := &closeBlocks{closing: make(chan struct{}), release: make(chan struct{})}
	old := newUpConn(stuck, key)
	old.idleAt = time.Now().Add(-2 * time.Minute)
	u.idle[key] = []*upConn{old}
	u.dial = func(context.Context, string, string) (net.Conn, error) {
		c, _ := net.Pipe()
		return c, nil
	}
	got := make(chan bool, 1)
	go func() {
		_, reused, _ := u.get(context.Background(), key)
		got <- reused
	}()
	<-stuck.closing
	if !u.mu.TryLock() {
		close(stuck.release)
		t.Fatal("the upstream's lock is held while an expired connection closes")
	}
	u.mu.Unlock()
	close(stuck.release)
	if <-got {
		t.Fatal("an expired connection was reused")
	}
}
