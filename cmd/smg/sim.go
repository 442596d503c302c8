package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/smg-project/smg/internal/tlsutil"

	"github.com/smg-project/smg/internal/cli"
	"github.com/smg-project/smg/sim"
)

const simSummary = `Run simulated LLM inference engines (vLLM or SGLang flavor) that queue, batch and
fail like real ones. Engine i of --count N listens on --port+i (and, with --grpc-port, serves
SMG's gRPC engine protocol on --grpc-port+i); each prints its URL (then its gRPC URL) on start.
Faults switch at run time with POST /sim/fault (see docs/sim.md).`

// runSim serves simulated engines until ctx is cancelled.
func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("sim", simSummary, stderr)
	opts := sim.DefaultOptions()
	opts.AddFlags(fs)
	var tf tlsFlags
	tf.addServer(fs)
	host := fs.String("host", "127.0.0.1", "address the engines listen on")
	port := fs.Int("port", 8000, "port of the first engine; engine i listens on port+i (0 picks free ports)")
	count := fs.Int("count", 1, "number of independent engines in this process")
	controlPort := fs.Int("control-port", -1, "port of a control listener serving /sim/fault for every engine, reachable whatever the faults (-1 = none, 0 = a free port)")
	var faultEngines cli.List
	fs.Var(&faultEngines, "fault-engines", "engine `indexes` the --fault-* flags apply to, space separated (default: all)")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	if tf.certFile != "" || tf.keyFile != "" {
		ts, err := tf.load(log, prometheus.NewRegistry())
		if err != nil {
			return err
		}
		opts.TLS = tlsutil.ServerConfig(ts.server, nil, "http/1.1")
		go ts.watch(ctx)
	}
	if *count < 1 {
		return fmt.Errorf("--count must be >= 1, got %d", *count)
	}
	startFault := opts.Fault
	scoped := len(faultEngines) > 0
	if scoped {
		opts.Fault = sim.Fault{}
	}
	fleet, err := sim.StartFleet(*host, *port, *count, opts, log)
	if err != nil {
		return err
	}
	defer func() {
		for _, s := range fleet {
			s.Close()
		}
	}()
	for _, v := range faultEngines {
		i, err := strconv.Atoi(v)
		if err != nil || i < 0 || i >= len(fleet) {
			return fmt.Errorf("--fault-engines: %q is not an engine index (0..%d)", v, len(fleet)-1)
		}
		if err := fleet[i].SetFault(startFault); err != nil {
			return err
		}
	}
	if *controlPort >= 0 {
		ln, err := net.Listen("tcp", net.JoinHostPort(*host, strconv.Itoa(*controlPort)))
		if err != nil {
			return fmt.Errorf("control listener: %w", err)
		}
		ctl := &http.Server{Handler: sim.ControlHandler(fleet), ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := ctl.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("control listener", "err", err)
			}
		}()
		defer ctl.Close()
		log.Info("control listener", "url", "http://"+ln.Addr().String()+"/sim/fault")
	}
	for _, s := range fleet {
		if g := s.GRPCURL(); g != "" {
			fmt.Fprintln(stdout, s.URL(), g)
			continue
		}
		fmt.Fprintln(stdout, s.URL())
	}
	<-ctx.Done()
	return nil
}
