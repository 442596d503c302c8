// Package watch serves WatchService: it pushes the routing view of the fleet
// to routers (a snapshot, then deltas and heartbeats, each under the
// registry's epoch and revision) and takes back what only routers see.
//
// Each stream is served by passes, Consul style: read the registry, send
// what the router lacks (merged per worker, or a snapshot), look again at the
// next commit or heartbeat tick. Nothing is queued per stream and the
// registry never waits on one. Streams whose routers keep up are passed by a
// few shared writers (writers.go); messages are encoded once for every stream
// at the same revisions (frames.go, encode.go). docs/watch.md has the design.
//
// It owns the routers' streams, frames and writers; it reads the registry's
// published views and never writes to it (routers' reports go to its Sink and
// Demand).
package watch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/smg-project/smg/internal/tlsutil"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/smg-project/smg/controlplane/registry"
	"github.com/smg-project/smg/controlplane/tenants"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/bearer"
)

// DefaultLoadInterval is Options.LoadInterval's default.
const DefaultLoadInterval = time.Second

// ObservationSink takes what routers report. Calls come from stream
// goroutines, concurrently; implementations must not block for long.
type ObservationSink interface {
	// RouterObservations hands over one report from routerID, received at now.
	RouterObservations(routerID string, report *smgv1.RouterReport, now time.Time)
	// RouterGone says routerID's stream ended; its piles no longer count.
	RouterGone(routerID string)
}

// DemandSink takes routers' use of decode windows with the revision each had
// applied (capacity given up is re-granted once a router holds the lower
// share). Calls come from stream goroutines, concurrently.
type DemandSink interface {
	// RouterDemand hands over one report's demand (possibly empty: the
	// router is connected and holds no rooms).
	RouterDemand(routerID string, applied uint64, demand []*smgv1.DecodeDemand, now time.Time)
	// RouterDisconnected says routerID's stream ended at now.
	RouterDisconnected(routerID string, now time.Time)
}

// Options configure a Server (docs/watch.md).
type Options struct {
	// Token, when set, is required as gRPC metadata "authorization: Bearer <token>"
	// (--watch-token). mTLS, when used instead, is configured on the grpc.Server.
	Token string
	// HeartbeatInterval is how long a stream may stay quiet (default 1s).
	HeartbeatInterval time.Duration
	// MaxPending is the most changed workers a delta carries (or half the
	// fleet, if more); beyond it a stream gets a snapshot (default 1024).
	MaxPending int
	// LoadInterval paces changes to loads alone: a router gets them at most
	// once per LoadInterval, routing changes at once (default 1s;
	// negative: loads at once too). LoadPhases spreads that grid over
	// groups of routers, by id (default 10).
	LoadInterval time.Duration
	LoadPhases   int
	// Writers is how many shared writers pass the streams of routers that
	// keep up (default GOMAXPROCS; negative: each stream its own goroutine).
	// A router more than WriterBudget bytes behind on its acks (default
	// 128 KiB), or whose send blocked a writer for WriterStall (default
	// 20 ms), is passed by its stream's own goroutine.
	Writers      int
	WriterBudget int64
	WriterStall  time.Duration
	// Sink and Demand receive routers' reports (nil: dropped).
	Sink   ObservationSink
	Demand DemandSink
	// Tenants keeps routers' tenant reports and relays to each the others', at
	// most every TenantInterval (default 250ms; nil: a table of its own).
	Tenants        *tenants.Table
	TenantInterval time.Duration
	// Now is the clock of the passes, the writers and router records (nil: time.Now).
	Now func() time.Time
	// Settings go to every router with each snapshot (nil: none sent,
	// routers keep their flags).
	Settings *smgv1.FleetSettings
	// Sent, when set, hears every delta and snapshot sent, with the revision
	// it brings the router to (the scale harness times the fan-out). Called concurrently.
	Sent func(routerID string, revision uint64)
	// WarmUntil is when this control plane's registry is complete: until
	// then every snapshot says how many seconds are left (warming_secs),
	// and routers keep the workers of their previous epoch that it lacks.
	// Zero: complete from the start (a durable registry).
	WarmUntil time.Time
	// EncodePerStream turns the shared frames off: the scale benchmark's
	// baseline for shared encoding; nothing else sets it.
	EncodePerStream bool
}

