package scale

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/smg-project/smg/controlplane"
	"github.com/smg-project/smg/controlplane/registry"
	"github.com/smg-project/smg/controlplane/watch"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// The floor (Config.Floor): what sending a verdict to R routers costs
// before anything of ours. A bare WatchService on a grpc.Server with the
// control plane's transport options (controlplane.TransportOptions): each
// change is one delta, built and marshalled once (grpc.PreparedMsg) and
// written to every stream by that stream's own goroutine, woken by the
// change, as the control plane's streams are (a slow router must not hold
// the others, so no goroutine writes to two streams). Its routers are the
// harness's synthetic routers, the same processes and protocol (hello, an
// ack and an observation report every 250 ms, read and dropped here). It
// keeps every change in order, so a stream behind sends each it missed.

// floorServer is the floor's WatchService.
type floorServer struct {
	smgv1.UnimplementedWatchServiceServer
	sent func(routerID string, rev uint64)

	mu      sync.Mutex
	frames  []*floorFrame // revision n's delta at n-1
	changed chan struct{} // closed at the next change

	streams atomic.Int64 // streams watching
	sends   atomic.Int64 // messages sent

	// oneWriter: write writes every change to every stream (the streams'
	// goroutines only wait); kick wakes it.
	oneWriter bool
	kick      chan struct{}
	watching  []*floorStream // under mu
}

// floorStream is a stream written by the one writer.
type floorStream struct {
	id     string
	stream grpc.ServerStream
	last   uint64 // revision sent (the writer's alone)
	gone   atomic.Bool
}

// floorFrame is one change's delta, encoded by the first stream to send it.
type floorFrame struct {
	once sync.Once
	msg  *smgv1.WatchResponse
	prep *grpc.PreparedMsg
	err  error
}

func newFloorServer(sent func(string, uint64), oneWriter bool) *floorServer {
	return &floorServer{sent: sent, changed: make(chan struct{}), oneWriter: oneWriter, kick: make(chan struct{}, 1)}
}

// write is the one writer: at each change, every stream in turn is sent
// what it lacks.
func (f *floorServer) write(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.kick:
		}
		f.mu.Lock()
		streams := slices.Clone(f.watching)
		f.mu.Unlock()
		cur, _ := f.current()
		for _, st := range streams {
			for ; !st.gone.Load() && st.last < cur; st.last++ {
				if f.send(st.stream, st.id, st.last+1) != nil {
					break
				}
			}
		}
	}
}

// send writes revision rev's delta to stream, encoding it if no stream has.
func (f *floorServer) send(stream grpc.ServerStream, id string, rev uint64) error {
	fr := f.frame(rev)
	fr.once.Do(func() {
		fr.prep = &grpc.PreparedMsg{}
		fr.err = fr.prep.Encode(stream, fr.msg)
	})
	if fr.err != nil {
		return fr.err
	}
	if err := stream.SendMsg(fr.prep); err != nil {
		return err
	}
	f.sends.Add(1)
	if f.sent != nil {
		f.sent(id, rev)
	}
	return nil
}

// floorEpoch is the epoch of the floor's messages.
const floorEpoch = "floor"

// change publishes worker w's verdict (overloaded or not) as the next
// revision, and returns it.
func (f *floorServer) change(w int, overloaded bool) uint64 {
	rw := floorWorker(w, overloaded)
	f.mu.Lock()
	defer f.mu.Unlock()
	rev := uint64(len(f.frames)) + 1
	f.frames = append(f.frames, &floorFrame{msg: &smgv1.WatchResponse{Epoch: floorEpoch, Revision: rev,
		Msg: &smgv1.WatchResponse_Delta{Delta: &smgv1.WatchDelta{Upserts: []*smgv1.RoutingWorker{rw}}}}})
	close(f.changed)
	f.changed = make(chan struct{})
	select {
	case f.kick <- struct{}{}:
	default: // the writer will see this change too
	}
	return rev
}

// floorWorker is worker w as a verdict flip's delta carries it from the
// control plane in the fan-out runs (same conversion, same fields set).
func floorWorker(w int, overloaded bool) *smgv1.RoutingWorker {
	rec := &registry.Worker{Registered: registry.Registered{ID: workerID(w), Spec: &smgv1.WorkerSpec{Url: workerURL("http://127.0.0.1:40000", w)}, Model: "scale-model", Type: "regular"}, State: registry.State{Health: registry.HealthHealthy, LoadRevision: 12345, ContactSeq: 1}}
	if overloaded {
		rec.Overloaded, rec.OverloadReason = true, "waiting_requests 42 > 32"
	}
	rw := watch.RoutingWorker(rec, "")
	rw.WaitingRequests, rw.RunningRequests, rw.TokenUsage = 42, 12, 0.3
	return rw
}

