package h1server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// serve runs h on a loopback listener; the server is closed at cleanup.
func serve(t *testing.T, h http.Handler, mutate func(*Server)) (*Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := New(&http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute})
	if mutate != nil {
		mutate(s)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		_ = s.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	return s, ln.Addr().String()
}

// echo answers with the method, path, query, host and body it read.
var echo = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "body: "+err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	fmt.Fprintf(w, "%s %s ?%s host=%s cl=%d body=%s", r.Method, r.URL.Path, r.URL.RawQuery, r.Host, r.ContentLength, b)
})

func TestRoundTripsWithNetHTTPClient(t *testing.T) {
	var accepted atomic.Int32
	_, addr := serve(t, echo, func(s *Server) {
		s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
			if st == http.StateNew {
				accepted.Add(1)
			}
		}
	})
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	defer client.CloseIdleConnections()
	for i, tc := range []struct {
		method, path string
		body         io.Reader
		want         string
	}{
		{"GET", "/a/b?x=1", nil, "GET /a/b ?x=1 host=" + addr + " cl=0 body="},
		{"POST", "/v1/chat", strings.NewReader(`{"a":1}`), "POST /v1/chat ? host=" + addr + ` cl=7 body={"a":1}`},
		{"POST", "/chunked", io.MultiReader(strings.NewReader("abc"), strings.NewReader("def")), "POST /chunked ? host=" + addr + " cl=-1 body=abcdef"},
		{"GET", "/esc%20aped", nil, "GET /esc aped ? host=" + addr + " cl=0 body="},
	} {
		req, _ := http.NewRequest(tc.method, "http://"+addr+tc.path, tc.body)
		var reused bool
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != tc.want {
			t.Errorf("%d: got %q, want %q", i, b, tc.want)
		}
		if resp.ContentLength != int64(len(b)) {
			t.Errorf("%d: a short answer came without its Content-Length (%d)", i, resp.ContentLength)
		}
		if resp.Header.Get("Date") == "" {
			t.Errorf("%d: no Date header", i)
		}
		if i > 0 && !reused {
			t.Errorf("%d: the keep-alive connection was not reused", i)
		}
	}
	if n := accepted.Load(); n != 1 {
		t.Errorf("%d connections for 4 keep-alive requests", n)
	}
}

// A long answer goes out chunked; a flushed one reaches the client before
// the handler returns.
func TestChunkedAndFlushedAnswers(t *testing.T) {
	release := make(chan struct{})
	_, addr := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/long" {
			w.Write([]byte(strings.Repeat("x", 3*bufferBeforeCommit)))
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: 1\n\n")
		w.(http.Flusher).Flush()
		<-release
		fmt.Fprint(w, "data: 2\n\n")
	}), nil)
	resp, err := http.Get("http://" + addr + "/long")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if len(b) != 3*bufferBeforeCommit || resp.ContentLength != -1 || len(resp.TransferEncoding) != 1 {
		t.Fatalf("long answer: %d bytes, Content-Length %d, Transfer-Encoding %v", len(b), resp.ContentLength, resp.TransferEncoding)
	}
	resp, err = http.Get("http://" + addr + "/sse")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != "data: 1\n" {
		t.Fatalf("first event before the handler returned: %q %v", line, err)
	}
	close(release)
	rest, _ := io.ReadAll(br)
	if string(rest) != "\ndata: 2\n\n" {
		t.Fatalf("rest: %q", rest)
	}
}

// rawExchange writes raw on a new connection and reads one answer.
func rawExchange(t *testing.T, addr, raw string) (*http.Response, string, *bufio.Reader, net.Conn) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%q: reading the answer: %v", raw, err)
	}
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b), br, c
}

func expectClosed(t *testing.T, br *bufio.Reader, what string) {
	t.Helper()
	if b, err := br.ReadByte(); err == nil {
		t.Errorf("%s: the connection stayed open (next byte %q)", what, b)
	}
}

