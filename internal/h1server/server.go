// Package h1server is a lean HTTP/1.1 server for plaintext listeners. It
// serves an http.Handler with the settings of an http.Server (Handler,
// ReadHeaderTimeout, IdleTimeout, ReadTimeout, WriteTimeout, ConnState,
// ErrorLog, BaseContext, ConnContext, MaxHeaderBytes) and spends per request
// only what a request needs: one goroutine per connection, pooled buffers,
// a strict request parser, the request, its header map and its
// ResponseWriter reused on a connection, and no background read on a
// request that ends within WatchAfter.
//
// What it leaves out: TLS, HTTP/2 (h2c included), Hijack, response
// trailers and full-duplex bodies.
package h1server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/smg-project/smg/internal/sendwait"
)

// DefaultWatchAfter is how long a request runs before the server watches
// its connection for the client leaving (a read in the background that
// cancels the request's context at EOF). A shorter request is not watched:
// a client that leaves it is noticed when its answer is written.
const DefaultWatchAfter = 100 * time.Millisecond

// Server serves HTTP/1.1 connections. Make it with New.
type Server struct {
	Config     *http.Server  // settings and handler, read when each connection starts
	Limits     Limits        // request head limits; Config.MaxHeaderBytes, when set, overrides MaxHeaderBytes
	WatchAfter time.Duration // 0: DefaultWatchAfter

	inShutdown atomic.Bool
	mu         sync.Mutex
	listeners  map[net.Listener]struct{}
	conns      map[*conn]struct{}
	dateCache  atomic.Pointer[dateLine]
	readers    sync.Pool
	writers    sync.Pool
}

// New returns a Server for cfg's handler and settings.
func New(cfg *http.Server) *Server {
	return &Server{Config: cfg, listeners: map[net.Listener]struct{}{}, conns: map[*conn]struct{}{}}
}

// Serve accepts connections on ln and serves each on its own goroutine
// until ln fails or the server shuts down (http.ErrServerClosed).
func (s *Server) Serve(ln net.Listener) error {
	if !s.track(ln) {
		return http.ErrServerClosed
	}
	defer s.untrack(ln)
	base := context.Background()
	if s.Config.BaseContext != nil {
		if base = s.Config.BaseContext(ln); base == nil {
			panic("BaseContext returned a nil context")
		}
	}
	base = context.WithValue(base, http.ServerContextKey, s.Config)
	var backoff time.Duration
	for {
		rw, err := ln.Accept()
		if err != nil {
			if s.shuttingDown() {
				return http.ErrServerClosed
			}
			if te, ok := err.(interface{ Temporary() bool }); ok && te.Temporary() {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.logf("h1server: Accept error: %v; retrying in %v", err, backoff)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		c := s.newConn(base, rw)
		if c == nil {
			_ = rw.Close()
			continue
		}
		go c.serve()
	}
}

func (s *Server) track(ln net.Listener) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shuttingDown() {
		return false
	}
	s.listeners[ln] = struct{}{}
	return true
}

func (s *Server) untrack(ln net.Listener) {
	s.mu.Lock()
	delete(s.listeners, ln)
	s.mu.Unlock()
}

func (s *Server) shuttingDown() bool { return s.inShutdown.Load() }

// Shutdown stops accepting, closes idle connections (and connections
// silent for 5 s since they opened), lets every request in flight finish
// (its answer says Connection: close) and returns once all connections are
// closed, or with ctx's error when ctx ends first.
func (s *Server) Shutdown(ctx context.Context) error {
	s.inShutdown.Store(true)
	s.closeListeners()
	wait := time.Millisecond
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		if s.closeIdle() {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			wait = min(2*wait, 100*time.Millisecond)
			t.Reset(wait)
		}
	}
}

// Close stops accepting and closes every connection at once.
func (s *Server) Close() error {
	s.inShutdown.Store(true)
	err := s.closeListeners()
	s.mu.Lock()
	for c := range s.conns {
		_ = c.rwc.Close()
	}
	s.mu.Unlock()
	return err
}

func (s *Server) closeListeners() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var err error
	for ln := range s.listeners {
		if e := ln.Close(); e != nil && err == nil {
			err = e
		}
	}
	clear(s.listeners)
	return err
}

// closeIdle closes the connections waiting for a request; true when none
// is left open.
func (s *Server) closeIdle() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		st := http.ConnState(c.state.Load())
		if st == http.StateIdle || (st == http.StateNew && time.Since(c.opened) > 5*time.Second) {
			_ = c.rwc.Close()
		}
	}
	return len(s.conns) == 0
}

func (s *Server) logf(format string, args ...any) {
	if l := s.Config.ErrorLog; l != nil {
		l.Printf(format, args...)
	} else {
		log.Printf(format, args...)
	}
}

type dateLine struct {
	sec  int64
	text string
}

// date is the Date header's value, formatted once a second.
func (s *Server) date() string {
	now := time.Now()
	if d := s.dateCache.Load(); d != nil && d.sec == now.Unix() {
		return d.text
	}
	d := &dateLine{now.Unix(), now.UTC().Format(http.TimeFormat)}
	s.dateCache.Store(d)
	return d.text
}