// current is the revision published and the channel closed at the next.
func (f *floorServer) current() (uint64, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return uint64(len(f.frames)), f.changed
}

func (f *floorServer) frame(rev uint64) *floorFrame {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.frames[rev-1]
}

// Watch serves one synthetic router from the revision current when it
// joined: every change after it, in order.
func (f *floorServer) Watch(stream grpc.BidiStreamingServer[smgv1.WatchRequest, smgv1.WatchResponse]) error {
	hello, err := stream.Recv()
	if err != nil {
		return err
	}
	id := hello.GetHello().GetRouterId()
	f.streams.Add(1)
	defer f.streams.Add(-1)
	recvErr := make(chan error, 1)
	go func() {
		for {
			if _, err := stream.Recv(); err != nil {
				recvErr <- err
				return
			}
		}
	}()
	last, changed := f.current()
	if f.oneWriter {
		st := &floorStream{id: id, stream: stream, last: last}
		f.mu.Lock()
		f.watching = append(f.watching, st)
		f.mu.Unlock()
		defer st.gone.Store(true)
		changed = nil // the writer sends; this goroutine waits for the end
	}
	for {
		select {
		case <-changed:
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-stream.Context().Done():
			return stream.Context().Err()
		}
		var cur uint64
		cur, changed = f.current()
		for ; last < cur; last++ {
			if err := f.send(stream, id, last+1); err != nil {
				return err
			}
		}
	}
}