func (o Options) withDefaults() Options {
	o.HeartbeatInterval = positive(o.HeartbeatInterval, time.Second)
	o.MaxPending = positive(o.MaxPending, 1024)
	o.LoadInterval = cmp.Or(o.LoadInterval, DefaultLoadInterval)
	o.LoadPhases = positive(o.LoadPhases, 10)
	o.Writers = cmp.Or(o.Writers, runtime.GOMAXPROCS(0))
	o.WriterBudget = positive(o.WriterBudget, 128<<10)
	o.WriterStall = positive(o.WriterStall, 20*time.Millisecond)
	o.TenantInterval = positive(o.TenantInterval, 250*time.Millisecond)
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Tenants == nil {
		o.Tenants = tenants.New()
	}
	return o
}

// positive is v, or d when v is not positive.
func positive[T int | int64 | time.Duration](v, d T) T {
	if v <= 0 {
		return d
	}
	return v
}

// Server implements smgv1.WatchServiceServer.
type Server struct {
	smgv1.UnimplementedWatchServiceServer

	reg     *registry.Registry
	opts    Options
	log     *slog.Logger
	metrics *metrics
	frames  *frames
	// The shared writers' shards (none: every stream writes itself).
	shards    []*shard
	nextShard atomic.Uint64         // round robin
	joined    func(routerID string) // when set, hears each stream joining a writer (tests)
	// fleet is the number of workers in the latest snapshot built: a delta
	// may carry up to half of it, so a storm of verdicts is not snapshots.
	fleet    atomic.Int64
	settings []byte // Options.Settings marshalled

	closed context.Context // done at Close: every stream says goodbye
	cancel context.CancelFunc

	mu      sync.Mutex
	routers map[string]*routerRecord // by router id: the latest stream of each
}

// routerRecord is one connected router. Its acks and reports update it
// without a lock (1,000 routers send 8,000 a second).
type routerRecord struct {
	id          string
	peer        string
	connectedAt time.Time
	applied     atomic.Uint64
	lastSeen    atomic.Int64 // Unix ns

	ackMu sync.Mutex
	acks  []pendingAck // folded reports not yet acknowledged, oldest first
}

// pendingAck is a folded report: every state at revision rev or later holds it.
type pendingAck struct {
	seq, rev uint64
}

// maxAcks bounds the folded reports awaiting a send: the newest replaces the last.
const maxAcks = 16

// folded notes report seq as folded into the sums by revision rev.
func (r *routerRecord) folded(seq, rev uint64) {
	r.ackMu.Lock()
	defer r.ackMu.Unlock()
	n := len(r.acks)
	switch {
	case n > 0 && r.acks[n-1].seq >= seq:
		return // an older report, after a newer one: nothing to tell
	case n > 0 && r.acks[n-1].rev == rev:
		r.acks[n-1].seq = seq // nothing committed between: the newer supersedes it exactly
		return
	case n == maxAcks:
		r.acks = r.acks[:maxAcks-1]
	}
	r.acks = append(r.acks, pendingAck{seq, rev})
}

// ackable takes the latest folded report every state at revision rev holds
// (0: none), dropping the ones it supersedes.
func (r *routerRecord) ackable(rev uint64) uint64 {
	r.ackMu.Lock()
	defer r.ackMu.Unlock()
	i := 0
	for i < len(r.acks) && r.acks[i].rev <= rev {
		i++
	}
	if i == 0 {
		return 0
	}
	seq := r.acks[i-1].seq
	r.acks = r.acks[:copy(r.acks, r.acks[i:])]
	return seq
}

