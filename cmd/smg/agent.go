package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/smg-project/smg/internal/promreg"

	"golang.org/x/sync/errgroup"

	"github.com/smg-project/smg/agent"
	"github.com/smg-project/smg/internal/cli"
	"github.com/smg-project/smg/internal/enginegrpc"
	"github.com/smg-project/smg/internal/tlsutil"
)

func runAgent(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("agent", "A per-node agent: polls the engines on its node over loopback and pushes their load,\n"+
		"contact, transport failures and engine silence to the control plane on one stream.\n"+
		"The stream is plaintext unless --controlplane-ca-file is set (TLS; mutual TLS with --controlplane-cert-file).", stdout)
	var c common
	c.addFlags(fs, 30003)
	opts := agent.DefaultOptions()
	host, _ := os.Hostname()
	var engines cli.List
	fs.StringVar(&opts.ControlPlane, "controlplane", opts.ControlPlane, "HOST:PORT of the control plane's gRPC port; the replicas of a replicated control plane comma-separated (the agent follows the leader)")
	fs.StringVar(&opts.Node, "node", host, "name of this node; the control plane assigns it the workers registered with this node")
	fs.Var(&engines, "engine-urls", "engines on this node, space-separated after one flag or repeated: http://, https://, grpc:// or grpcs:// URLs (e.g. http://127.0.0.1:8000)")
	fs.BoolVar(&opts.Register, "register", false, "register the --engine-urls engines (and, with --service-discovery, the engine pods on this node) with the control plane under this node's name")
	fs.DurationVar(&opts.PollInterval, "poll-interval", opts.PollInterval, "how often each engine is polled (Go duration; sub-second allowed, e.g. 250ms)")
	fs.IntVar(&opts.EngineReadBudgetMiB, "engine-read-budget-mib", opts.EngineReadBudgetMiB,
		"memory, in MiB, that the engine polls in flight may hold together (bytes read times 8, what parsing them holds); polls beyond it wait, logged and counted in smg_engine_read_budget_waits_total")
	fs.IntVar(&opts.GRPCEngineMaxMessageMiB, enginegrpc.MaxMessageFlag, opts.GRPCEngineMaxMessageMiB, enginegrpc.MaxMessageUsage)
	fs.DurationVar(&opts.HeartbeatInterval, "heartbeat-interval", opts.HeartbeatInterval,
		"longest quiet spell on the stream before a heartbeat (Go duration); keep well inside the control plane's --worker-stale-secs")
	fs.StringVar(&opts.Token, "token", "", "bearer token the control plane requires of agents, if any")
	var tf tlsFlags
	tf.addServer(fs)
	tf.addControlPlaneClient(fs)
	tf.addEngineClient(fs)
	opts.Discovery.AddFlags(fs)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	opts.EngineURLs = engines
	log, err := c.logger(stderr)
	if err != nil {
		return err
	}
	metrics := promreg.New()
	ts, err := tf.load(log, metrics)
	if err != nil {
		return err
	}
	opts.TransportCredentials = ts.controlPlaneCreds()
	if o := ts.engineTLS(); o != nil {
		opts.HTTPClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2, IdleConnTimeout: 90 * time.Second, DialTLSContext: o.DialTLS(nil)}}
		opts.GRPC.Creds = tlsutil.Credentials(*o) // grpcs:// engines, verified like https:// ones
	}
	a, err := agent.New(opts, log, metrics)
	if err != nil {
		return err
	}
	ln, err := listen(c.host, c.port)
	if err != nil {
		return err
	}
	log.Info("Agent starting", "node", opts.Node, "controlplane", opts.ControlPlane, "engines", len(opts.EngineURLs),
		"poll_interval", opts.PollInterval, "http", ln.Addr().String(), "tls", ts.enabled(), "controlplane_tls", ts.cpCAs != nil)
	ts.warnPlaintext("http", ln)
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return a.Run(ctx) })
	g.Go(func() error { ts.watch(ctx); return nil })
	g.Go(func() error {
		return serveHTTP(ctx, ts.httpListener(ln), agent.Handler(metrics), 5*time.Second, ts.httpErrorLog("http"))
	})
	return g.Wait()
}