// conn is one client connection, served by one goroutine.
type conn struct {
	s      *Server
	rwc    net.Conn
	cr     connReader
	cw     *sendwait.Conn // an answer's last bytes go out with the wait for the next request
	br     *bufio.Reader
	bw     *bufio.Writer
	ctx    context.Context
	remote string
	p      parser
	req    http.Request
	head   reqHead
	rw     response
	body   *body
	state  atomic.Int32 // http.ConnState
	opened time.Time    // accepted: a connection silent since is closed at Shutdown

	connCancel context.CancelFunc // nil unless the base context can end

	mu        sync.Mutex // guards what the watch shares with the serving goroutine
	cancel    context.CancelFunc
	inHandler bool
	bodyDone  bool
	wantWatch bool
	watching  bool
	watchDone chan struct{}
	gone      bool // the client left: the connection ends after this request
	timer     *time.Timer
	hook      func() // the handler's OnCancel
	hookRan   bool
	unhookCtx func() bool // the connection's context ending runs hook
}

const bufSize = 4 << 10

func (s *Server) newConn(base context.Context, rwc net.Conn) *conn {
	c := &conn{s: s, rwc: rwc, remote: rwc.RemoteAddr().String(), opened: time.Now()}
	c.cw = sendwait.New(rwc, c.sentIdle)
	c.cr.c = c.cw
	c.ctx = context.WithValue(base, http.LocalAddrContextKey, rwc.LocalAddr())
	if cc := s.Config.ConnContext; cc != nil {
		if c.ctx = cc(c.ctx, rwc); c.ctx == nil {
			panic("ConnContext returned nil")
		}
	}
	if c.ctx.Done() != nil {
		// A base context that can end: each request's context hangs off the
		// connection's, not off one context shared by every connection.
		c.ctx, c.connCancel = context.WithCancel(c.ctx)
		c.unhookCtx = context.AfterFunc(c.ctx, c.ctxEnded) // once per connection, not per request
	}
	s.mu.Lock()
	if s.shuttingDown() {
		s.mu.Unlock()
		if c.connCancel != nil {
			c.connCancel()
		}
		return nil
	}
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	return c
}

func (c *conn) setState(st http.ConnState) {
	c.state.Store(int32(st))
	if hook := c.s.Config.ConnState; hook != nil {
		hook(c.rwc, st)
	}
}

func (c *conn) serve() {
	s, cfg := c.s, c.s.Config
	c.setState(http.StateNew)
	c.br = c.getReader()
	c.bw = c.getWriter()
	defer c.finish()
	c.p.br = c.br
	c.p.limits = s.Limits.withDefaults()
	if cfg.MaxHeaderBytes > 0 {
		c.p.limits.MaxHeaderBytes = cfg.MaxHeaderBytes
	}
	headerTimeout := cfg.ReadHeaderTimeout
	if headerTimeout <= 0 {
		headerTimeout = cfg.ReadTimeout
	}
	c.p.beforeWait = func() {
		if headerTimeout > 0 {
			_ = c.rwc.SetReadDeadline(time.Now().Add(headerTimeout))
		}
	}
	c.req.Header = make(http.Header, 8)
	for n := 0; ; n++ {
		// A new connection has ReadHeaderTimeout for its request's head;
		// an idle one IdleTimeout for its next request to begin, then
		// ReadHeaderTimeout for the rest of the head.
		wait := cfg.IdleTimeout
		if n == 0 || wait <= 0 {
			wait = headerTimeout
		}
		var deadline time.Time
		if wait > 0 {
			deadline = time.Now().Add(wait)
		}
		if err := c.rwc.SetReadDeadline(deadline); err != nil {
			return
		}
		if _, err := c.br.Peek(1); err != nil {
			return
		}
		c.setState(http.StateActive)
		c.p.waited = n == 0 // the first request's deadline already is the header's
		if err := c.p.readRequest(&c.req, &c.head); err != nil {
			var se *statusError
			if errors.As(err, &se) {
				c.refuse(se)
			}
			return
		}
		if !c.serveRequest() {
			return
		}
		if c.cw.Held() && (c.br.Buffered() > 0 || c.cr.has) {
			// The next request is here already (pipelined): no wait.
			if c.cw.SendHeld() != nil {
				return
			}
		}
		if !c.cw.Held() {
			c.setState(http.StateIdle)
		} // else once the answer is out (sentIdle): an idle connection may be closed
	}
}

// sentIdle: the answer held for the wait for the next request is out.
func (c *conn) sentIdle() { c.setState(http.StateIdle) }