func TestHTTP10AndPipelining(t *testing.T) {
	_, addr := serve(t, echo, nil)
	resp, body, br, _ := rawExchange(t, addr, "GET /old HTTP/1.0\r\n\r\n")
	if resp.StatusCode != 200 || !strings.HasPrefix(body, "GET /old") || !resp.Close {
		t.Errorf("HTTP/1.0: %d %q close=%v", resp.StatusCode, body, resp.Close)
	}
	expectClosed(t, br, "HTTP/1.0 without keep-alive")

	resp, _, br, c := rawExchange(t, addr, "GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
	if resp.Close || resp.Header.Get("Connection") != "keep-alive" {
		t.Errorf("HTTP/1.0 keep-alive: close=%v Connection=%q", resp.Close, resp.Header.Get("Connection"))
	}
	io.WriteString(c, "GET /b HTTP/1.0\r\n\r\n")
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
		t.Errorf("second HTTP/1.0 request on a kept connection: %v", err)
	}

	// Two requests in one write, the first with a body: answered in order.
	_, body, br, _ = rawExchange(t, addr, "POST /1 HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabcGET /2 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
	if !strings.HasPrefix(body, "POST /1 ? host=h cl=3 body=abc") {
		t.Errorf("first pipelined: %q", body)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if !strings.HasPrefix(string(b), "GET /2") || !resp.Close {
		t.Errorf("second pipelined: %q close=%v", b, resp.Close)
	}
	expectClosed(t, br, "Connection: close")
}

func TestExpectContinue(t *testing.T) {
	_, addr := serve(t, echo, nil)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "POST /e HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil || line != "HTTP/1.1 100 Continue\r\n" {
		t.Fatalf("before the body: %q %v", line, err)
	}
	br.ReadString('\n')
	io.WriteString(c, "hi")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if !strings.HasSuffix(string(b), "body=hi") {
		t.Fatalf("answer: %q", b)
	}
	// A handler that answers without reading: no 100, and the connection
	// closes, since the client may or may not send the body.
	_, addr2 := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusUnauthorized) }), nil)
	resp, _, br, _ = rawExchange(t, addr2, "POST /e HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
	if resp.StatusCode != http.StatusUnauthorized || !resp.Close {
		t.Fatalf("unread expect body: %d close=%v", resp.StatusCode, resp.Close)
	}
	expectClosed(t, br, "an Expect body never asked for")
}

