package monitor_test

import (
	"context"
	"io"
	"log/slog"
	"net"
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
	"github.com/smg-project/smg/internal/engine"
)

// TestPollTimesOutAfterFiveSeconds: an engine that accepts the connection and
// never answers costs one poll 5 s (the spec's HTTP load request timeout), and
// the poll without a report clears the veto (fail open). The engine is an
// in-memory pipe inside a synctest bubble, so the 5 s pass on the fake clock.
func TestPollTimesOutAfterFiveSeconds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := slog.New(slog.DiscardHandler)
		reg := registry.New("e", 0)
		if _, err := reg.Update(func(tx *registry.Txn) error {
			tx.Insert(&registry.Worker{Registered: registry.Registered{ID: "w1", Spec: &smgv1.WorkerSpec{Url: "http://engine"}}, State: registry.State{Health: registry.HealthHealthy, Overloaded: true, OverloadReason: "waiting_requests 9 >= 8"}})
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var servers []net.Conn
		tr := &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) {
			client, server := net.Pipe()
			mu.Lock()
			servers = append(servers, server)
			mu.Unlock()
			go func() { _, _ = io.Copy(io.Discard, server) }() // read the request, never answer
			return client, nil
		}}
		client := &http.Client{Transport: tr}
		m := monitor.New(reg, evidence.New(reg, evidence.Options{}, log, prometheus.NewRegistry()), client, monitor.Options{Interval: time.Second}, log)

		start := time.Now()
		m.PollOnce(context.Background(), "w1", engine.NewReader(client, "http://engine"))
		if elapsed := time.Since(start); elapsed != 5*time.Second {
			t.Fatalf("the poll took %s, want 5s", elapsed)
		}
		if reg.Snapshot().Get("w1").Overloaded {
			t.Fatal("a timed-out poll must clear the veto")
		}
		tr.CloseIdleConnections()
		mu.Lock()
		for _, c := range servers {
			c.Close()
		}
		mu.Unlock()
	})
}
