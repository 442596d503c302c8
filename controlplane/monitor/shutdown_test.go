package monitor_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
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

// newMonitor is a monitor polling one Ready worker every second through tr.
func newMonitor(t *testing.T, tr http.RoundTripper) *monitor.Monitor {
	reg := registry.New("e", 0)
	if _, err := reg.Update(func(tx *registry.Txn) error {
		tx.Insert(&registry.Worker{Registered: registry.Registered{ID: "w1", Model: "m", Type: "regular", Spec: &smgv1.WorkerSpec{Url: "http://engine"}}, State: registry.State{Health: registry.HealthHealthy}})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	return monitor.New(reg, evidence.New(reg, evidence.Options{}, log, prometheus.NewRegistry()), &http.Client{Transport: tr},
		monitor.Options{Interval: time.Second}, log)
}

// TestRunWaitsForItsPolls: Run returns only once every poll it started has
// ended, so nothing polls or ingests after the control plane stopped.
func TestRunWaitsForItsPolls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &stuckTransport{entered: make(chan struct{}), release: make(chan struct{})}
		m := newMonitor(t, tr)
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

// countingTransport answers nothing and counts the requests.
type countingTransport struct{ n atomic.Int32 }

func (c *countingTransport) RoundTrip(*http.Request) (*http.Response, error) {
	c.n.Add(1)
	return nil, errors.New("no engine")
}

// TestRunPollsAgainInALaterTerm: a leader's monitor runs once per term; a
// replica elected again polls as it did in its first term.
func TestRunPollsAgainInALaterTerm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &countingTransport{}
		m := newMonitor(t, tr)
		for term := 1; term <= 2; term++ {
			before := tr.n.Load()
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan struct{})
			go func() { m.Run(ctx); close(done) }()
			time.Sleep(3 * time.Second) // synctest's clock: three intervals
			cancel()
			<-done
			if tr.n.Load() == before {
				t.Fatalf("term %d: no poll in three intervals", term)
			}
		}
	})
}
