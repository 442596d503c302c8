package router

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/smg-project/smg/internal/h1client"
	"github.com/smg-project/smg/internal/sendwait"
)

// upstream is the router's HTTP/1.1 client to the engines: connections kept
// alive per engine, each request written and its answer read on the
// handler's own goroutine. http.Transport hands every request to a writer
// goroutine and every answer back from a reader goroutine, two goroutine
// switches with their channels per request; on short completions that was
// the largest part of the router's CPU beyond the system calls themselves.
// Writing the request and parsing the answer are h1client's, which cost a
// few allocations where net/http's Request.Write and ReadResponse cost
// dozens.
type upstream struct {
	dial        func(ctx context.Context, network, addr string) (net.Conn, error)
	dialTLS     func(ctx context.Context, network, addr string) (net.Conn, error) // nil: Go's defaults
	netDialer   *net.Dialer
	maxIdle     int           // idle connections kept per engine
	idleTimeout time.Duration // an idle connection older than this is closed, not used

	mu        sync.Mutex
	idle      map[upKey][]*upConn
	lastSweep time.Time
}

type upKey struct {
	tls  bool
	host string // host:port as in the URL
}

type upConn struct {
	c      net.Conn
	sw     *sendwait.Conn // the request's last bytes go out with the wait for the answer
	br     *bufio.Reader  // reads through sw
	bw     *bufio.Writer  // writes through sw
	parser h1client.Parser
	key    upKey
	idleAt time.Time

	cut func() // pc.interrupt, bound once: the request's cancellation cuts the connection
}

func newUpConn(c net.Conn, key upKey) *upConn {
	pc := &upConn{c: c, key: key, sw: sendwait.New(c, nil)}
	pc.cut = pc.interrupt
	pc.br, pc.bw = bufio.NewReaderSize(pc.sw, 4<<10), bufio.NewWriterSize(pc.sw, 4<<10)
	return pc
}

// interrupt ends the I/O on the connection in flight (the request was
// cancelled); the connection is closed, not reused, after it.
func (pc *upConn) interrupt() { _ = pc.c.SetDeadline(aLongTimeAgo) }

var aLongTimeAgo = time.Unix(1, 0)

func newUpstream(d *net.Dialer, dialTLS func(context.Context, string, string) (net.Conn, error), maxIdle int, idleTimeout time.Duration) *upstream {
	return &upstream{dial: d.DialContext, dialTLS: dialTLS, netDialer: d, maxIdle: maxIdle, idleTimeout: idleTimeout,
		idle: make(map[upKey][]*upConn)}
}

// nothingReadError is a connection closed or reset before a byte of the
// answer arrived: the only failure a fresh connection may be tried after.
type nothingReadError struct{ err error }

func (e *nothingReadError) Error() string { return e.err.Error() }
func (e *nothingReadError) Unwrap() error { return e.err }

// RoundTrip sends req and returns the answer's head; the body streams from
// the connection, which goes back to the pool when the body is read to its
// end. A kept-alive connection the engine closed while it sat idle (closed
// or reset before a byte of the answer) is dialled afresh once, as
// http.Transport does. The connection's I/O ends at deadline (zero: none),
// with context.DeadlineExceeded, and when ctx ends, or with a hook when
// the hook runs instead (ctx then only dials).
func (u *upstream) RoundTrip(ctx context.Context, req *http.Request, deadline time.Time, hook cancelHook) (*http.Response, error) {
	key := upKey{tls: req.URL.Scheme == "https", host: req.URL.Host}
	for retried := false; ; retried = true {
		pc, reused, err := u.get(ctx, key)
		if err != nil {
			return nil, err
		}
		resp, err := u.send(ctx, pc, req, deadline, hook)
		if err == nil {
			return resp, nil
		}
		pc.c.Close()
		if cerr := ctx.Err(); cerr != nil {
			return nil, cerr
		}
		if pastDeadline(err, deadline) {
			return nil, context.DeadlineExceeded
		}
		var nr *nothingReadError
		if isNothingRead := errors.As(err, &nr); isNothingRead {
			err = nr.err
		} else {
			return nil, err
		}
		if !reused || retried {
			return nil, err
		}
		if rb, ok := req.Body.(*rewindBody); ok {
			rb.rewind()
		} else if req.GetBody == nil {
			return nil, err
		} else if req.Body, err = req.GetBody(); err != nil {
			return nil, err
		}
	}
}

// rewindBody is a request body in memory that a retry reads again; the
// upstream writes its bytes as they are.
type rewindBody struct {
	bytes.Reader
	b []byte
}

func newRewindBody(b []byte) *rewindBody {
	rb := &rewindBody{b: b}
	rb.Reset(b)
	return rb
}

func (rb *rewindBody) rewind()   { rb.Reset(rb.b) }
func (*rewindBody) Close() error { return nil }

// pastDeadline reports whether err is the connection's deadline, deadline,
// having passed: the request's bound, not the engine's failure.
func pastDeadline(err error, deadline time.Time) bool {
	return !deadline.IsZero() && errors.Is(err, os.ErrDeadlineExceeded) && !time.Now().Before(deadline)
}

