package controlplane_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/smg-project/smg/controlplane"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// BenchmarkStartOver: a control plane starting over a fleet of engines it
// probes and polls itself, every worker stored Ready (a restart with a
// durable registry, a leader taking over), at the default intervals,
// against one loopback engine standing in for all of them with both ends
// in this process, as in the scale harness. Over one load-monitor interval
// and a second it reports the most connections open to the engine at once,
// the most requests in flight at once, the most open files of the process,
// the engine's accept errors ("too many open files") and the probes that
// failed. SMG_STARTOVER_WORKERS sets the fleet (default 10,000). One
// iteration takes 11 s: run it with -benchtime 1x.
func BenchmarkStartOver(b *testing.B) {
	n := 10000
	if v := os.Getenv("SMG_STARTOVER_WORKERS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			b.Fatalf("SMG_STARTOVER_WORKERS=%q: want a positive integer", v)
		}
	}
	for range b.N {
		r := startOver(b, n)
		b.ReportMetric(float64(r.peakConns), "peak-conns")
		b.ReportMetric(float64(r.conns), "conns")
		b.ReportMetric(float64(r.peakInFlight), "peak-inflight")
		b.ReportMetric(float64(r.peakFDs), "peak-fds")
		b.ReportMetric(float64(r.acceptErrors), "accept-errors")
		b.ReportMetric(float64(r.failedProbes), "failed-probes")
		b.ReportMetric(float64(r.probes), "probes")
		b.ReportMetric(float64(r.polls), "polls")
		b.ReportMetric(0, "ns/op")
	}
}

type startOverResult struct {
	peakConns, peakInFlight, peakFDs int
	conns                            int
	acceptErrors, failedProbes       int
	probes, polls                    int64
}

// engineStub counts what the control plane asks of it.
type engineStub struct {
	mu                     sync.Mutex
	conns, peakConns       int
	dialed                 int
	inFlight, peakInFlight int
	probes, polls          atomic.Int64
	acceptErrors           atomic.Int64
}

func (e *engineStub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	e.inFlight++
	e.peakInFlight = max(e.peakInFlight, e.inFlight)
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.inFlight--
		e.mu.Unlock()
	}()
	switch {
	case strings.HasSuffix(r.URL.Path, "/health"):
		e.probes.Add(1)
	case strings.HasSuffix(r.URL.Path, "/metrics"):
		e.polls.Add(1)
		_, _ = w.Write([]byte("# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 1\n"))
	default:
		http.NotFound(w, r)
	}
}

func (e *engineStub) connState(_ net.Conn, s http.ConnState) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch s {
	case http.StateNew:
		e.dialed++
		e.conns++
		e.peakConns = max(e.peakConns, e.conns)
	case http.StateClosed, http.StateHijacked:
		e.conns--
	}
}

// Write counts the server's accept errors (its ErrorLog).
func (e *engineStub) Write(p []byte) (int, error) {
	if strings.Contains(string(p), "too many open files") {
		e.acceptErrors.Add(1)
	}
	return len(p), nil
}

func startOver(b *testing.B, n int) startOverResult {
	e := &engineStub{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: e, ConnState: e.connState, ErrorLog: log.New(e, "", 0)}
	go func() { _ = srv.Serve(lis) }()
	defer srv.Close()
	base := "http://" + lis.Addr().String()

	opts := controlplane.DefaultOptions()
	cp, err := controlplane.New(opts, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	th := opts.Thresholds.Resolve(nil)
	if _, err := cp.Registry.Update(func(tx *registry.Txn) error {
		for w := range n {
			id := fmt.Sprintf("w%05d", w)
			tx.Insert(&registry.Worker{Registered: registry.Registered{ID: id, Spec: &smgv1.WorkerSpec{Url: base + "/" + id}, Model: "m", Type: "regular", Thresholds: th}, State: registry.State{Health: registry.HealthHealthy}})
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(b.Context(), time.Duration(opts.LoadMonitorInterval)*time.Second+time.Second)
	defer cancel()
	var peakFDs atomic.Int64
	sampled := make(chan struct{})
	go func() { // the process's open files, every 10 ms
		defer close(sampled)
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			if fds, err := os.ReadDir("/proc/self/fd"); err == nil && int64(len(fds)) > peakFDs.Load() {
				peakFDs.Store(int64(len(fds)))
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	_ = cp.Run(ctx)
	<-sampled

	failed := 0
	for _, w := range cp.Registry.Snapshot().Workers() {
		if w.Evidence.ProbeFailures > 0 || w.Health != registry.HealthHealthy {
			failed++
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return startOverResult{peakConns: e.peakConns, peakInFlight: e.peakInFlight, peakFDs: int(peakFDs.Load()), conns: e.dialed,
		acceptErrors: int(e.acceptErrors.Load()), failedProbes: failed, probes: e.probes.Load(), polls: e.polls.Load()}
}
