package watch

import (
	"encoding/binary"
	"maps"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/smg-project/smg/controlplane/registry"
)

// Encode once, send to many: every stream that needs the same message gets
// one shared frame, encoded by the first stream that asks (encode.go) and
// keyed by everything its content depends on.

// frameKind says what a frame carries.
type frameKind uint8

const (
	kindDelta   frameKind = iota // every change since a revision
	kindRouting                  // routing changes since a revision (loads wait)
	kindSnapshot
	kindHeartbeat
)

// kindNames are the frame kinds as the metrics name them.
var kindNames = [...]string{kindDelta: "delta", kindRouting: "delta", kindSnapshot: "snapshot", kindHeartbeat: "heartbeat"}

// baseKey names a message's content before per-router shares.
type baseKey struct {
	epoch string
	kind  frameKind
	from  uint64 // delta: the revision the router holds
	to    uint64 // the revision the message brings the router to
}

// frameKey names one encoded message: content, shares (base.shareKey), warm-up.
type frameKey struct {
	baseKey
	shares  string
	warming int32
}

// base is a message's content, read once from the registry.
type base struct {
	once     sync.Once
	tooFar   bool               // delta only: too many changes or history gone: send a snapshot
	complete bool               // routing delta: no load change left out
	workers  []*registry.Worker // upserts in order (snapshot: every worker)
	removed  []string           // delta only
	windowed []int              // indexes into workers with per-router shares
}

// frame is one encoded message shared by every stream that needs it, in a
// pooled buffer given back once nobody holds it (refs: the cache's hold and
// one per sending stream).
type frame struct {
	refs    atomic.Int32
	once    sync.Once     // writes raw
	buf     *[]byte       // the pool's box of raw
	raw     []byte        // the message's wire bytes; valid while refs > 0
	wire    proto.Message // raw as a message gRPC's codec copies (marshals concurrently)
	senders atomic.Int32
	prep    sync.Once
	prepped *grpc.PreparedMsg // nil: not prepared (yet), or the stream cannot
}

// copySends is how many streams a large frame is copied to (into gRPC's
// pooled buffers) before it is prepared (grpc.PreparedMsg, kept), so a load
// refresh for one or two routers allocates nothing new. A small frame is
// always prepared: gRPC does not pool its copy.
const copySends = 2

func newFrame() *frame {
	fr := &frame{}
	fr.refs.Store(1)
	return fr
}

// acquire takes a hold on fr for a send; false when it was already let go
// (its buffer may be another frame's by now).
func (fr *frame) acquire() bool {
	for {
		n := fr.refs.Load()
		if n <= 0 {
			return false
		}
		if fr.refs.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// release lets go of a hold; the last one gives the buffer back.
func (f *frames) release(fr *frame) {
	if fr.refs.Add(-1) == 0 && fr.buf != nil {
		f.bufs.put(fr.buf, fr.raw)
		fr.buf, fr.raw, fr.wire = nil, nil, nil
	}
}

// frames caches the bases and frames of the newest revision (what streams ask for).
type frames struct {
	mu      sync.Mutex
	newest  uint64
	bases   map[baseKey]*base
	frames  map[frameKey]*frame
	encoded func(kind frameKind) // hears every message marshalled
	private bool                 // Options.EncodePerStream: nothing shared
	bufs    bufPool
	// The entries handed out last: at a change every stream asks for the
	// same ones, and finds them without the lock and the map.
	lastBase  atomic.Pointer[entry[baseKey, *base]]
	lastFrame atomic.Pointer[entry[frameKey, *frame]]
}

type entry[K comparable, V any] struct {
	k K
	v V
}

func newFrames(encoded func(frameKind)) *frames {
	return &frames{bases: map[baseKey]*base{}, frames: map[frameKey]*frame{}, encoded: encoded}
}

// base returns the shared base under k, empty when new.
func (f *frames) base(k baseKey) *base {
	if f.private {
		return &base{}
	}
	if e := f.lastBase.Load(); e != nil && e.k == k {
		return e.v
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.advance(k.to)
	b := f.bases[k]
	if b == nil {
		b = &base{}
		f.bases[k] = b
	}
	f.lastBase.Store(&entry[baseKey, *base]{k, b})
	return b
}

// frame returns the frame under k, held for the caller, who releases it.
func (f *frames) frame(k frameKey) *frame {
	if f.private {
		return newFrame() // the caller's hold only
	}
	if e := f.lastFrame.Load(); e != nil && e.k == k && e.v.acquire() {
		return e.v
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.advance(k.to)
	fr := f.frames[k]
	if fr == nil {
		fr = newFrame() // the cache's hold, until advance drops it
		f.frames[k] = fr
	}
	fr.acquire() // cannot fail: the cache holds it
	f.lastFrame.Store(&entry[frameKey, *frame]{k, fr})
	return fr
}

// advance drops every entry older than rev. Caller holds mu.
func (f *frames) advance(rev uint64) {
	if rev <= f.newest {
		return
	}
	f.newest = rev
	maps.DeleteFunc(f.bases, func(k baseKey, _ *base) bool { return k.to < rev })
	for k, fr := range f.frames {
		if k.to < rev {
			delete(f.frames, k)
			f.release(fr)
		}
	}
}

// shareKey is routerID's window and token shares of b's per-router workers.
func (b *base) shareKey(routerID string) string {
	if len(b.windowed) == 0 {
		return ""
	}
	buf := make([]byte, 0, 4*len(b.windowed))
	for _, i := range b.windowed {
		w := b.workers[i]
		buf = binary.AppendVarint(buf, windowShare(w, routerID))
		buf = binary.AppendVarint(buf, tokenShare(w, routerID))
	}
	return string(buf)
}

// list sets the workers the message lists.
func (b *base) list(workers []*registry.Worker) {
	b.workers = workers
	for i, w := range workers {
		if perRouter(w) {
			b.windowed = append(b.windowed, i)
		}
	}
}

// send writes fr to stream, encoded first by write (into a buffer of about
// size bytes) if no stream has yet, and says how many bytes it is.
func (f *frames) send(stream grpc.ServerStream, kind frameKind, fr *frame, size int, write func([]byte) []byte) (int, error) {
	fr.once.Do(func() {
		fr.buf = f.bufs.get(size)
		fr.raw = write(*fr.buf)
		fr.wire = rawMessage(fr.raw)
		if f.encoded != nil {
			f.encoded(kind)
		}
	})
	if mem.IsBelowBufferPoolingThreshold(len(fr.raw)) || fr.senders.Add(1) > copySends {
		fr.prep.Do(func() {
			prep := &grpc.PreparedMsg{}
			// A stream without RPC info (a test's) cannot prepare.
			if err := prep.Encode(stream, fr.wire); err == nil {
				fr.prepped = prep
			}
		})
		if fr.prepped != nil {
			return len(fr.raw), stream.SendMsg(fr.prepped)
		}
	}
	// gRPC copies the bytes before SendMsg returns.
	return len(fr.raw), stream.SendMsg(fr.wire)
}

// sizeHint is about how many bytes b's message takes.
func (b *base) sizeHint() int {
	return 128*len(b.workers) + 32*len(b.removed) + 256
}