// NewServer returns a WatchService over reg. metrics may be nil.
func NewServer(reg *registry.Registry, opts Options, log *slog.Logger, metrics prometheus.Registerer) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		reg:     reg,
		opts:    opts.withDefaults(),
		log:     log,
		routers: make(map[string]*routerRecord),
	}
	s.closed, s.cancel = context.WithCancel(context.Background())
	if opts.Settings != nil {
		var err error
		if s.settings, err = proto.Marshal(opts.Settings); err != nil {
			panic(err) // two integers always marshal: a bug if not
		}
	}
	s.frames = newFrames(func(k frameKind) { s.metrics.encodedBy[k].Inc() })
	s.frames.private = s.opts.EncodePerStream
	if s.opts.Writers > 0 && !s.opts.EncodePerStream {
		for range s.opts.Writers {
			s.shards = append(s.shards, &shard{s: s, kick: make(chan struct{}, 1)})
		}
	}
	s.metrics = newMetrics(s, metrics)
	return s
}

// Close tells every stream, and any that opens later, goodbye (routers
// reconnect at once) and ends them; grpc.Server.GracefulStop waits for them.
func (s *Server) Close() {
	s.cancel()
}

// Routers lists the routers watching, by id, with their lag.
func (s *Server) Routers() []*smgv1.RouterInfo {
	current := s.reg.Revision()
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*smgv1.RouterInfo, 0, len(s.routers))
	for _, r := range s.routers {
		out = append(out, &smgv1.RouterInfo{
			RouterId:        r.id,
			Peer:            r.peer,
			AppliedRevision: r.applied.Load(),
			Lag:             current - min(r.applied.Load(), current),
			ConnectedAt:     timestamppb.New(r.connectedAt),
			LastSeen:        timestamppb.New(time.Unix(0, r.lastSeen.Load())),
		})
	}
	slices.SortFunc(out, func(a, b *smgv1.RouterInfo) int { return strings.Compare(a.RouterId, b.RouterId) })
	return out
}

// Watch serves one router's stream.
func (s *Server) Watch(stream grpc.BidiStreamingServer[smgv1.WatchRequest, smgv1.WatchResponse]) error {
	ctx := stream.Context()
	if err := s.authorize(ctx); err != nil {
		return err
	}
	first, err := stream.Recv()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil
		}
		return err
	}
	hello := first.GetHello()
	if hello == nil {
		return status.Error(codes.InvalidArgument, "watch: the first message must be a hello")
	}
	if s.closed.Err() != nil { // shutting down: no snapshot, just the goodbye
		return stream.Send(s.goodbye(hello.GetRevision()))
	}
	id, err := tlsutil.PeerName(ctx, "router", hello.GetRouterId())
	if err != nil {
		s.log.Warn("Router refused", "err", err)
		return err
	}
	if id != hello.GetRouterId() {
		s.log.Info("Router named by its client certificate", "router", id, "hello_router_id", hello.GetRouterId())
	}
	rec := s.addRouter(ctx, id)
	defer s.removeRouter(rec)
	s.metrics.streams.Inc()
	defer s.metrics.streams.Dec()
	s.log.Info("router watching", "router", rec.id, "peer", rec.peer,
		"epoch", hello.GetEpoch(), "revision", hello.GetRevision())

	// One context for everything that ends the stream: its end, the
	// receiver's error (its cause) and Close.
	sctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	defer context.AfterFunc(s.closed, func() { stop(errClosing) })()
	go s.receive(stream, rec, stop)

	err = s.serve(sctx, stream, rec, hello)
	s.log.Info("router stream ended", "router", rec.id, "err", err)
	return err
}

