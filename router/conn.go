package router

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/smg-project/smg/internal/h1server"
)

// Values of --http-server.
const (
	HTTPServerLean = "lean"     // internal/h1server
	HTTPServerNet  = "net/http" // Go's http.Server
)

// HTTPServer is what serves a router's port: an *http.Server or the lean
// server.
type HTTPServer interface {
	Serve(net.Listener) error
	Shutdown(context.Context) error
	Close() error
}

// Serving returns what serves srv (from Server, hooked by Listener) on a
// port: the lean HTTP/1.1 server under --http-server lean when the port is
// plaintext, srv itself otherwise (TLS stays on net/http). Both take srv's
// handler, timeouts, ConnState hook and error log.
func (o Options) Serving(srv *http.Server, tls bool) HTTPServer {
	if o.HTTPServer == HTTPServerLean && !tls {
		return h1server.New(srv)
	}
	return srv
}

// Server returns the http.Server a router's port should run: a connection
// silent for --idle-timeout-secs is closed, whether between requests
// (IdleTimeout) or before its first one (ReadHeaderTimeout, at most 10 s, so
// headers sent slowly are cut too). Bodies get their own deadline
// (--body-read-timeout-secs) in the handler, because a whole-request
// ReadTimeout would also cut long streamed answers. Serve it on
// Router.Listener, whose ConnState it reports to.
func (o Options) Server(h http.Handler) *http.Server {
	idle := time.Duration(o.IdleTimeoutSecs) * time.Second
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: min(10*time.Second, idle),
		IdleTimeout:       idle,
	}
}

// Reasons a connection is closed by the caps (smg_router_connections_closed_total).
const (
	connClosedIdleAtCap       = "idle_at_cap"        // an idle one, for a new client at --max-connections
	connClosedIdleAtClientCap = "idle_at_client_cap" // a client's own idle one, for its new one
	connClosedClientCap       = "client_cap"         // a new one, its client's are all busy
)

// freshGrace is how long a new connection may stay silent before it counts
// as idle: a client sends its request at once, so a younger one is not taken.
const freshGrace = time.Second

// ConnLimiter caps a listener at --max-connections connections open at once
// and one client (a remote IPv4 address, an IPv6 /64) at
// --max-connections-per-client. A connection that would pass a cap first
// takes the place of an idle one, oldest first: a keep-alive connection
// between requests, or, failing that, one silent since it opened for
// freshGrace. Its client's own at the client's cap, anyone's at the global
// cap, so idle connections never lock new clients out. Only when every
// connection is busy does Accept wait (more clients wait in the listen
// backlog and cost no goroutine and no file handle), or, at a client's cap,
// is the new connection closed at once. Idleness comes from the server's
// ConnState hook; without it nothing is reclaimed.
type ConnLimiter struct {
	net.Listener
	max, perClient int
	open           prometheus.Gauge
	closed         *prometheus.CounterVec
	wake           chan struct{} // a slot freed, or a connection went idle
	done           chan struct{} // the listener closed
	closeOnce      sync.Once

	mu      sync.Mutex
	n       int                           // connections open or reserved
	all     idleSet                       // every connection waiting for a request
	clients map[netip.Prefix]*clientConns // clients with a connection open
}

// idleSet holds connections waiting for a request, oldest first: idle
// between keep-alive requests, and fresh (not one request yet).
type idleSet struct{ idle, fresh connList }

// connList is a list of connections linked through their own fields, so a
// connection turning idle after every request costs no allocation. link is
// which of a connection's links the list uses: a connection is in one of
// l.all's lists and in one of its client's at once.
type connList struct {
	head, tail *limitConn
	link       int
}

const (
	linkAll = iota
	linkClient
)

type connLink struct {
	prev, next *limitConn
	in         bool
}

func (q *connList) pushBack(c *limitConn) {
	ln := &c.links[q.link]
	ln.prev, ln.next, ln.in = q.tail, nil, true
	if q.tail != nil {
		q.tail.links[q.link].next = c
	} else {
		q.head = c
	}
	q.tail = c
}

