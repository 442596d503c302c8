package h1server

import (
	"errors"
	"net"
	"os"
	"time"
)

// A request that runs longer than WatchAfter gets a read in the background
// once its body is read, as net/http gives every request: EOF (the client
// closed) cancels its context, so a request waiting for admission or for a
// worker ends at once. A shorter request costs no extra goroutine, read
// call or wake-up; a client leaving it is noticed at the next write.

func (c *conn) armWatch() {
	d := c.s.WatchAfter
	if d <= 0 {
		d = DefaultWatchAfter
	}
	if c.timer == nil {
		c.timer = time.AfterFunc(d, c.watchDue)
	} else {
		c.timer.Reset(d)
	}
}

// watchDue runs on the timer's goroutine and becomes the watch.
func (c *conn) watchDue() {
	c.mu.Lock()
	if !c.inHandler || c.watching || c.gone {
		c.mu.Unlock()
		return
	}
	if !c.bodyDone {
		c.wantWatch = true // the body's end starts it
		c.mu.Unlock()
		return
	}
	done := c.startWatchLocked()
	c.mu.Unlock()
	c.watch(done)
}

// bodyDoneLocked notes that the request body was read to its end. c.mu is held.
func (c *conn) bodyDoneLocked() {
	c.bodyDone = true
	if c.wantWatch && c.inHandler && !c.watching && !c.gone {
		c.wantWatch = false
		go c.watch(c.startWatchLocked())
	}
}

func (c *conn) startWatchLocked() chan struct{} {
	c.watching = true
	c.watchDone = make(chan struct{})
	_ = c.rwc.SetReadDeadline(time.Time{})
	return c.watchDone
}

// watch reads until the client sends or leaves, or stopWatch cuts it; done
// is closed as it ends.
func (c *conn) watch(done chan struct{}) {
	var b [1]byte
	n, err := c.rwc.Read(b[:])
	c.mu.Lock()
	defer c.mu.Unlock()
	if n > 0 {
		c.cr.pending, c.cr.has = b[0], true
	}
	if err != nil && !isTimeout(err) {
		c.goneLocked()
	}
	c.watching = false
	close(done)
}

// stopWatch ends the watch once the handler returned, and waits for it.
func (c *conn) stopWatch() {
	c.timer.Stop()
	c.mu.Lock()
	c.inHandler, c.wantWatch = false, false
	done := c.watchDone
	if c.watching {
		_ = c.rwc.SetReadDeadline(aLongTimeAgo)
	}
	c.watchDone = nil
	c.cancel = nil
	c.hook = nil
	c.mu.Unlock()
	if done != nil {
		<-done
	}
}

var aLongTimeAgo = time.Unix(1, 0)

// clientGone: a write to the client failed.
func (c *conn) clientGone() {
	c.mu.Lock()
	c.goneLocked()
	c.mu.Unlock()
}

func (c *conn) goneLocked() {
	c.gone = true
	if c.cancel != nil {
		c.cancel()
	}
	c.runHookLocked()
}

// ctxEnded: the connection's context ended (the server's base context, as
// a router's Stop ends it), which ends its request's too.
func (c *conn) ctxEnded() {
	c.mu.Lock()
	if c.inHandler {
		c.runHookLocked()
	}
	c.mu.Unlock()
}

// runHookLocked runs the handler's OnCancel hook once. c.mu is held.
func (c *conn) runHookLocked() {
	if f := c.hook; f != nil {
		c.hook, c.hookRan = nil, true
		f()
	}
}

// OnCancel arranges for f to run once when the request's context is
// cancelled before its handler returns: the client left, or the server's
// base context ended. It runs at once when that already happened, and
// replaces an earlier f. It is context.AfterFunc on the request's context
// without what that costs per request (a context, a map entry, closures):
// one function the caller binds once. f must not block or call back into
// the response.
func (w *response) OnCancel(f func()) {
	c := w.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if w.done {
		return
	}
	c.hook, c.hookRan = f, false
	if c.gone || c.ctx.Err() != nil {
		c.runHookLocked()
	}
}

// StopOnCancel unhooks OnCancel's f: false when f has already run (or is
// running), as the stop function of context.AfterFunc.
func (w *response) StopOnCancel() bool {
	c := w.c
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hook = nil
	return !c.hookRan
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}