// serve runs one stream's passes until it ends: on this goroutine, or on a
// shared writer while this one waits for the end or for the stream back.
func (s *Server) serve(ctx context.Context, stream grpc.ServerStream, rec *routerRecord, hello *smgv1.WatchHello) error {
	w := s.newWatcher(stream, rec, hello)
	wake := time.NewTimer(s.opts.HeartbeatInterval)
	defer wake.Stop()
	for {
		// Before reading, so no commit slips between.
		changed := s.changed()
		now := s.opts.Now()
		w.mu.Lock()
		next, err := w.pass(now)
		// To a shared writer if none stalled on it lately and the router has
		// acked all but half the budget.
		share := err == nil && len(s.shards) > 0 && !now.Before(w.sharedAgain) && w.unacked() <= s.opts.WriterBudget/2
		w.mu.Unlock()
		if err != nil {
			return err
		}
		if share {
			s.share(w)
			select {
			case err := <-w.back:
				if err != nil {
					return err
				}
				continue // back on this goroutine: look again at once
			case <-ctx.Done():
				return w.leave(ctx)
			}
		}
		wake.Reset(next.Sub(now))
		select {
		case <-changed:
		case <-wake.C:
		case <-ctx.Done():
			return w.leave(ctx)
		}
	}
}

// changed is closed at the next change a stream must look at: a routing
// change when loads are paced (their grid is timed), any otherwise.
func (s *Server) changed() <-chan struct{} {
	if s.opts.LoadInterval > 0 {
		return s.reg.RoutingChanged()
	}
	return s.reg.Changed()
}

// watcher is one stream's state between passes, under mu. A shared writer
// holds mu through its pass, so the stream's goroutine taking mu waits out
// any send on it.
type watcher struct {
	s      *Server
	stream grpc.ServerStream // timed for the stall watchdog (writerStream)
	rec    *routerRecord
	epoch  string
	phase  time.Duration // the stream's offset on the load grid
	back   chan error    // buffered 1: a shared writer hands the stream back (non-nil: it ends)

	mu           sync.Mutex
	gone         bool   // the stream ended: nobody sends on it again
	needSnapshot bool   // the router's epoch or revision cannot be resumed
	last         uint64 // revision the router holds after our last send
	loadsAt      uint64 // every change up to it, loads included, was sent
	nextLoad     time.Time
	beatAt       time.Time
	confirmed    bool // the router has heard from us on this stream
	// Bytes of deltas and snapshots sent and acked (a heartbeat is not
	// acked); marks are the unacked sends.
	sentBytes, ackedBytes int64
	marks                 []ackMark
	sharedAgain           time.Time // a stalled stream stays on its own goroutine until then
	stallWait             time.Duration
	tenantsSent           uint64 // the tenant table's version last relayed
	nextTenants           time.Time
	// The shard it joined, the writer in a pass on it, when it is due next.
	shard *shard
	by    *writer
	due   time.Time
}

type ackMark struct {
	rev   uint64
	bytes int64
}

func (s *Server) newWatcher(stream grpc.ServerStream, rec *routerRecord, hello *smgv1.WatchHello) *watcher {
	w := &watcher{s: s, rec: rec, epoch: s.reg.Epoch(), back: make(chan error, 1), phase: s.loadPhase(rec.id),
		beatAt: s.opts.Now().Add(s.opts.HeartbeatInterval)}
	w.stream = &writerStream{ServerStream: stream, w: w}
	// A router holding this epoch resumes from its revision.
	if w.needSnapshot = hello.GetEpoch() != w.epoch; !w.needSnapshot {
		w.last, w.loadsAt = hello.GetRevision(), hello.GetRevision()
	}
	return w
}

// leave takes w from its shared writer, if any, and waits out a pass on it
// (nobody sends on it afterwards); it returns what ctx's cause ends it with.
func (w *watcher) leave(ctx context.Context) error {
	if w.shard != nil {
		w.shard.drop(w)
	}
	w.mu.Lock()
	w.gone = true
	w.mu.Unlock()
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, errClosing):
		return w.stream.SendMsg(w.s.goodbye(w.last))
	case errors.As(cause, new(errRecv)):
		return cause.(errRecv).err
	default:
		return status.FromContextError(ctx.Err()).Err()
	}
}

