package watch

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/router"
	"github.com/smg-project/smg/router/watchclient"
)

// fanout counts routers that have applied the revision being waited for.
type fanout struct {
	want    atomic.Uint64
	pending atomic.Int64
	done    chan struct{}
}

// benchTarget is a router that only records the revision it applied.
type benchTarget struct {
	f    *fanout
	last atomic.Uint64
}

func (t *benchTarget) Apply(s *router.Snapshot) {
	old := t.last.Swap(s.Revision)
	if w := t.f.want.Load(); old < w && s.Revision >= w && t.f.pending.Add(-1) == 0 {
		t.f.done <- struct{}{}
	}
}
func (t *benchTarget) FailOpen()                         {}
func (t *benchTarget) ContactSeen(string)                {}
func (t *benchTarget) Observations() router.Observations { return router.Observations{} }

// BenchmarkVerdictFanout100 measures, per verdict change committed to the
// registry, the time until all 100 routers watching over loopback gRPC (one
// connection each, the real watch client) have applied it: with the shared
// encoding and the shared writers, with each stream its own writer, and with
// the per-stream baseline side by side.
func BenchmarkVerdictFanout100(b *testing.B) {
	b.Run("shared", func(b *testing.B) { benchFanout(b, Options{}) })
	// Shared frames, every stream written by its own goroutine (the
	// design before the shared writers).
	b.Run("own-goroutines", func(b *testing.B) { benchFanout(b, Options{Writers: -1}) })
	b.Run("per-stream", func(b *testing.B) { benchFanout(b, Options{EncodePerStream: true}) })
}

func benchFanout(b *testing.B, opts Options) {
	const routers, workers = 100, 100
	reg := registry.New("bench", 0)
	var ws []*registry.Worker
	for i := range workers {
		ws = append(ws, newWorker(fmt.Sprintf("w%03d", i)))
	}
	put(b, reg, ws...)

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := NewServer(reg, opts, nil, nil)
	gs := grpc.NewServer()
	smgv1.RegisterWatchServiceServer(gs, srv)
	go gs.Serve(lis)
	defer gs.Stop()
	defer srv.Close()

	f := &fanout{done: make(chan struct{}, 1)}
	f.want.Store(reg.Revision())
	f.pending.Store(routers)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for i := range routers {
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		c := watchclient.New(conn, &benchTarget{f: f}, watchclient.Options{RouterID: fmt.Sprint("r", i)}, nil)
		wg.Go(func() { c.Run(ctx) })
	}
	<-f.done // every router holds the initial snapshot

	var lat []time.Duration
	cpu0 := cpuTime()
	for i := 0; b.Loop(); i++ {
		f.want.Store(reg.Revision() + 1) // this goroutine is the only writer
		f.pending.Store(routers)
		start := time.Now()
		setOverloaded(b, reg, ws[i%workers].ID, (i/workers)%2 == 0)
		<-f.done
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	// CPU per change (control plane and all 100 routers, this process):
	// the figure that does not depend on what else the machine runs.
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(time.Millisecond)/float64(len(lat)), "cpu-ms/change")
	slices.Sort(lat)
	pct := func(p float64) float64 {
		return float64(lat[int(p*float64(len(lat)-1))]) / float64(time.Millisecond)
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(float64(lat[len(lat)-1])/float64(time.Millisecond), "max-ms")
}

// cpuPerOp reports, when the returned func runs, the process's CPU time
// per op (what other jobs on the machine cannot inflate, unlike ns/op).
func cpuPerOp(b *testing.B) func() {
	cpu0 := cpuTime()
	return func() {
		b.ReportMetric(float64(cpuTime()-cpu0)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
	}
}

// cpuTime is the process's user plus system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// joinFleet is a registry of n workers shaped like the scale harness's
// (URLs, model, thresholds, a load each).
func joinFleet(b *testing.B, n int) *registry.Registry {
	reg := registry.New("bench", 0)
	ws := make([]*registry.Worker, n)
	for i := range ws {
		w := newWorker(fmt.Sprintf("w%05d", i))
		w.Spec.Url = fmt.Sprintf("http://127.0.0.1:34567/w%05d", i)
		w.Model = "scale-model"
		w.Load = &smgv1.EngineLoad{WaitingRequests: int32(i % 3), RunningRequests: 8 + int32(i%8), TokenUsage: 0.1 + float64(i%40)/100}
		w.LoadRevision = uint64(i)
		ws[i] = w
	}
	put(b, reg, ws...)
	return reg
}

// BenchmarkJoin10k is a router joining a 10,000-worker registry, in parts.
// The control plane's side, once per revision and shared by every joiner:
// cp-snapshot writes the snapshot's bytes at a new revision (every worker
// encoded, in a pooled buffer, as a frame does). Then the router's decode of
// the bytes, and a join end to end over loopback gRPC (dial, hello,
// snapshot decoded) at a revision whose frame is already encoded.
func BenchmarkJoin10k(b *testing.B) {
	const n = 10000
	reg := joinFleet(b, n)
	srv := NewServer(reg, Options{}, nil, nil)
	snapAt := func() (baseKey, *registry.Snapshot) {
		snap := reg.Snapshot()
		return baseKey{reg.Epoch(), kindSnapshot, 0, snap.Revision}, snap
	}
	k1, snap1 := snapAt()
	setOverloaded(b, reg, "w00042", true)
	k2, snap2 := snapAt()
	raw := srv.appendResponse(nil, k2, srv.snapshotBase(k2, snap2), "r", 0)
	b.Run("cp-snapshot", func(b *testing.B) {
		b.ReportAllocs()
		defer cpuPerOp(b)()
		for i := 0; b.Loop(); i++ {
			k, snap := k1, snap1
			if i%2 == 1 {
				k, snap = k2, snap2
			}
			bs := &base{}
			bs.list(snap.Workers())
			buf := srv.frames.bufs.get(bs.sizeHint())
			srv.frames.bufs.put(buf, srv.appendResponse(*buf, k, bs, "r", 0))
		}
		b.ReportMetric(float64(len(raw))/1024, "KiB")
	})
	b.Run("router-decode", func(b *testing.B) {
		defer cpuPerOp(b)()
		for b.Loop() {
			var m smgv1.WatchResponse
			if err := proto.Unmarshal(raw, &m); err != nil || len(m.GetSnapshot().GetWorkers()) != n {
				b.Fatal(err)
			}
		}
	})
	join := func(b *testing.B) {
		h := start(b, reg, Options{})
		for b.Loop() {
			ctx, cancel := context.WithCancel(context.Background())
			st := h.watch(b, ctx, &smgv1.WatchHello{RouterId: "joiner"})
			if m := recv(b, st); len(m.GetSnapshot().GetWorkers()) != n {
				b.Fatalf("first message %v: want the snapshot", m.GetMsg())
			}
			cancel()
		}
	}
	b.Run("join-grpc", func(b *testing.B) { join(b) })
}