// Every malformed or ambiguous head is refused before the handler runs,
// and the connection closes: two parsers can never read two different
// requests out of the same bytes.
func TestHostileHeads(t *testing.T) {
	var called atomic.Int32
	_, addr := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		called.Add(1)
		io.Copy(io.Discard, r.Body)
	}), func(s *Server) { s.Limits = Limits{MaxLineBytes: 256, MaxHeaderBytes: 1024, MaxHeaders: 10} })
	const get = "GET / HTTP/1.1\r\nHost: h\r\n"
	for _, tc := range []struct {
		name, raw string
		status    int
	}{
		{"CL and TE", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400},
		{"TE and CL", "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n", 400},
		{"duplicate CL, same", get + "Content-Length: 1\r\nContent-Length: 1\r\n\r\nx", 400},
		{"duplicate CL, differing", get + "Content-Length: 1\r\nContent-Length: 2\r\n\r\nxx", 400},
		{"CL list", get + "Content-Length: 1, 1\r\n\r\nx", 400},
		{"CL sign", get + "Content-Length: +1\r\n\r\nx", 400},
		{"CL negative", get + "Content-Length: -1\r\n\r\n", 400},
		{"CL hex", get + "Content-Length: 0x1\r\n\r\nx", 400},
		{"CL overflow", get + "Content-Length: 99999999999999999999\r\n\r\n", 400},
		{"CL empty", get + "Content-Length: \r\n\r\n", 400},
		{"TE gzip", get + "Transfer-Encoding: gzip\r\n\r\n", 501},
		{"TE chunked twice in one field", get + "Transfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n", 501},
		{"TE twice", get + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 501},
		{"TE xchunked", get + "Transfer-Encoding: xchunked\r\n\r\n", 501},
		{"TE space before colon", get + "Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n", 400},
		{"TE in HTTP/1.0", "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400},
		{"obs-fold", get + "X-A: b\r\n c\r\n\r\n", 400},
		{"obs-fold tab", get + "X-A: b\r\n\tc\r\n\r\n", 400},
		{"bare LF request line", "GET / HTTP/1.1\nHost: h\r\n\r\n", 400},
		{"bare LF header", get + "X-A: b\n\r\n", 400},
		{"bare LF end", get + "\n", 400},
		{"CR in value", get + "X-A: b\rc\r\n\r\n", 400},
		{"NUL in value", get + "X-A: b\x00c\r\n\r\n", 400},
		{"no colon", get + "X-A b\r\n\r\n", 400},
		{"empty name", get + ": b\r\n\r\n", 400},
		{"missing Host", "GET / HTTP/1.1\r\n\r\n", 400},
		{"two Hosts", get + "Host: i\r\n\r\n", 400},
		{"Host with a slash", "GET / HTTP/1.1\r\nHost: h/x\r\n\r\n", 400},
		{"Host with a space", "GET / HTTP/1.1\r\nHost: h x\r\n\r\n", 400},
		{"request line too long", "GET /" + strings.Repeat("a", 300) + " HTTP/1.1\r\nHost: h\r\n\r\n", 414},
		{"header line too long", get + "X-A: " + strings.Repeat("a", 300) + "\r\n\r\n", 431},
		{"header too large", get + strings.Repeat("X-A: "+strings.Repeat("a", 200)+"\r\n", 6) + "\r\n", 431},
		{"too many headers", get + strings.Repeat("X-A: a\r\n", 11) + "\r\n", 431},
		{"HTTP/2.0", "GET / HTTP/2.0\r\nHost: h\r\n\r\n", 505},
		{"h2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505},
		{"HTTP/1.2", "GET / HTTP/1.2\r\nHost: h\r\n\r\n", 505},
		{"lowercase version", "GET / http/1.1\r\nHost: h\r\n\r\n", 400},
		{"extra token", "GET / HTTP/1.1 x\r\nHost: h\r\n\r\n", 400},
		{"two spaces", "GET  / HTTP/1.1\r\nHost: h\r\n\r\n", 400},
		{"bad method", "G(T / HTTP/1.1\r\nHost: h\r\n\r\n", 400},
		{"non-ASCII target", "GET /\xff HTTP/1.1\r\nHost: h\r\n\r\n", 400},
		{"fragment", "GET /a#b HTTP/1.1\r\nHost: h\r\n\r\n", 400},
		{"relative target", "GET a HTTP/1.1\r\nHost: h\r\n\r\n", 400},
		{"unknown Expect", get + "Expect: magic\r\n\r\n", 417},
		{"empty line first", "\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n", 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := called.Load()
			resp, _, br, _ := rawExchange(t, addr, tc.raw)
			if resp.StatusCode != tc.status {
				t.Errorf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if !resp.Close {
				t.Error("no Connection: close")
			}
			expectClosed(t, br, tc.name)
			if called.Load() != before {
				t.Error("the handler ran")
			}
		})
	}
}

// A malformed chunked body fails the handler's read and ends the
// connection: what follows it is never read as a request.
func TestHostileChunkedBodies(t *testing.T) {
	var paths atomic.Value
	paths.Store("")
	_, addr := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths.Store(paths.Load().(string) + r.URL.Path + " ")
		if _, err := io.ReadAll(r.Body); err != nil {
			http.Error(w, "bad body", http.StatusBadRequest)
		}
	}), nil)
	const head = "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
	const next = "GET /smuggled HTTP/1.1\r\nHost: h\r\n\r\n"
	for _, tc := range []struct{ name, body string }{
		{"bad size", "zz\r\nabc\r\n0\r\n\r\n"},
		{"size overflow", "1000000000000000\r\nabc\r\n0\r\n\r\n"},
		{"negative size", "-1\r\nabc\r\n0\r\n\r\n"},
		{"no CRLF after data", "3\r\nabcd\r\n0\r\n\r\n"},
		{"bare LF size line", "3\nabc\r\n0\r\n\r\n"},
		{"bare LF after data", "3\r\nabc\n0\r\n\r\n"},
		{"control byte in extension", "3;a=\x01\r\nabc\r\n0\r\n\r\n"},
		{"junk after size", "3 x\r\nabc\r\n0\r\n\r\n"},
		{"obs-fold trailer", "3\r\nabc\r\n0\r\nX: a\r\n b\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			paths.Store("")
			resp, _, br, _ := rawExchange(t, addr, head+tc.body+next)
			if resp.StatusCode != http.StatusBadRequest || !resp.Close {
				t.Errorf("status %d close=%v, want 400 and close", resp.StatusCode, resp.Close)
			}
			expectClosed(t, br, tc.name)
			if p := paths.Load().(string); p != "/a " {
				t.Errorf("handled %q, want only /a", p)
			}
		})
	}
	// A valid body with extensions and a trailer, then the next request.
	paths.Store("")
	resp, _, br, _ := rawExchange(t, addr, head+"3;x=\"y\"\r\nabc\r\n0\r\nX-T: 1\r\n\r\n"+next)
	if resp.StatusCode != 200 {
		t.Fatalf("valid chunked body: %d", resp.StatusCode)
	}
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("the request after it: %v", err)
	}
	if p := paths.Load().(string); p != "/a /smuggled " {
		t.Errorf("handled %q", p)
	}
}