func (q *connList) remove(c *limitConn) {
	ln := &c.links[q.link]
	if !ln.in {
		return
	}
	if ln.prev != nil {
		ln.prev.links[q.link].next = ln.next
	} else {
		q.head = ln.next
	}
	if ln.next != nil {
		ln.next.links[q.link].prev = ln.prev
	} else {
		q.tail = ln.prev
	}
	*ln = connLink{}
}

type clientConns struct {
	n int
	idleSet
}

// Listener wraps ln with the router's connection caps and hooks srv (from
// Options.Server) to tell the limiter which connections are idle and, unless
// srv has a BaseContext, to give its requests a context that Stop ends.
func (r *Router) Listener(ln net.Listener, srv *http.Server) *ConnLimiter {
	l := &ConnLimiter{
		Listener: ln, max: r.opts.MaxConnections, perClient: r.opts.MaxConnectionsPerClient,
		open: r.metrics.connections, closed: r.metrics.connsClosed,
		wake: make(chan struct{}, 1), done: make(chan struct{}),
		clients: map[netip.Prefix]*clientConns{},
	}
	srv.ConnState = l.ConnState
	if srv.BaseContext == nil {
		// Stop ends the requests through their context: no hook per request.
		srv.BaseContext = func(net.Listener) context.Context { return r.base }
	}
	return l
}

// Accept returns the next connection within the caps. A connection is taken
// from the backlog before it waits for a slot, so an idle one is closed only
// for a client that is really there; at most that one waits accepted.
func (l *ConnLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		lc := l.admit(c)
		if lc == nil {
			continue // its client is at its cap, all busy
		}
		if err := l.reserve(); err != nil {
			l.mu.Lock()
			l.leaveClient(lc)
			l.mu.Unlock()
			_ = c.Close()
			return nil, err
		}
		l.open.Inc()
		return lc, nil
	}
}

// Close closes the listener and ends an Accept waiting for a slot.
func (l *ConnLimiter) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// admit counts c against its client's cap: past it, the client's oldest idle
// connection gives way, or c is closed when the client has none idle.
func (l *ConnLimiter) admit(c net.Conn) *limitConn {
	lc := &limitConn{Conn: c, l: l}
	key, ok := clientKey(c.RemoteAddr())
	if !ok || l.perClient <= 0 {
		return lc
	}
	l.mu.Lock()
	cl := l.clients[key]
	if cl == nil {
		cl = &clientConns{idleSet: idleSet{idle: connList{link: linkClient}, fresh: connList{link: linkClient}}}
		l.clients[key] = cl
	}
	var victim *limitConn
	if cl.n >= l.perClient {
		if victim, _ = l.takeOldest(&cl.idleSet); victim == nil {
			l.mu.Unlock()
			l.closed.WithLabelValues(connClosedClientCap).Inc()
			_ = c.Close()
			return nil
		}
	}
	cl.n++
	lc.client, lc.key = cl, key
	l.mu.Unlock()
	if victim != nil {
		l.closed.WithLabelValues(connClosedIdleAtClientCap).Inc()
		_ = victim.Close() // frees its global slot too
	}
	return lc
}

// reserve takes a slot under the global cap, closing the oldest idle
// connection when none is free, else waiting for one to close or go idle.
func (l *ConnLimiter) reserve() error {
	for {
		l.mu.Lock()
		if l.n < l.max {
			l.n++
			l.mu.Unlock()
			return nil
		}
		v, wait := l.takeOldest(&l.all)
		l.mu.Unlock()
		if v != nil {
			l.closed.WithLabelValues(connClosedIdleAtCap).Inc()
			_ = v.Close() // frees its slot
			continue
		}
		if !l.wait(wait) {
			return net.ErrClosed
		}
	}
}

// wait waits for a connection to close or go idle, or d (a fresh connection
// turning idle; 0: no bound); false when the listener closed.
func (l *ConnLimiter) wait(d time.Duration) bool {
	var timeout <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-l.wake:
	case <-timeout:
	case <-l.done:
		return false
	}
	return true
}

