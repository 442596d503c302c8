package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/smg-project/smg/controlplane"
	"github.com/smg-project/smg/internal/cli"
	"github.com/smg-project/smg/internal/exposure"
	"github.com/smg-project/smg/internal/promreg"
)

func runControlPlane(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("controlplane", "The control plane: worker registry, admin API (gRPC and REST), load monitor,\noverload verdicts, and the watch stream that feeds routers.", stdout)
	var c common
	c.addFlags(fs, 30001)
	grpcPort := fs.Int("grpc-port", 30002, "gRPC port (WorkerService, WatchService, AgentService)")
	opts := controlplane.DefaultOptions()
	opts.AddFlags(fs)
	var tf tlsFlags
	tf.addServer(fs)
	tf.addClientCA(fs)
	tf.addEngineClient(fs)
	tf.addRaft(fs)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	log, err := c.logger(stderr)
	if err != nil {
		return err
	}
	metrics := promreg.New()
	ts, err := tf.load(log, metrics)
	if err != nil {
		return err
	}
	opts.EngineTLS = ts.engineTLS()
	cps, err := openControlPlane(opts, log, metrics, c.host, c.port, *grpcPort, ts)
	if err != nil {
		return err
	}
	log.Info("Control plane serving", "http", cps.httpLn.Addr().String(), "grpc", cps.grpcLn.Addr().String(), "tls", ts.enabled(), "mtls", ts.clientCAs != nil, "raft_tls", ts.raftCert != nil)
	ts.warnPlaintext("http", cps.httpLn)
	ts.warnPlaintext("grpc", cps.grpcLn)
	g, ctx := errgroup.WithContext(ctx)
	cps.run(ctx, g)
	g.Go(func() error { ts.watch(ctx); return nil })
	g.Go(func() error {
		return serveHTTP(ctx, ts.httpListener(cps.httpLn), cps.cp.HTTPHandler(), 5*time.Second, ts.httpErrorLog("http"))
	})
	return g.Wait()
}

// servingControlPlane is a control plane with its ports open and its static
// workers submitted: what `smg controlplane` and `smg launch` share.
type servingControlPlane struct {
	cp             *controlplane.ControlPlane
	httpLn, grpcLn net.Listener
	grpc           *grpc.Server
}

func openControlPlane(opts controlplane.Options, log *slog.Logger, metrics *prometheus.Registry, host string, httpPort, grpcPort int, ts *tlsSetup) (*servingControlPlane, error) {
	opts.Cluster.PeerCreds, opts.Cluster.PeerHTTPTLS = ts.peerCreds(), ts.peerTLS()
	if opts.Cluster.TLS = ts.raftTLS(); opts.Cluster.TLS != nil && !opts.Cluster.Enabled() {
		return nil, errors.New("--raft-tls-cert-file and the other --raft-tls-* flags need --data-dir (without it there is no Raft)")
	}
	cp, err := controlplane.New(opts, log, metrics)
	if err != nil {
		return nil, err
	}
	httpLn, err := listen(host, httpPort)
	if err != nil {
		return nil, err
	}
	grpcLn, err := listen(host, grpcPort)
	if err != nil {
		httpLn.Close()
		return nil, err
	}
	checkExposure(log, metrics, opts, httpLn, grpcLn)
	if err := cp.SubmitStatic(); err != nil {
		httpLn.Close()
		grpcLn.Close()
		return nil, err
	}
	gs := cp.GRPCServer(keepaliveOptions(ts.grpcServerOptions()...)...)
	cp.Listening(grpcLn.Addr(), httpLn.Addr())
	return &servingControlPlane{cp: cp, httpLn: httpLn, grpcLn: grpcLn, grpc: gs}, nil
}

// checkExposure warns when a control-plane port is reachable beyond this
// host without the credentials that protect what it serves.
func checkExposure(log *slog.Logger, metrics prometheus.Registerer, opts controlplane.Options, httpLn, grpcLn net.Listener) {
	admin := exposure.Guard{Flag: "--admin-api-key", What: "the admin API: register, change and remove workers", Set: opts.AdminAPIKey != ""}
	exposure.Check(log, metrics,
		exposure.Listener{Name: "http", Addr: httpLn.Addr(), Guards: []exposure.Guard{admin}},
		exposure.Listener{Name: "grpc", Addr: grpcLn.Addr(), Guards: []exposure.Guard{admin,
			{Flag: "--watch-token", What: "the watch stream: the fleet and its verdicts", Set: opts.WatchToken != ""},
			{Flag: "--agent-token-file", What: "the agent stream: load records and liveness evidence", Set: opts.AgentToken != "" || opts.AgentTokenFile != ""},
		}})
}

// run starts the control plane's loops and its gRPC server in g; the HTTP
// port is the caller's to serve.
func (s *servingControlPlane) run(ctx context.Context, g *errgroup.Group) {
	g.Go(func() error { return s.cp.Run(ctx) })
	g.Go(func() error { return serveGRPC(ctx, s.grpcLn, s.grpc, 5*time.Second) })
}