// pass is one look at the registry: send the router what it lacks, and say
// when to look again without a routing change. Routing changes go at once,
// changes to loads at the stream's next load-grid instant.
func (w *watcher) pass(now time.Time) (time.Time, error) {
	s := w.s
	snap := s.reg.Snapshot()
	cur := snap.Revision
	sent := false // the router holds cur after this pass
	switch {
	case w.needSnapshot:
	case w.loadsAt != cur && !now.Before(w.nextLoad): // everything since loadsAt
		k := baseKey{w.epoch, kindDelta, w.loadsAt, cur}
		if b := s.deltaBase(k, snap); b.tooFar {
			w.needSnapshot = true
		} else if err := w.send(k, b); err != nil {
			return now, err
		} else {
			sent, w.loadsAt, w.nextLoad = true, cur, s.loadGrid(now, w.phase)
		}
	case cur != w.last: // routing changes only; loads wait for nextLoad
		k := baseKey{w.epoch, kindRouting, w.last, cur}
		switch b := s.deltaBase(k, snap); {
		case b.tooFar:
			w.needSnapshot = true
		case len(b.workers)+len(b.removed) == 0: // loads alone: nothing to send yet
		default:
			if err := w.send(k, b); err != nil {
				return now, err
			}
			if b.complete && w.loadsAt == w.last {
				w.loadsAt = cur // no load was left behind
			}
			sent = true
		}
	}
	switch {
	case w.needSnapshot:
		k := baseKey{w.epoch, kindSnapshot, 0, cur}
		if err := w.send(k, s.snapshotBase(k, snap)); err != nil {
			return now, err
		}
		sent, w.loadsAt, w.nextLoad = true, cur, s.loadGrid(now, w.phase)
	case !sent && (!w.confirmed || !now.Before(w.beatAt)):
		// Resumed with nothing new, or quiet: confirm its revision.
		if err := w.send(baseKey{w.epoch, kindHeartbeat, 0, w.last}, noWorkers); err != nil {
			return now, err
		}
		w.confirmed, w.beatAt = true, now.Add(s.opts.HeartbeatInterval)
	}
	if sent {
		w.last, w.needSnapshot, w.confirmed = cur, false, true
		w.beatAt = now.Add(s.opts.HeartbeatInterval)
	}
	next := w.beatAt
	// The other routers' tenants (per router: its own are left out), when
	// the table changed, at most every TenantInterval.
	t := s.opts.Tenants
	if v := t.Version(); v != w.tenantsSent && !now.Before(w.nextTenants) && w.confirmed {
		if err := w.stream.SendMsg(&smgv1.WatchResponse{Epoch: w.epoch, Revision: w.last,
			Msg: &smgv1.WatchResponse_Tenants{Tenants: t.Others(w.rec.id)}}); err != nil {
			return now, err
		}
		w.tenantsSent, w.nextTenants = v, now.Add(s.opts.TenantInterval)
	}
	if at := now.Add(s.opts.TenantInterval); (t.Active() || t.Version() != w.tenantsSent) && at.Before(next) {
		next = at
	}
	if s.opts.LoadInterval > 0 {
		if !now.Before(w.nextLoad) { // nothing was pending at this grid instant
			w.nextLoad = s.loadGrid(now, w.phase)
		}
		if w.nextLoad.Before(next) { // look for loads at the next grid instant
			next = w.nextLoad
		}
	}
	return next, nil
}

// send sends the message of b under k as this router sees it. A delta or
// snapshot goes after its ack (sendAck) and counts as not yet acked.
func (w *watcher) send(k baseKey, b *base) error {
	s, beat := w.s, k.kind == kindHeartbeat
	if !beat {
		if err := w.sendAck(k.to); err != nil {
			return err
		}
	}
	s.metrics.sentBy[k.kind].Inc()
	var warming int32
	if k.kind == kindSnapshot {
		warming = s.warmingSecs()
	}
	fr := s.frames.frame(frameKey{k, b.shareKey(w.rec.id), warming})
	n, err := s.frames.send(w.stream, k.kind, fr, b.sizeHint(), func(buf []byte) []byte {
		return s.appendResponse(buf, k, b, w.rec.id, warming)
	})
	s.frames.release(fr)
	if err != nil || beat {
		return err
	}
	if s.opts.Sent != nil {
		s.opts.Sent(w.rec.id, k.to)
	}
	w.sentBytes += int64(n)
	if len(w.marks) == maxMarks { // merge into the newest: acks count a little late
		w.marks = w.marks[:maxMarks-1]
	}
	w.marks = append(w.marks, ackMark{k.to, w.sentBytes})
	return nil
}

