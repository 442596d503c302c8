package watch

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/smg-project/smg/controlplane/judge"
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
	round, _ := benchWatchers(b, reg, routers)
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

// BenchmarkPassPromptParts is a change of 100 workers (a load tick) passed
// to 1,000 routers, the workers with prompt tokens ahead, each router's part
// of them different and a report of each router's folded since the last
// change (parts=true: the shared message plus an ack per router), or
// without any (parts=false: the shared message alone). One op is one change.
func BenchmarkPassPromptParts(b *testing.B) {
	const routers, changed = 1000, 100
	for _, parts := range []bool{false, true} {
		b.Run(fmt.Sprint("parts=", parts), func(b *testing.B) {
			reg := joinFleet(b, 1000)
			round, recs := benchWatchers(b, reg, routers)
			round()
			views := map[string]judge.RouterObservation{}
			for r := range routers {
				views[fmt.Sprintf("router-%04d", r)] = judge.RouterObservation{PrefillTokens: int64(r)}
			}
			b.ResetTimer()
			for i := range b.N {
				ws := make([]*registry.Worker, changed)
				for j := range ws {
					w := *reg.Snapshot().Get(fmt.Sprintf("w%05d", j))
					w.Health = []registry.Health{registry.HealthUnhealthy, registry.HealthHealthy}[i%2]
					if parts {
						w.Evidence.Routers = views
						w.Evidence.Live.Routers(time.Time{}, judge.RouterObservation{PrefillTokens: 1 << 20}, &judge.Rules{})
					}
					ws[j] = &w
				}
				rev := put(b, reg, ws...)
				if parts {
					for _, r := range recs {
						r.folded(uint64(i+1), rev)
					}
				}
				round()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1e6, "ms/change")
		})
	}
}

// benchWatchers opens n routers' watchers on reg (their streams discard what
// is sent) and returns a pass over all of them, as a shared writer runs it,
// and the routers' records.
func benchWatchers(b *testing.B, reg *registry.Registry, n int) (func(), []*routerRecord) {
	s := NewServer(reg, Options{HeartbeatInterval: time.Hour}, nil, nil)
	ws := make([]*watcher, n)
	recs := make([]*routerRecord, n)
	for i := range ws {
		recs[i] = &routerRecord{id: fmt.Sprintf("router-%04d", i)}
		ws[i] = s.newWatcher(&discardStream{ctx: b.Context()}, recs[i], &smgv1.WatchHello{})
	}
	return func() {
		now := time.Now()
		for _, w := range ws {
			w.mu.Lock()
			if _, err := w.pass(now); err != nil {
				b.Fatal(err)
			}
			w.mu.Unlock()
		}
	}, recs
}