// takeOldest takes the oldest idle connection of s out of the idle sets: a
// keep-alive one, else a fresh one silent for freshGrace. With none, wait
// is when the oldest fresh one will qualify (0: none). l.mu is held.
func (l *ConnLimiter) takeOldest(s *idleSet) (v *limitConn, wait time.Duration) {
	v = s.idle.head
	if v == nil {
		if v = s.fresh.head; v == nil {
			return nil, 0
		}
		if age := time.Since(v.since); age < freshGrace {
			return nil, freshGrace - age
		}
	}
	l.busy(v)
	return v, 0
}

// ConnState is the server's hook: a connection waiting for a request (new,
// or idle between keep-alive requests) may be reclaimed, oldest first; one
// serving a request, or hijacked, may not.
func (l *ConnLimiter) ConnState(c net.Conn, s http.ConnState) {
	lc := unwrapConn(c)
	if lc == nil || lc.l != l {
		return
	}
	l.mu.Lock()
	if lc.gone {
		l.mu.Unlock()
		return
	}
	l.busy(lc)
	if s == http.StateNew || s == http.StateIdle {
		lc.fresh, lc.since = s == http.StateNew, time.Now()
		l.all.list(lc.fresh).pushBack(lc)
		if lc.client != nil {
			lc.client.list(lc.fresh).pushBack(lc)
		}
	}
	l.mu.Unlock()
	if s == http.StateIdle {
		l.signal() // an Accept waiting at the cap may take it
	}
}

func (s *idleSet) list(fresh bool) *connList {
	if fresh {
		return &s.fresh
	}
	return &s.idle
}

// busy takes lc out of the idle sets; l.mu is held.
func (l *ConnLimiter) busy(lc *limitConn) {
	l.all.list(lc.fresh).remove(lc)
	if lc.client != nil {
		lc.client.list(lc.fresh).remove(lc)
	}
}

func (l *ConnLimiter) signal() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

func (l *ConnLimiter) release(lc *limitConn) {
	l.mu.Lock()
	lc.gone = true
	l.busy(lc)
	l.leaveClient(lc)
	l.n--
	l.mu.Unlock()
	l.open.Dec()
	l.signal()
}

// leaveClient uncounts lc from its client; l.mu is held.
func (l *ConnLimiter) leaveClient(lc *limitConn) {
	if cl := lc.client; cl != nil {
		if cl.n--; cl.n == 0 {
			delete(l.clients, lc.key)
		}
		lc.client = nil
	}
}

// unwrapConn finds the limiter's connection under a server's view of it (a
// TLS connection wraps it).
func unwrapConn(c net.Conn) *limitConn {
	for c != nil {
		switch v := c.(type) {
		case *limitConn:
			return v
		case interface{ NetConn() net.Conn }:
			c = v.NetConn()
		default:
			return nil
		}
	}
	return nil
}

// clientKey names a connection's client: its IPv4 address, or the /64 of its
// IPv6 address (one host's usual allocation).
func clientKey(a net.Addr) (netip.Prefix, bool) {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return netip.Prefix{}, false
	}
	ip, ok := netip.AddrFromSlice(ta.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ip = ip.Unmap()
	bits := 32
	if ip.Is6() {
		bits = 64
	}
	p, err := ip.Prefix(bits)
	return p, err == nil
}

type limitConn struct {
	net.Conn
	l    *ConnLimiter
	once sync.Once

	// Guarded by l.mu.
	client *clientConns // nil: not counted per client
	key    netip.Prefix
	fresh  bool        // waiting for its first request (else idle after one)
	since  time.Time   // waiting since
	links  [2]connLink // in the idle lists while waiting for a request (linkAll, linkClient)
	gone   bool        // released
}

// SyscallConn is the connection's own (a socket's), for the lean server's
// reads and writes; closing goes through Close.
func (c *limitConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errors.ErrUnsupported
	}
	return sc.SyscallConn()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c) })
	return err
}