// sendAck acknowledges, before a message of workers read at rev, the
// router's latest report folded by then: every worker after it holds it.
func (w *watcher) sendAck(rev uint64) error {
	seq := w.rec.ackable(rev)
	if seq == 0 {
		return nil
	}
	return w.stream.SendMsg(rawMessage(appendAck(make([]byte, 0, 24+len(w.epoch)), w.epoch, w.last, seq)))
}

// maxMarks bounds the sends remembered for acks (a router that never acks).
const maxMarks = 64

// unacked is the bytes of deltas and snapshots the router has not acked.
func (w *watcher) unacked() int64 {
	applied := w.rec.applied.Load()
	i := 0
	for ; i < len(w.marks) && w.marks[i].rev <= applied; i++ {
		w.ackedBytes = w.marks[i].bytes
	}
	w.marks = w.marks[:copy(w.marks, w.marks[i:])]
	return w.sentBytes - w.ackedBytes
}

// errClosing ends a stream's context on Close: the stream says goodbye.
var errClosing = errors.New("watch: control plane closing")

// errRecv ends a stream's context when its receiver stops (nil: EOF).
type errRecv struct{ err error }

func (e errRecv) Error() string { return fmt.Sprintf("watch: receive: %v", e.err) }

// loadGrid is the next instant after now at which loads may go to a stream
// of phase: a multiple of LoadInterval plus the phase (now: pacing off).
func (s *Server) loadGrid(now time.Time, phase time.Duration) time.Time {
	if s.opts.LoadInterval < 0 {
		return now
	}
	return now.Add(-phase).Truncate(s.opts.LoadInterval).Add(s.opts.LoadInterval + phase)
}

// loadPhase is routerID's offset on the load grid, by a hash of the id.
func (s *Server) loadPhase(routerID string) time.Duration {
	if s.opts.LoadInterval <= 0 || s.opts.LoadPhases <= 1 {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(routerID))
	g := time.Duration(h.Sum32() % uint32(s.opts.LoadPhases))
	return g * (s.opts.LoadInterval / time.Duration(s.opts.LoadPhases))
}

// deltaBase is the shared content of the delta k, every changed worker read
// from snap: exactly the state at snap.Revision (a worker created since
// reads as a removal of an id the router does not hold: harmless).
func (s *Server) deltaBase(k baseKey, snap *registry.Snapshot) *base {
	b := s.frames.base(k)
	b.once.Do(func() {
		since := s.reg.ChangesSince
		if k.kind == kindRouting {
			since = s.reg.RoutingChangesSince
		}
		changes, _, ok := since(k.from)
		if !ok || len(changes) > max(s.opts.MaxPending, int(s.fleet.Load()/2)) {
			b.tooFar = true
			return
		}
		if k.kind == kindRouting {
			all, _, ok := s.reg.ChangesSince(k.from)
			b.complete = ok && !slices.ContainsFunc(all, func(c registry.Change) bool { return c.LoadOnly })
		}
		workers := make([]*registry.Worker, 0, len(changes))
		for _, c := range changes {
			if w := snap.Get(c.WorkerID); w != nil {
				workers = append(workers, w)
			} else {
				b.removed = append(b.removed, c.WorkerID)
			}
		}
		b.list(workers)
	})
	return b
}