// A handler that does not read a body it was sent answers with
// Connection: close unless the body is already here.
func TestUnreadBody(t *testing.T) {
	_, addr := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}), nil)
	resp, _, br, c := rawExchange(t, addr, "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc")
	if resp.Close {
		t.Error("a buffered unread body closed the connection")
	}
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: h\r\n\r\n")
	if _, err := http.ReadResponse(br, nil); err != nil {
		t.Fatalf("next request: %v", err)
	}
	resp, _, br, _ = rawExchange(t, addr, "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 100000\r\n\r\nabc")
	if !resp.Close {
		t.Error("an unread body still on its way kept the connection")
	}
	expectClosed(t, br, "unread body")
}

// http.ErrAbortHandler cuts a chunked answer: the client never sees its end.
func TestAbortCutsTheAnswer(t *testing.T) {
	_, addr := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "data: 1\n\n")
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	}), nil)
	resp, err := http.Get("http://" + addr)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	if string(b) != "data: 1\n\n" || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("got %q, %v; want the event then an unexpected EOF", b, err)
	}
}

// A client that leaves a long request cancels its context (the watch); a
// failed write cancels it too.
func TestClientLeavingCancelsTheRequest(t *testing.T) {
	canceled := make(chan string, 2)
	_, addr := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/wait" {
			io.ReadAll(r.Body)
			<-r.Context().Done()
			canceled <- "wait"
			return
		}
		for range 10000 {
			if _, err := fmt.Fprint(w, "data: x\n\n"); err != nil {
				break
			}
			if err := http.NewResponseController(w).Flush(); err != nil {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if r.Context().Err() != nil {
			canceled <- "stream"
		}
	}), func(s *Server) { s.WatchAfter = time.Millisecond })
	c, _ := net.Dial("tcp", addr)
	io.WriteString(c, "POST /wait HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n{}")
	c.Close()
	if got := <-canceled; got != "wait" {
		t.Fatal(got)
	}
	c, _ = net.Dial("tcp", addr)
	io.WriteString(c, "GET /stream HTTP/1.1\r\nHost: h\r\n\r\n")
	bufio.NewReader(c).ReadString('\n')
	c.Close()
	if got := <-canceled; got != "stream" {
		t.Fatal(got)
	}
}

// Shutdown closes idle connections, lets a request in flight finish with
// Connection: close, and returns once every connection is closed.
func TestShutdownDrains(t *testing.T) {
	inside, release := make(chan struct{}), make(chan struct{})
	s, addr := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(inside)
			<-release
		}
		io.WriteString(w, "ok")
	}), nil)
	_, _, idleBr, _ := rawExchange(t, addr, "GET / HTTP/1.1\r\nHost: h\r\n\r\n")
	c, _ := net.Dial("tcp", addr)
	defer c.Close()
	io.WriteString(c, "GET /slow HTTP/1.1\r\nHost: h\r\n\r\n")
	<-inside
	shut := make(chan error, 1)
	go func() { shut <- s.Shutdown(context.Background()) }()
	expectClosed(t, idleBr, "an idle connection at shutdown")
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned with a request in flight: %v", err)
	default:
	}
	close(release)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || !resp.Close {
		t.Fatalf("the request in flight: %v, close=%v", err, resp != nil && resp.Close)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if _, err := net.Dial("tcp", addr); err == nil {
		t.Fatal("still accepting after Shutdown")
	}
}

