package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/smg-project/smg/router"
)

// common flags of the serving subcommands.
type common struct {
	host     string
	port     int
	logLevel string
}

func (c *common) addFlags(fs *flag.FlagSet, port int) {
	c.port = port
	fs.StringVar(&c.host, "host", "127.0.0.1", "address to listen on")
	fs.IntVar(&c.port, "port", c.port, "HTTP port")
	fs.StringVar(&c.logLevel, "log-level", "info", "log level: debug, info, warn or error")
}

func (c *common) logger(w io.Writer) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(c.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: %v", err)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: lvl})), nil
}

func listen(host string, port int) (net.Listener, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, fmt.Sprint(port)))
	if err != nil {
		return nil, fmt.Errorf("listen on %s:%d: %w", host, port, err)
	}
	return ln, nil
}

// serveHTTP serves h on ln until ctx ends, then shuts down within grace.
// errLog (may be nil) receives the server's own errors, refused TLS
// handshakes among them.
func serveHTTP(ctx context.Context, ln net.Listener, h http.Handler, grace time.Duration, errLog *log.Logger) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: errLog}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	err := srv.Shutdown(sctx)
	if errors.Is(err, context.DeadlineExceeded) {
		err = srv.Close()
	}
	return err
}

// drainable is a handler whose requests can be drained (the router).
type drainable interface {
	Drain()
	Stop()
}

// serveDraining serves srv on ln until ctx ends, then drains: d.Drain() fails
// readiness and refuses new requests, requests in flight get grace to finish,
// then d.Stop() ends the rest with an explicit error.
func serveDraining(ctx context.Context, ln net.Listener, srv router.HTTPServer, d drainable, grace time.Duration, log *slog.Logger) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("Draining: readiness fails, requests in flight may finish", "grace", grace)
	d.Drain()
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := srv.Shutdown(sctx); err == nil {
		return nil
	}
	log.Warn("Shutdown grace over: ending the requests still in flight with an error")
	d.Stop()
	fctx, fcancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer fcancel()
	if err := srv.Shutdown(fctx); err != nil {
		return srv.Close()
	}
	return nil
}

// keepaliveOptions make a server's long-lived streams notice a dead peer
// within seconds.
func keepaliveOptions(extra ...grpc.ServerOption) []grpc.ServerOption {
	return append([]grpc.ServerOption{
		// A link cut without a FIN (dropped packets, a partition) ends the
		// stream within Time+Timeout of the peer's last frame: an agent's
		// engines go back to the control plane's own polls within 4 s.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 2 * time.Second, Timeout: 2 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 2 * time.Second, PermitWithoutStream: true}),
	}, extra...)
}

// serveGRPC serves s on ln until ctx ends, then stops gracefully (bounded).
func serveGRPC(ctx context.Context, ln net.Listener, s *grpc.Server, grace time.Duration) error {
	errc := make(chan error, 1)
	go func() { errc <- s.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	done := make(chan struct{})
	go func() { s.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		s.Stop()
	}
	return nil
}

// dialAddr is an address this process can dial to reach ln: a wildcard
// bind (0.0.0.0, [::]) is reached on loopback. Logs print ln.Addr() as bound.
func dialAddr(ln net.Listener) string {
	if tcp, ok := ln.Addr().(*net.TCPAddr); ok && tcp.IP.IsUnspecified() {
		return net.JoinHostPort("127.0.0.1", fmt.Sprint(tcp.Port))
	}
	return ln.Addr().String()
}
