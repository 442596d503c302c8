package controlplane_test

import (
	"testing"
	"time"
)

// An in-memory control plane starts empty: for --worker-stale-secs its
// snapshots tell routers the registry is still refilling (they keep the
// workers of the epoch they held); with the stale rule off, never.
func TestInMemoryControlPlaneWarmsUpForTheStaleBound(t *testing.T) {
	for stale, want := range map[int]int32{15: 15, 0: 0} {
		opts := fastOptions()
		opts.Liveness.StaleSecs = stale
		start := time.Unix(5000, 0)
		opts.Now = func() time.Time { return start } // the clock stands still: exactly the bound is left
		if got := startCP(t, opts).firstSnapshot(t).GetWarmingSecs(); got != want {
			t.Errorf("--worker-stale-secs %d: warming_secs %d, want %d", stale, got, want)
		}
	}
}
