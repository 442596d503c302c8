package controlplane_test

import (
	"context"
	"testing"
	"time"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// The control plane sends routers the settings they must share with it
// (its --load-monitor-interval and --worker-stale-secs) with every snapshot.
func TestWatchSnapshotCarriesTheControlPlaneSettings(t *testing.T) {
	opts := fastOptions()
	opts.LoadMonitorInterval = 3
	opts.Liveness.StaleSecs = 9
	h := startCP(t, opts)
	got := h.firstSnapshot(t).GetSettings()
	if got.GetLoadMonitorIntervalSecs() != 3 || got.GetWorkerStaleSecs() != 9 {
		t.Fatalf("snapshot settings = %v, want load_monitor_interval_secs 3 and worker_stale_secs 9", got)
	}
}

// firstSnapshot opens a watch as router r1 and returns the snapshot it is
// sent first.
func (h *harness) firstSnapshot(t *testing.T) *smgv1.WatchSnapshot {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := smgv1.NewWatchServiceClient(h.conn).Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&smgv1.WatchRequest{Msg: &smgv1.WatchRequest_Hello{Hello: &smgv1.WatchHello{RouterId: "r1"}}}); err != nil {
		t.Fatal(err)
	}
	msg, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	return msg.GetSnapshot()
}
