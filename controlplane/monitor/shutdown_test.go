package monitor_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/smg-project/smg/controlplane/evidence"
	"github.com/smg-project/smg/controlplane/monitor"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// stuckTransport holds every request until released, whatever its context
// says: a poll that takes its time to end.
type stuckTransport struct {
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (s *stuckTransport) RoundTrip(*http.Request) (*http.Response, error) {
	s.once.Do(func() { close(s.entered) })
	<-s.release
	return nil, errors.New("released")
}

// TestRunWaitsForItsPolls: Run returns only once every poll it started has
// ended, so nothing polls or ingests after the control plane stopped.
func TestRunWaitsForItsPolls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := registry.New("e", 0)
		if _, err := reg.Update(func(tx *registry.Txn) error {
			tx.Insert(&registry.Worker{Registered: registry.Registered{ID: "w1", Model: "m", Type: "regular", Spec: &smgv1.WorkerSpec{Url: "http://engine"}}, State: registry.State{Health: registry.HealthHealthy}})
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		log := slog.New(slog.DiscardHandler)
		tr := &stuckTransport{entered: make(chan struct{}), release: make(chan struct{})}
		m := monitor.New(reg, evidence.New(reg, evidence.Options{}, log, prometheus.NewRegistry()), &http.Client{Transport: tr},
			monitor.Options{Interval: time.Second}, log)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { m.Run(ctx); close(done) }()
		<-tr.entered // a poll is in flight
		cancel()
		synctest.Wait()
		select {
		case <-done:
			t.Fatal("Run returned while a poll it started was still running")
		default:
		}
		close(tr.release)
		<-done
	})
}
