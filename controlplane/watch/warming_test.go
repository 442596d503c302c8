package watch

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// fakeClock is a settable clock for Options.Now.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// A control plane warming up says so in every snapshot, in whole seconds
// left (rounded up), and stops saying it once WarmUntil has passed, even to a
// router asking for the snapshot of the same revision (the shared frame of
// the warming snapshot is not reused). Without WarmUntil it never warms.
func TestSnapshotsSayHowLongTheRegistryWarmsUp(t *testing.T) {
	reg := registry.New(testEpoch, 0)
	put(t, reg, newWorker("w1"))
	clock := &fakeClock{now: time.Unix(1000, 0)}
	h := start(t, reg, Options{HeartbeatInterval: time.Hour, Now: clock.Now, WarmUntil: clock.Now().Add(2500 * time.Millisecond)})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	snapshot := func(router string) *smgv1.WatchSnapshot {
		t.Helper()
		m := recv(t, h.watch(t, ctx, &smgv1.WatchHello{RouterId: router}))
		if m.GetSnapshot() == nil || m.Revision != reg.Revision() {
			t.Fatalf("%s: first message %v, want the snapshot", router, m)
		}
		return m.GetSnapshot()
	}
	if s := snapshot("r1"); s.GetWarmingSecs() != 3 || ids(s.GetWorkers()) != "w1" {
		t.Fatalf("at start: warming_secs %d workers %s, want 3 (2.5 s rounded up) and w1", s.GetWarmingSecs(), ids(s.GetWorkers()))
	}
	clock.add(time.Second)
	if s := snapshot("r2"); s.GetWarmingSecs() != 2 {
		t.Fatalf("1 s in: warming_secs %d, want 2", s.GetWarmingSecs())
	}
	clock.add(1500 * time.Millisecond)
	if s := snapshot("r3"); s.GetWarmingSecs() != 0 {
		t.Fatalf("at WarmUntil: warming_secs %d, want 0 (complete)", s.GetWarmingSecs())
	}

	cold := start(t, reg, Options{HeartbeatInterval: time.Hour, Now: clock.Now})
	m := recv(t, cold.watch(t, ctx, &smgv1.WatchHello{RouterId: "r4"}))
	if m.GetSnapshot().GetWarmingSecs() != 0 {
		t.Fatalf("without WarmUntil: warming_secs %d, want 0", m.GetSnapshot().GetWarmingSecs())
	}
}