// pipeListener hands out in-memory connections, so a server runs inside a
// synctest bubble and its timers and deadlines follow the bubble's clock.
type pipeListener struct {
	conns  chan net.Conn
	closed chan struct{}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error   { close(l.closed); return nil }
func (l *pipeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

func (l *pipeListener) dial() net.Conn {
	client, server := net.Pipe()
	l.conns <- server
	return client
}

// bubbleServe serves h on a pipe listener inside the running bubble.
func bubbleServe(t *testing.T, h http.Handler) *pipeListener {
	ln := &pipeListener{conns: make(chan net.Conn), closed: make(chan struct{})}
	s := New(&http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 30 * time.Second})
	go s.Serve(ln)
	t.Cleanup(func() { s.Close() })
	return ln
}

// A new connection has ReadHeaderTimeout for its first head, an idle one
// IdleTimeout for its next request to begin and then ReadHeaderTimeout for
// the rest of its head.
func TestTimeouts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ln := bubbleServe(t, echo)
		closedAfter := func(c net.Conn) time.Duration {
			start := time.Now()
			if _, err := io.ReadAll(c); err != nil {
				t.Fatal(err)
			}
			return time.Since(start)
		}
		if d := closedAfter(ln.dial()); d != 5*time.Second {
			t.Errorf("a silent new connection closed after %v, want the 5 s header timeout", d)
		}
		c := ln.dial()
		go io.WriteString(c, "GET / HTTP/1.1\r\nHost: h\r\n")
		if d := closedAfter(c); d != 5*time.Second {
			t.Errorf("a head never finished closed after %v, want 5 s", d)
		}
		c = ln.dial()
		br := bufio.NewReader(c)
		go io.WriteString(c, "GET / HTTP/1.1\r\nHost: h\r\n\r\n")
		if resp, err := http.ReadResponse(br, nil); err != nil {
			t.Fatal(err)
		} else {
			io.ReadAll(resp.Body)
		}
		start := time.Now()
		if _, err := br.ReadByte(); err != io.EOF {
			t.Fatal(err)
		}
		if d := time.Since(start); d != 30*time.Second {
			t.Errorf("an idle connection closed after %v, want the 30 s idle timeout", d)
		}
		c = ln.dial()
		br = bufio.NewReader(c)
		go io.WriteString(c, "GET / HTTP/1.1\r\nHost: h\r\n\r\n")
		if resp, err := http.ReadResponse(br, nil); err == nil {
			io.ReadAll(resp.Body)
		}
		time.Sleep(20 * time.Second) // fake time: idle, within the idle timeout
		go io.WriteString(c, "GET / HTTP/1.1\r\n")
		start = time.Now()
		if _, err := br.ReadByte(); err != io.EOF {
			t.Fatal(err)
		}
		if d := time.Since(start); d != 5*time.Second {
			t.Errorf("a second head begun and never finished closed after %v, want 5 s", d)
		}
	})
}

// A request running past WatchAfter is watched: the client leaving cancels
// its context at once; one that stays gets its answer and the connection
// serves its next request.
func TestWatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		canceledAt := make(chan time.Duration, 1)
		ln := bubbleServe(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			io.ReadAll(r.Body)
			select {
			case <-r.Context().Done():
				canceledAt <- time.Since(start)
			case <-release:
				io.WriteString(w, "done")
			}
		}))
		c := ln.dial()
		go io.WriteString(c, "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n{}")
		time.Sleep(time.Second) // fake time: well past WatchAfter
		synctest.Wait()
		c.Close()
		if d := <-canceledAt; d != time.Second {
			t.Errorf("the client left at 1 s; the request was canceled at %v", d)
		}

		c = ln.dial()
		defer c.Close()
		br := bufio.NewReader(c)
		go io.WriteString(c, "GET /1 HTTP/1.1\r\nHost: h\r\n\r\n")
		time.Sleep(time.Second)
		synctest.Wait()
		release <- struct{}{}
		if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
			t.Fatalf("a watched request: %v", err)
		} else {
			io.ReadAll(resp.Body)
		}
		go io.WriteString(c, "GET /2 HTTP/1.1\r\nHost: h\r\n\r\n")
		time.Sleep(time.Second)
		synctest.Wait()
		release <- struct{}{}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("the next request after a watched one: %v", err)
		}
		if b, _ := io.ReadAll(resp.Body); string(b) != "done" {
			t.Fatalf("%q", b)
		}
		select {
		case d := <-canceledAt:
			t.Fatalf("a request whose client stayed was canceled at %v", d)
		default:
		}
	})
}