// send writes req on pc and reads the answer's head.
func (u *upstream) send(ctx context.Context, pc *upConn, req *http.Request, deadline time.Time, hook cancelHook) (*http.Response, error) {
	_ = pc.c.SetDeadline(deadline) // a pooled connection's last one cleared too
	b := &upBody{u: u, pc: pc, ctx: ctx, hook: hook, deadline: deadline}
	if hook != nil {
		hook.OnCancel(pc.cut)
	} else {
		b.stop = context.AfterFunc(ctx, pc.cut)
	}
	fail := func(err error) (*http.Response, error) { b.unhook(); return nil, err }
	var inMemory []byte
	if rb, ok := req.Body.(*rewindBody); ok {
		inMemory = rb.b
		if inMemory == nil {
			inMemory = []byte{}
		}
	}
	if err := h1client.WriteRequest(pc.bw, req, inMemory); err != nil {
		return fail(nothingRead(err))
	}
	pc.sw.Hold()
	err := pc.bw.Flush()
	pc.sw.Release()
	if err != nil {
		return fail(nothingRead(err))
	}
	if _, err := pc.br.Peek(1); err != nil {
		return fail(nothingRead(err))
	}
	resp, err := pc.parser.ReadResponse(pc.br, req, &b.body)
	if err != nil {
		return fail(err)
	}
	// Only an answer whose end the body marks leaves the connection reusable.
	b.reuse = !resp.Close
	resp.Body = b
	return resp, nil
}

// nothingRead marks a connection closed or reset before the answer began.
func nothingRead(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return &nothingReadError{err}
	}
	return err
}

// get takes an idle connection to key, or dials one.
func (u *upstream) get(ctx context.Context, key upKey) (*upConn, bool, error) {
	pc, expired := u.takeIdle(key, time.Now())
	for _, c := range expired {
		c.c.Close() // with no lock held: a TLS close writes to the engine
	}
	if pc != nil {
		return pc, true, nil
	}
	c, err := u.dialKey(ctx, key)
	if err != nil {
		return nil, false, err
	}
	return newUpConn(c, key), false, nil
}

// takeIdle takes the newest idle connection to key within the idle
// timeout, and the older ones it passed, for the caller to close.
func (u *upstream) takeIdle(key upKey, now time.Time) (pc *upConn, expired []*upConn) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for list := u.idle[key]; len(list) > 0; list = u.idle[key] {
		c := list[len(list)-1]
		list[len(list)-1] = nil
		u.idle[key] = list[:len(list)-1]
		if now.Sub(c.idleAt) < u.idleTimeout {
			return c, expired
		}
		expired = append(expired, c)
	}
	return nil, expired
}

func (u *upstream) dialKey(ctx context.Context, key upKey) (net.Conn, error) {
	addr := key.host
	if _, _, err := net.SplitHostPort(addr); err != nil {
		port := "80"
		if key.tls {
			port = "443"
		}
		addr = net.JoinHostPort(addr, port)
	}
	if !key.tls {
		return u.dial(ctx, "tcp", addr)
	}
	if u.dialTLS != nil {
		return u.dialTLS(ctx, "tcp", addr)
	}
	host, _, _ := net.SplitHostPort(addr)
	d := tls.Dialer{NetDialer: u.netDialer, Config: &tls.Config{ServerName: host}}
	return d.DialContext(ctx, "tcp", addr)
}

// put keeps pc for the next request to its engine, within maxIdle, and
// closes idle connections past the idle timeout now and then.
func (u *upstream) put(pc *upConn) {
	pc.idleAt = time.Now()
	kept, stale := u.keep(pc)
	if !kept {
		pc.c.Close()
	}
	for _, c := range stale {
		c.c.Close()
	}
}

// keep adds pc to its engine's idle connections unless they are full, and
// now and then takes out those past the idle timeout, for the caller to
// close with no lock held.
func (u *upstream) keep(pc *upConn) (kept bool, stale []*upConn) {
	now := pc.idleAt
	u.mu.Lock()
	defer u.mu.Unlock()
	list := u.idle[pc.key]
	if len(list) >= u.maxIdle {
		return false, nil
	}
	u.idle[pc.key] = append(list, pc)
	if now.Sub(u.lastSweep) > u.idleTimeout {
		u.lastSweep = now
		for k, list := range u.idle {
			fresh := list[:0]
			for _, c := range list {
				if now.Sub(c.idleAt) >= u.idleTimeout {
					stale = append(stale, c)
				} else {
					fresh = append(fresh, c)
				}
			}
			clear(list[len(fresh):])
			if len(fresh) == 0 {
				delete(u.idle, k)
			} else {
				u.idle[k] = fresh
			}
		}
	}
	return true, stale
}

// upBody is an answer's body: read to its end, it gives the connection back
// to the pool; closed before, or failed, it closes the connection.
type upBody struct {
	u        *upstream
	pc       *upConn
	body     h1client.Body
	hook     cancelHook  // cuts the connection when the request is cancelled, or
	stop     func() bool // unhooks ctx's cancellation (context.AfterFunc)
	ctx      context.Context
	deadline time.Time
	reuse    bool
	done     bool
}

// unhook unhooks the cancellation; false once it has fired (the connection
// is cut).
func (b *upBody) unhook() bool {
	if b.hook != nil {
		return b.hook.StopOnCancel()
	}
	return b.stop()
}

func (b *upBody) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	n, err := b.body.Read(p)
	switch {
	case err == io.EOF:
		b.finish(true)
	case err != nil:
		if cerr := b.ctx.Err(); cerr != nil {
			err = cerr // cut by the cancellation, not by the engine
		} else if pastDeadline(err, b.deadline) {
			err = context.DeadlineExceeded
		}
		b.finish(false)
	}
	return n, err
}

func (b *upBody) Close() error {
	if !b.done {
		b.finish(false)
	}
	return nil
}

func (b *upBody) finish(complete bool) {
	b.done = true
	if b.unhook() && complete && b.reuse {
		b.u.put(b.pc)
		return
	}
	b.pc.c.Close()
}
