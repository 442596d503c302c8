package monitor_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/smg-project/smg/controlplane/evidence"
	"github.com/smg-project/smg/controlplane/health"
	"github.com/smg-project/smg/controlplane/monitor"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// An engine that requires its api_key answers polls and probes only with it:
// a worker registered with the key is probed into Ready and reports load.
func TestPollsAndProbesSendTheWorkersAPIKey(t *testing.T) {
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer engine-key" {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		switch r.URL.Path {
		case "/health":
			w.WriteHeader(http.StatusOK)
		case "/metrics":
			_, _ = w.Write([]byte("# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 3\n"))
		default:
			http.NotFound(w, r)
		}
	}))
	defer engine.Close()

	reg := registry.New("e", 0)
	if _, err := reg.Update(func(tx *registry.Txn) error {
		tx.Insert(&registry.Worker{Registered: registry.Registered{ID: "w1", Model: "m", Type: "regular", Spec: &smgv1.WorkerSpec{Url: engine.URL, ApiKey: "engine-key"}}, State: registry.State{Health: registry.HealthPending}})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	hopts := health.DefaultOptions()
	hopts.SuccessThreshold = 1
	hopts.StartupInterval = 20 * time.Millisecond
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	done := make(chan struct{}, 2)
	go func() { health.New(reg, hopts, engine.Client(), nil, log).Run(ctx); done <- struct{}{} }()
	go func() {
		monitor.New(reg, evidence.New(reg, evidence.Options{}, log, prometheus.NewRegistry()), engine.Client(), monitor.Options{Interval: time.Second}, log).Run(ctx)
		done <- struct{}{}
	}()
	defer func() { cancel(); <-done; <-done }()
	for {
		changed := reg.Changed()
		if w := reg.Get("w1"); w.Ready() && w.Load.GetWaitingRequests() == 3 {
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			w := reg.Get("w1")
			t.Fatalf("health %s, load %v: the api_key was not sent", w.Health, w.Load)
		}
	}
}