// No handler can split an answer: CR and LF in a header value become
// spaces, and a field with an invalid name is dropped. HEAD gets the head
// alone, 204 no body, and 103 goes out before the final answer.
func TestAnswerFraming(t *testing.T) {
	_, addr := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/inject":
			w.Header().Set("X-A", "a\r\nX-Injected: 1")
			w.Header()["Bad Name"] = []string{"x"}
			io.WriteString(w, "ok")
		case "/head":
			w.Header().Set("Content-Length", "5")
			io.WriteString(w, "hello")
		case "/nocontent":
			w.WriteHeader(http.StatusNoContent)
			if _, err := io.WriteString(w, "x"); !errors.Is(err, http.ErrBodyNotAllowed) {
				t.Errorf("a body after 204: %v", err)
			}
		case "/hints":
			w.Header().Set("Link", "</a.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			io.WriteString(w, "final")
		}
	}), nil)
	resp, body, _, _ := rawExchange(t, addr, "GET /inject HTTP/1.1\r\nHost: h\r\n\r\n")
	if resp.Header.Get("X-Injected") != "" || resp.Header.Get("X-A") != "a  X-Injected: 1" || resp.Header.Get("Bad Name") != "" || body != "ok" {
		t.Errorf("header injection: %v %q", resp.Header, body)
	}
	c, _ := net.Dial("tcp", addr)
	defer c.Close()
	br := bufio.NewReader(c)
	io.WriteString(c, "HEAD /head HTTP/1.1\r\nHost: h\r\n\r\nGET /nocontent HTTP/1.1\r\nHost: h\r\n\r\nGET /hints HTTP/1.1\r\nHost: h\r\n\r\n")
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodHead})
	if err != nil || resp.ContentLength != 5 {
		t.Fatalf("HEAD: %v, Content-Length %d", err, resp.ContentLength)
	}
	resp, err = http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("204: %v", err)
	}
	resp, err = http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusEarlyHints || resp.Header.Get("Link") == "" {
		t.Fatalf("103: %v %v", err, resp)
	}
	resp, err = http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("after 103: %v", err)
	}
	if b, _ := io.ReadAll(resp.Body); string(b) != "final" {
		t.Fatalf("after 103: %q", b)
	}
}

// A body that came whole with its head says so (Buffered), so a handler may
// read it without arming a deadline; one still on its way, chunked or owed
// a 100 Continue says what is in hand, or 0.
func TestBufferedBody(t *testing.T) {
	seen := make(chan int64, 1)
	_, addr := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		bb, ok := r.Body.(interface{ Buffered() int64 })
		if !ok {
			seen <- -1
			return
		}
		seen <- bb.Buffered()
		b, _ := io.ReadAll(r.Body)
		if n := bb.Buffered(); n != 0 {
			t.Errorf("Buffered after the body was read: %d", n)
		}
		w.Write(b)
	}), nil)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	exchange := func(head, first, rest string, want int64) {
		t.Helper()
		io.WriteString(c, head+first)
		if got := <-seen; got != want {
			t.Errorf("%q: Buffered %d, want %d", head, got, want)
		}
		io.WriteString(c, rest)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		if string(b) != "abcdef" && !strings.HasPrefix(head, "POST /continue") {
			t.Errorf("%q: body %q", head, b)
		}
	}
	exchange("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 6\r\n\r\n", "abcdef", "", 6)
	exchange("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 6\r\n\r\n", "abc", "def", 3)
	exchange("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n", "6\r\nabcdef\r\n0\r\n\r\n", "", 0)
	exchange("POST /continue HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 6\r\n\r\n", "", "abcdef", 0)
}
