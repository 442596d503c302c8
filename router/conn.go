package router

import (
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Server returns the http.Server a router's port should run: a connection
// silent for --idle-timeout-secs is closed, whether between requests
// (IdleTimeout) or before its first one (ReadHeaderTimeout, at most 10 s, so
// headers sent slowly are cut too). Bodies get their own deadline
// (--body-read-timeout-secs) in the handler, because a whole-request
// ReadTimeout would also cut long streamed answers.
func (o Options) Server(h http.Handler) *http.Server {
	idle := time.Duration(o.IdleTimeoutSecs) * time.Second
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: min(10*time.Second, idle),
		IdleTimeout:       idle,
	}
}

// Listener caps ln at --max-connections connections open at once: past the
// cap Accept waits for one to close, so extra clients queue in the kernel's
// backlog and cost the router no goroutine and no file handle.
func (r *Router) Listener(ln net.Listener) net.Listener {
	return &limitListener{Listener: ln, sem: make(chan struct{}, r.opts.MaxConnections), open: r.metrics.connections}
}

type limitListener struct {
	net.Listener
	sem  chan struct{}
	open prometheus.Gauge
}

func (l *limitListener) Accept() (net.Conn, error) {
	l.sem <- struct{}{}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	l.open.Inc()
	return &limitConn{Conn: c, release: func() { <-l.sem; l.open.Dec() }}, nil
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