// runFloor runs cfg as the floor: R synthetic routers in child processes
// watching a floorServer that flips verdicts at cfg.FlipRate, with the
// quiet window and the window measured as the control plane's are.
func runFloor(ctx context.Context, cfg Config) (*Result, error) {
	logw := cfg.Log
	cfg.Joins = 0 // the floor has no snapshot to join with
	sends := newSendLog()
	fs := newFloorServer(sends.sent, cfg.FloorOneWriter)
	writeCtx, stopWriter := context.WithCancel(ctx)
	defer stopWriter()
	if cfg.FloorOneWriter {
		go fs.write(writeCtx)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	gs := grpc.NewServer(controlplane.TransportOptions()...)
	smgv1.RegisterWatchServiceServer(gs, fs)
	go gs.Serve(lis)
	defer gs.Stop()

	fmt.Fprintf(logw, "scale %s: the floor: %d routers in %d processes, %g changes/s; window %s\n",
		cfg.Name, cfg.Routers, cfg.RouterProcs, cfg.FlipRate, cfg.Duration)
	children, err := startChildren(cfg, routerSpecs(cfg, lis.Addr().String()))
	if err != nil {
		return nil, err
	}
	settled := time.Now()
	for fs.streams.Load() < int64(cfg.Routers) {
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return nil, errors.Join(ctx.Err(), children.wait())
		}
		if time.Since(settled) > 2*time.Minute {
			return nil, errors.Join(fmt.Errorf("scale: %d of %d routers watching the floor after 2 minutes", fs.streams.Load(), cfg.Routers), children.wait())
		}
	}
	quiet, start, end := cfg.windows(time.Now())
	if err := children.window(quiet, start, end); err != nil {
		return nil, errors.Join(err, children.wait())
	}

	// Changes at FlipRate, but in the quiet window; each worker in turn.
	var mu sync.Mutex
	committed := map[string]int64{} // by flipKey
	var inWindow []string           // flip keys committed in the window
	flipCtx, stopFlips := context.WithCancel(ctx)
	var flipping sync.WaitGroup
	if cfg.FlipRate > 0 {
		flipping.Go(func() {
			t := time.NewTicker(time.Duration(float64(time.Second) / cfg.FlipRate))
			defer t.Stop()
			on := make([]bool, cfg.Workers)
			flips := make([]int, cfg.Workers)
			next := 0
			for {
				select {
				case <-flipCtx.Done():
					return
				case <-t.C:
					now := time.Now() // not the tick's: a starved process reads it late
					if now.After(end) {
						return
					}
					if n := now.UnixNano(); n >= quiet.UnixNano() && n < start.UnixNano() {
						continue
					}
				}
				w := next
				next = (next + 1) % cfg.Workers
				on[w] = !on[w]
				flips[w]++
				fs.change(w, on[w])
				at := time.Now()
				mu.Lock()
				committed[flipKey(w, flips[w])] = at.UnixNano()
				if !at.Before(start) && at.Before(end) {
					inWindow = append(inWindow, flipKey(w, flips[w]))
				}
				mu.Unlock()
			}
		})
	}
	defer func() { stopFlips(); flipping.Wait() }()

	measure := func(at time.Time) (phase, error) {
		select {
		case <-time.After(time.Until(at)):
		case <-ctx.Done():
			return phase{}, errors.Join(ctx.Err(), children.wait())
		}
		rev, _ := fs.current()
		return sample(rev, float64(fs.sends.Load())), nil
	}
	q0, err := measure(quiet)
	if err != nil {
		return nil, err
	}
	w0, err := measure(start)
	if err != nil {
		return nil, err
	}
	sends.on.Store(true)
	w1, err := measure(end)
	if err != nil {
		return nil, err
	}
	results, cerr := children.results()
	sends.on.Store(false)
	wall := end.Sub(start)
	res := &Result{Config: cfg, Errors: cerr, LoadAvg: loadAvg(), RSSMiB: rssMiB()}
	win := since(w0, w1, wall)
	res.CPUCores = win.cpu.Seconds() / wall.Seconds()
	res.Revisions, res.Sent, res.Encoded = win.revs, win.sent, float64(win.revs)
	if res.Sent > 0 {
		res.CPUPerSentUs = win.cpu.Seconds() * 1e6 / res.Sent
	}
	if cfg.Routers > 0 && res.Revisions > 0 {
		res.CPUPerRouterChangeUs = win.cpu.Seconds() * 1e6 / float64(cfg.Routers) / float64(res.Revisions)
	}
	if start.After(quiet) {
		res.quiet(since(q0, w0, start.Sub(quiet)), win)
	}
	seen := map[string]*seenAgg{}
	var routerMsgs, routerBytes int64
	for _, r := range results {
		res.RouterCPUCores += r.CPUSecs / wall.Seconds()
		if start.After(quiet) {
			res.QuietRouterCPUCores += r.QuietCPUSecs / start.Sub(quiet).Seconds()
		}
		routerMsgs += r.Messages
		routerBytes += r.Bytes
		res.Errors = append(res.Errors, r.Errors...)
		mergeSeen(seen, r.Seen)
	}
	if cfg.Routers > 0 {
		res.MsgsPerRouterSec = float64(routerMsgs) / float64(cfg.Routers) / wall.Seconds()
		res.KiBPerRouterSec = float64(routerBytes) / 1024 / float64(cfg.Routers) / wall.Seconds()
	}
	var v2r, v2s []float64
	mu.Lock()
	for _, k := range inWindow {
		res.Flips++
		at := committed[k]
		if s := seen[k]; s != nil && s.Count >= cfg.Routers {
			res.Delivered++
			v2r = append(v2r, float64(s.Last-at)/1e6)
			if done, ok := sends.allAt(s.MinRev, cfg.Routers); ok {
				v2s = append(v2s, float64(done-at)/1e6)
			}
		}
	}
	mu.Unlock()
	res.VerdictToRouters, res.VerdictSentAll = quantiles(v2r), quantiles(v2s)
	fmt.Fprintf(logw, "scale %s: the floor: cpu %.2f cores (quiet %.2f), %.1f µs per router per change (marginal %.1f), %.1f µs per message (marginal %.1f, %.2f writes, %.2f reads); changes %d (%d to all routers), v->last send p99 %.1f ms, v->routers p99 %.1f ms; routers %.2f cores; load %.1f%s\n",
		cfg.Name, res.CPUCores, res.QuietCPUCores, res.CPUPerRouterChangeUs, res.Marginal.PerRouterChangeUs, res.CPUPerSentUs, res.Marginal.PerSentUs, res.Marginal.WritesPerSent, res.Marginal.ReadsPerSent,
		res.Flips, res.Delivered, res.VerdictSentAll.P99, res.VerdictToRouters.P99, res.RouterCPUCores, res.LoadAvg, errorsSuffix(res.Errors))
	return res, nil
}

func errorsSuffix(errs []string) string {
	if len(errs) == 0 {
		return ""
	}
	return "; errors: " + strings.Join(errs, "; ")
}
