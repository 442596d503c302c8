package main

import (
	"context"
	"io"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/smg-project/smg/controlplane"
	"github.com/smg-project/smg/internal/cli"
)

func runControlPlane(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("controlplane", "The control plane: worker registry, admin API (gRPC and REST), load monitor,\noverload verdicts, and the watch stream that feeds routers.", stdout)
	var c common
	c.addFlags(fs, 30001)
	grpcPort := fs.Int("grpc-port", 30002, "gRPC port (WorkerService, WatchService, AgentService)")
	opts := controlplane.DefaultOptions()
	opts.AddFlags(fs)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	log, err := c.logger(stderr)
	if err != nil {
		return err
	}
	metrics := controlplane.NewMetricsRegistry()
	cp, err := controlplane.New(opts, log, metrics)
	if err != nil {
		return err
	}
	httpLn, err := listen(c.host, c.port)
	if err != nil {
		return err
	}
	grpcLn, err := listen(c.host, *grpcPort)
	if err != nil {
		httpLn.Close()
		return err
	}
	gs := newGRPCServer()
	cp.RegisterGRPC(gs)
	if err := cp.SubmitStatic(); err != nil {
		return err
	}
	log.Info("Control plane serving", "http", addrOf(httpLn), "grpc", addrOf(grpcLn))
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { cp.Run(ctx); return nil })
	g.Go(func() error { return serveHTTP(ctx, httpLn, cp.HTTPHandler(), 5*time.Second) })
	g.Go(func() error { return serveGRPC(ctx, grpcLn, gs, 5*time.Second) })
	return g.Wait()
}