// snapshotBase is the shared content of the snapshot at snap.Revision.
func (s *Server) snapshotBase(k baseKey, snap *registry.Snapshot) *base {
	b := s.frames.base(k)
	b.once.Do(func() {
		b.list(snap.Workers())
		s.fleet.Store(int64(len(b.workers)))
	})
	return b
}

// noWorkers is a heartbeat's base (read only).
var noWorkers = &base{}

// warmingSecs is how long the registry may still be incomplete, in
// seconds rounded up (a zero WarmUntil is long past).
func (s *Server) warmingSecs() int32 {
	left := s.opts.WarmUntil.Sub(s.opts.Now())
	return int32(min(max(left+time.Second-1, 0)/time.Second, math.MaxInt32))
}

func (s *Server) goodbye(rev uint64) *smgv1.WatchResponse {
	s.metrics.goodbyes.Inc()
	return &smgv1.WatchResponse{
		Epoch: s.reg.Epoch(), Revision: rev,
		Msg: &smgv1.WatchResponse_Goodbye{Goodbye: &smgv1.Goodbye{Reason: "control plane shutting down"}},
	}
}

// receive reads acks and reports until the stream ends.
func (s *Server) receive(stream grpc.BidiStreamingServer[smgv1.WatchRequest, smgv1.WatchResponse], rec *routerRecord, done context.CancelCauseFunc) {
	for {
		req, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil // the router closed its side: end the stream cleanly
			}
			done(errRecv{err})
			return
		}
		now := s.opts.Now()
		rec.lastSeen.Store(now.UnixNano())
		switch m := req.Msg.(type) {
		case *smgv1.WatchRequest_Ack:
			if rev := m.Ack.GetRevision(); rev != 0 {
				rec.applied.Store(rev)
			}
		case *smgv1.WatchRequest_Report:
			if s.opts.Sink != nil {
				s.opts.Sink.RouterObservations(rec.id, m.Report, now)
				if seq := m.Report.GetSeq(); seq != 0 {
					// Read after the fold committed.
					rec.folded(seq, s.reg.Revision())
				}
			}
			if s.opts.Demand != nil {
				s.opts.Demand.RouterDemand(rec.id, rec.applied.Load(), m.Report.GetDemand(), now)
			}
			s.opts.Tenants.Report(rec.id, m.Report.GetTenants())
		case *smgv1.WatchRequest_Hello:
			s.log.Warn("router sent a second hello; ignored", "router", rec.id)
		}
	}
}

func (s *Server) addRouter(ctx context.Context, id string) *routerRecord {
	addr := ""
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		addr = p.Addr.String()
	}
	id = cmp.Or(id, addr) // an anonymous router is known by its address
	now := s.opts.Now()
	rec := &routerRecord{id: id, peer: addr, connectedAt: now}
	rec.lastSeen.Store(now.UnixNano())
	s.mu.Lock()
	defer s.mu.Unlock()
	s.routers[id] = rec // a reconnect replaces the stream the server has not seen end yet
	return rec
}

func (s *Server) removeRouter(rec *routerRecord) {
	s.mu.Lock()
	current := s.routers[rec.id] == rec
	if current {
		delete(s.routers, rec.id)
	}
	s.mu.Unlock()
	if !current {
		return
	}
	if s.opts.Sink != nil {
		s.opts.Sink.RouterGone(rec.id)
	}
	if s.opts.Demand != nil {
		s.opts.Demand.RouterDisconnected(rec.id, s.opts.Now())
	}
	s.opts.Tenants.Gone(rec.id) // never nil (withDefaults)
}

// authorize checks the bearer token when one is configured.
func (s *Server) authorize(ctx context.Context) error {
	if s.opts.Token == "" {
		return nil
	}
	switch sent, ok := bearer.Check(ctx, s.opts.Token); {
	case !sent:
		return status.Error(codes.Unauthenticated,
			`watch: missing token: send metadata "authorization: Bearer <token>" with the control plane's --watch-token`)
	case !ok:
		return status.Error(codes.Unauthenticated, "watch: invalid token: it does not match the control plane's --watch-token")
	}
	return nil
}
