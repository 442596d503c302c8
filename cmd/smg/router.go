package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/smg-project/smg/controlplane"
	"github.com/smg-project/smg/internal/backoff"
	"github.com/smg-project/smg/internal/cli"
	"github.com/smg-project/smg/internal/cpconn"
	"github.com/smg-project/smg/internal/promreg"
	"github.com/smg-project/smg/router"
	"github.com/smg-project/smg/router/watchclient"
)

// routerFlags are the router's own flags beyond router.Options.
type routerFlags struct {
	id         string
	watchToken string
	grace      int
}

func (f *routerFlags) addFlags(fs *flag.FlagSet) {
	// The host-pid default is filled in at start, so --help (and docs/cli) stay stable.
	fs.StringVar(&f.id, "router-id", "", "name of this router on the control plane (empty: host-pid)")
	fs.IntVar(&f.grace, "shutdown-grace-secs", 30, "on SIGTERM, seconds requests in flight may take to finish before they are ended with an error")
	if fs.Lookup("watch-token") == nil {
		fs.StringVar(&f.watchToken, "watch-token", "", "token presented to the control plane's watch stream")
	}
}

func runRouter(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("router", "A stateless OpenAI-compatible router. It routes on the fleet snapshot the control\nplane pushes over the watch stream, skips vetoed workers, and steers or sheds.", stdout)
	var c common
	c.addFlags(fs, 30000)
	cpAddr := fs.String("controlplane", "127.0.0.1:30002", "control plane gRPC address HOST:PORT; the replicas of a replicated control plane comma-separated (the router follows the leader)")
	var rf routerFlags
	rf.addFlags(fs)
	ropts := router.DefaultOptions()
	ropts.AddFlags(fs)
	var tf tlsFlags
	tf.addServer(fs)
	tf.addControlPlaneClient(fs)
	tf.addEngineClient(fs)
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
	ropts.EngineTLS = ts.engineTLS()
	r, err := router.New(ropts, log, metrics)
	if err != nil {
		return err
	}
	ln, err := listen(c.host, c.port)
	if err != nil {
		return err
	}
	conn, err := dialControlPlane(*cpAddr, ts.controlPlaneCreds(), log)
	if err != nil {
		ln.Close()
		return err
	}
	defer conn.Close()
	wc := watchclient.New(conn, r, watchOptions(rf, ropts), log)
	log.Info("Router serving", "http", ln.Addr().String(), "controlplane", *cpAddr, "policy", ropts.Policy, "tls", ts.enabled(), "controlplane_tls", ts.cpCAs != nil)
	ts.warnPlaintext("http", ln)
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return ignoreCanceled(wc.Run(ctx)) })
	g.Go(func() error { ts.watch(ctx); return nil })
	g.Go(func() error {
		srv := ropts.Server(r.Handler())
		srv.ErrorLog = ts.httpErrorLog("http")
		return serveDraining(ctx, ts.httpListener(r.Listener(ln, srv)), ropts.Serving(srv, ts.enabled()), r, time.Duration(rf.grace)*time.Second, log)
	})
	return g.Wait()
}

func watchOptions(rf routerFlags, ropts router.Options) watchclient.Options {
	if rf.id == "" {
		host, _ := os.Hostname()
		rf.id = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	return watchclient.Options{RouterID: rf.id, Token: rf.watchToken, StaleAfter: time.Duration(ropts.WorkerStaleSecs) * time.Second, Now: ropts.Now}
}

// dialControlPlane connects to the control plane's replicas (one or more,
// comma-separated) and follows the leader among them.
func dialControlPlane(addrs string, creds credentials.TransportCredentials, log *slog.Logger) (*cpconn.Conn, error) {
	list, err := cpconn.ParseAddrs(addrs)
	if err != nil {
		return nil, err
	}
	return cpconn.Dial(list, log, append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 5 * time.Second, Timeout: 3 * time.Second, PermitWithoutStream: true}),
		// Redial a control plane that comes back within about a second.
		backoff.DialOption(backoff.DefaultPolicy()),
	}, watchclient.DialOptions()...)...)
}