// serveRequest runs the handler on the parsed request; false when the
// connection must end.
func (c *conn) serveRequest() bool {
	cfg, req, h := c.s.Config, &c.req, &c.head
	if cfg.ReadTimeout > 0 {
		_ = c.rwc.SetReadDeadline(time.Now().Add(cfg.ReadTimeout))
	}
	if cfg.WriteTimeout > 0 {
		_ = c.rwc.SetWriteDeadline(time.Now().Add(cfg.WriteTimeout))
	}
	ctx, cancel := context.WithCancel(c.ctx)
	req.RemoteAddr = c.remote
	c.body = nil
	if h.length == 0 {
		req.Body = http.NoBody
	} else {
		c.body = &body{c: c, br: c.br, chunked: h.chunked, remaining: max(h.length, 0), expect: h.expect}
		req.Body = c.body
	}
	*req = *req.WithContext(ctx)
	w := &c.rw
	w.reset(c, req, h)

	c.mu.Lock()
	c.cancel, c.inHandler, c.bodyDone, c.wantWatch = cancel, true, c.body == nil, false
	c.hook, c.hookRan = nil, false
	c.mu.Unlock()
	c.armWatch()

	aborted := c.handle(w, req)
	if !aborted {
		w.finish()
	} else if w.committed && w.err == nil {
		_ = c.bw.Flush() // what was sent stays sent; the cut ends it
	}
	c.stopWatch()
	cancel()
	req.Body = nil
	if c.body != nil {
		_ = c.body.Close()
	}
	if cfg.WriteTimeout > 0 {
		_ = c.rwc.SetWriteDeadline(time.Time{})
	}
	if aborted || w.err != nil || c.gone {
		return false
	}
	if w.closeAfter || h.close || c.s.shuttingDown() {
		if c.cw.SendHeld() != nil {
			return false
		}
		if !c.requestBodyDone() {
			c.closeGracefully()
		}
		return false
	}
	return true
}

// handle runs the handler; true when it panicked (http.ErrAbortHandler
// among others), which cuts the connection.
func (c *conn) handle(w *response, req *http.Request) (aborted bool) {
	defer func() {
		if v := recover(); v != nil {
			aborted = true
			if v != http.ErrAbortHandler {
				buf := make([]byte, 64<<10)
				buf = buf[:runtime.Stack(buf, false)]
				c.s.logf("http: panic serving %v: %v\n%s", c.remote, v, buf)
			}
		}
	}()
	c.s.Config.Handler.ServeHTTP(w, req)
	return false
}

// requestBodyDone reports whether the request's body is behind us, so the
// next bytes on the connection are the next request's.
func (c *conn) requestBodyDone() bool {
	return c.body == nil || c.body.discardBuffered()
}

// sendContinue answers Expect: 100-continue as the handler first reads the
// body.
func (c *conn) sendContinue() error {
	if c.rw.committed || c.rw.err != nil {
		return nil
	}
	if _, err := c.bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n"); err != nil {
		return err
	}
	return c.bw.Flush()
}

// refuse answers a request refused before its handler, then closes.
func (c *conn) refuse(se *statusError) {
	_ = c.rwc.SetWriteDeadline(time.Now().Add(time.Second))
	text := http.StatusText(se.status)
	_, _ = fmt.Fprintf(c.bw, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%d %s: %s",
		se.status, text, len(fmt.Sprintf("%d %s: %s", se.status, text, se.msg)), se.status, text, se.msg)
	if c.bw.Flush() == nil {
		c.closeGracefully()
	}
}

// closeGracefully closes the write side and reads what the client still
// sends, for at most rstAvoidance, so its unread bytes do not turn into a
// reset that destroys the answer before the client reads it.
func (c *conn) closeGracefully() {
	const rstAvoidance = 500 * time.Millisecond
	if cw, ok := c.rwc.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_ = c.rwc.SetReadDeadline(time.Now().Add(rstAvoidance))
	_, _ = io.CopyN(io.Discard, c.rwc, 256<<10)
}

func (c *conn) finish() {
	_ = c.cw.SendHeld()
	_ = c.rwc.Close()
	if c.connCancel != nil {
		c.unhookCtx()
		c.connCancel()
	}
	if c.timer != nil {
		c.timer.Stop()
	}
	c.setState(http.StateClosed)
	c.br.Reset(nil)
	c.s.readers.Put(c.br)
	c.bw.Reset(nil)
	c.s.writers.Put(c.bw)
	c.br, c.bw, c.p.br = nil, nil, nil
	s := c.s
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

func (c *conn) getReader() *bufio.Reader {
	if br, ok := c.s.readers.Get().(*bufio.Reader); ok {
		br.Reset(&c.cr)
		return br
	}
	return bufio.NewReaderSize(&c.cr, bufSize)
}

func (c *conn) getWriter() *bufio.Writer {
	if bw, ok := c.s.writers.Get().(*bufio.Writer); ok {
		bw.Reset(c.cw)
		return bw
	}
	return bufio.NewWriterSize(c.cw, bufSize)
}

// connReader reads the connection, first handing over a byte the watch
// read while a request ran (the next request's, pipelined).
type connReader struct {
	c       io.Reader
	pending byte
	has     bool
}

func (r *connReader) Read(p []byte) (int, error) {
	if r.has && len(p) > 0 {
		p[0], r.has = r.pending, false
		return 1, nil
	}
	return r.c.Read(p)
}
