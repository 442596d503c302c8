package router

import (
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Server returns the http.Server a router's port should run: headers within
// ReadHeaderTimeout, idle keep-alive connections closed after --idle-timeout-secs.
// Bodies get their own deadline (--body-read-timeout-secs) in the handler,
// because a whole-request ReadTimeout would also cut long streamed answers.
func (o Options) Server(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       time.Duration(o.IdleTimeoutSecs) * time.Second,
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