func ignoreCanceled(err error) error {
	if err == context.Canceled {
		return nil
	}
	return err
}

// launchConfig is everything `smg launch` takes from its flags. `smg serve`
// registers the same table under the --router- prefix.
type launchConfig struct {
	common   common
	grpcPort *int
	cp       controlplane.Options
	rf       routerFlags
	router   router.Options
	tls      tlsFlags
}

// addFlags registers launch's flags on fs.
func (l *launchConfig) addFlags(fs *flag.FlagSet) {
	l.common.addFlags(fs, 30000)
	l.grpcPort = fs.Int("grpc-port", 30002, "control plane gRPC port, for agents and extra routers (0: any free port)")
	l.cp = controlplane.DefaultOptions()
	l.cp.AddFlags(fs)
	l.rf.addFlags(fs)
	l.router = router.DefaultOptions()
	l.router.AddFlags(fs)
	l.tls.addServer(fs)
	l.tls.addEngineClient(fs)
	l.tls.addRaft(fs)
}

const launchSummary = "Control plane, router and load monitor in one process: the first thing to run.\nThe router's OpenAI API, the admin API, /loads and /metrics share --port."

func runLaunch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("launch", launchSummary, stdout)
	var l launchConfig
	l.addFlags(fs)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	log, err := l.common.logger(stderr)
	if err != nil {
		return err
	}
	return l.run(ctx, log)
}

// run serves the control plane and the router in one process until ctx ends,
// then drains.
func (l *launchConfig) run(ctx context.Context, log *slog.Logger) error {
	c, cpOpts, ropts, rf, tf := l.common, l.cp, l.router, l.rf, l.tls
	rf.watchToken = cpOpts.WatchToken
	metrics := promreg.New()
	ts, err := tf.load(log, metrics)
	if err != nil {
		return err
	}
	ropts.EngineTLS, cpOpts.EngineTLS = ts.engineTLS(), ts.engineTLS()
	r, err := router.New(ropts, log, metrics)
	if err != nil {
		return err
	}
	cps, err := openControlPlane(cpOpts, log, metrics, c.host, c.port, *l.grpcPort, ts)
	if err != nil {
		return err
	}
	// The in-process router reaches the control plane over its own gRPC port,
	// trusting exactly the certificate this process serves.
	conn, err := dialControlPlane(dialAddr(cps.grpcLn), ts.selfCreds(), log)
	if err != nil {
		return err
	}
	defer conn.Close()
	wc := watchclient.New(conn, r, watchOptions(rf, ropts), log)
	log.Info("smg launch serving", "http", cps.httpLn.Addr().String(), "grpc", cps.grpcLn.Addr().String(), "policy", ropts.Policy, "tls", ts.enabled())
	ts.warnPlaintext("http", cps.httpLn)
	ts.warnPlaintext("grpc", cps.grpcLn)
	g, ctx := errgroup.WithContext(ctx)
	cps.run(ctx, g)
	g.Go(func() error { return ignoreCanceled(wc.Run(ctx)) })
	g.Go(func() error { ts.watch(ctx); return nil })
	g.Go(func() error {
		srv := ropts.Server(launchHandler(cps.cp, r))
		srv.ErrorLog = ts.httpErrorLog("http")
		return serveDraining(ctx, ts.httpListener(r.Listener(cps.httpLn, srv)), ropts.Serving(srv, ts.enabled()), r, time.Duration(rf.grace)*time.Second, log)
	})
	return g.Wait()
}

// launchHandler serves the admin routes of the control plane and everything
// else from the router, on one port.
func launchHandler(cp *controlplane.ControlPlane, r *router.Router) http.Handler {
	mux := http.NewServeMux()
	cp.AdminRoutes(mux)
	rh := r.Handler()
	mux.Handle("/", rh)
	// The proxied routes (no admin route among them) skip the mux's
	// matching, as the mux would route them.
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if router.Proxied(req) {
			rh.ServeHTTP(w, req)
			return
		}
		mux.ServeHTTP(w, req)
	})
}
