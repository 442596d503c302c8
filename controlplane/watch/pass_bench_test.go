package watch

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// discardStream takes every message and drops it: the pass's own cost, with
// no transport under it.
type discardStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (d *discardStream) Context() context.Context { return d.ctx }
func (d *discardStream) SendMsg(any) error        { return nil }

// BenchmarkPass1000 is what a routing change costs the watch server's own
// code per stream at 1,000 routers, as a shared writer runs it: one commit,
// then a pass over every stream (the frame is built once, gRPC's SendMsg is
// left out). One op is one change; ns/stream is per router per change.
func BenchmarkPass1000(b *testing.B) {
	const routers = 1000
	reg := joinFleet(b, 1000)
	s := NewServer(reg, Options{HeartbeatInterval: time.Hour}, nil, nil)
	ws := make([]*watcher, routers)
	for i := range ws {
		rec := &routerRecord{id: fmt.Sprintf("router-%04d", i)}
		ws[i] = s.newWatcher(&discardStream{ctx: b.Context()}, rec, &smgv1.WatchHello{})
	}
	round := func() {
		now := time.Now()
		for _, w := range ws {
			w.mu.Lock()
			if _, err := w.pass(now); err != nil {
				b.Fatal(err)
			}
			w.mu.Unlock()
		}
	}
	round() // the snapshots
	flip := reg.Snapshot().Get("w00000")
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		w := *flip
		w.Health = []registry.Health{registry.HealthUnhealthy, registry.HealthHealthy}[i%2]
		put(b, reg, &w)
		round()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/routers, "ns/stream")
}
