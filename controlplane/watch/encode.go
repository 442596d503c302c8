package watch

import (
	"maps"
	"math"
	"math/bits"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// The watch's messages are written straight to their wire bytes: built as
// messages and marshalled, a 10,000-worker snapshot (a router's load refresh
// at that size, every second) allocates 3.2 MB and takes 2-4 times as long.
// Fields go in watch.proto's number order, zero values skipped: exactly
// proto.Marshal's bytes (TestDirectEncodingEqualsMarshal, encode_fields_test.go).

// appendResponse appends the WatchResponse of b under k as routerID sees it
// (a snapshot saying warming seconds of warm-up are left).
func (s *Server) appendResponse(buf []byte, k baseKey, b *base, routerID string, warming int32) []byte {
	buf = appendString(buf, 1, k.epoch)
	buf = appendUint(buf, 2, k.to) // revision
	switch k.kind {
	case kindSnapshot:
		buf, m := openField(buf, 3)
		buf = appendWorkers(buf, 1, b.workers, routerID)
		if s.opts.Settings != nil {
			buf = protowire.AppendBytes(protowire.AppendTag(buf, 2, protowire.BytesType), s.settings)
		}
		buf = appendInt(buf, 3, int64(warming))
		return closeField(buf, m)
	case kindHeartbeat:
		return protowire.AppendBytes(protowire.AppendTag(buf, 5, protowire.BytesType), nil)
	default:
		buf, m := openField(buf, 4)
		buf = appendWorkers(buf, 1, b.workers, routerID)
		for _, id := range b.removed { // removed, repeated: every element, empty or not
			buf = protowire.AppendTag(buf, 2, protowire.BytesType)
			buf = protowire.AppendString(buf, validUTF8(id))
		}
		return closeField(buf, m)
	}
}

// appendWorkers appends each worker as a field num, as routerID sees it.
func appendWorkers(buf []byte, num protowire.Number, workers []*registry.Worker, routerID string) []byte {
	for _, w := range workers {
		var m int
		buf, m = openField(buf, num)
		buf = appendWorker(buf, w, routerID)
		buf = closeField(buf, m)
	}
	return buf
}

// RoutingWorker is the part of w that routing needs, as the router routerID
// sees it: the worker exactly as a snapshot or delta sends it.
func RoutingWorker(w *registry.Worker, routerID string) *smgv1.RoutingWorker {
	rw := &smgv1.RoutingWorker{}
	if err := proto.Unmarshal(appendWorker(nil, w, routerID), rw); err != nil {
		panic(err) // the encoder wrote bytes it cannot read: a bug
	}
	return rw
}

// appendWorker appends the fields of the RoutingWorker that the router
// routerID gets of w (its own shares of a decode worker's window and token
// budget). Every worker is sent, ready or not: healthy carries the health
// checker's admission and the router decides.
func appendWorker(buf []byte, w *registry.Worker, routerID string) []byte {
	spec := w.Spec
	priority, cost := int32(50), 1.0 // the spec's defaults
	if spec != nil && spec.Priority != nil {
		priority = *spec.Priority
	}
	if spec != nil && spec.Cost != nil {
		cost = *spec.Cost
	}
	veto, vetoReason := w.Veto()
	buf = appendString(buf, 1, w.ID)
	buf = appendString(buf, 2, spec.GetUrl())
	buf = appendString(buf, 3, w.Model)
	buf = appendString(buf, 4, w.Type)
	buf = appendInt(buf, 5, int64(priority))
	buf = appendDouble(buf, 6, cost)
	buf = appendBool(buf, 7, w.Ready())
	buf = appendInt(buf, 8, int64(veto))
	buf = appendString(buf, 9, vetoReason)
	buf = appendInt(buf, 10, int64(w.Load.GetWaitingRequests()))
	buf = appendInt(buf, 11, int64(w.Load.GetRunningRequests()))
	buf = appendDouble(buf, 12, w.Load.GetTokenUsage())
	buf = appendInt(buf, 13, w.MaxRunning())
	buf = appendUint(buf, 14, w.LoadRevision)
	buf = appendInt(buf, 15, int64(spec.GetBootstrapPort()))
	buf = appendUint(buf, 16, w.ContactSeq)
	buf = appendString(buf, 17, spec.GetApiKey())
	buf = appendInt(buf, 18, windowShare(w, routerID))
	buf = appendInt(buf, 19, w.Admission.Rooms())
	buf = appendBool(buf, 20, w.Overloaded)
	buf = appendString(buf, 21, w.OverloadReason)
	if p := spec.GetProvider(); p != nil {
		var m int
		buf, m = openField(buf, 22)
		buf = appendProvider(buf, p)
		buf = closeField(buf, m)
	}
	buf = appendInt(buf, 23, w.PromptTokensAhead)
	buf = appendInt(buf, 24, w.Budget.TokenBudget())
	buf = appendInt(buf, 25, tokenShare(w, routerID))
	return buf
}

// appendProvider appends the fields of the ProviderRoute routers get of an
// external worker's provider block: its key as the reference only, its
// headers sorted by name so the same worker always encodes alike.
func appendProvider(buf []byte, p *smgv1.ProviderSpec) []byte {
	buf = appendString(buf, 1, p.GetModel())
	buf = appendString(buf, 2, p.GetApiKeyRef())
	for _, name := range slices.Sorted(maps.Keys(p.GetHeaders())) { // repeated: every element, empty or not
		var m int
		buf, m = openField(buf, 3)
		buf = appendString(buf, 1, name)
		buf = appendString(buf, 2, p.GetHeaders()[name])
		buf = closeField(buf, m)
	}
	buf = appendInt(buf, 4, int64(p.GetTimeoutSecs()))
	buf = appendDouble(buf, 5, p.GetSpillRequestsPerSec())
	return appendDouble(buf, 6, p.GetSpillTokensPerSec())
}

// windowShare is routerID's share of w's running window as RoutingWorker
// sends it.
func windowShare(w *registry.Worker, routerID string) int64 {
	share := w.WindowShare[routerID]
	if share == 0 && (w.Type == "decode" && w.MaxRunning() > 0 || w.Admission.Rooms() > 0 || registry.SpillBudget(w)) {
		// No share granted to this router (yet): -1 tells it to hold no room
		// (spill nothing), where 0 would let it count against the whole
		// window (budget) alone.
		share = -1
	}
	return share
}

// tokenShare is routerID's share of w's token budget as RoutingWorker sends
// it: -1 when the worker has a budget and this router no share (yet).
func tokenShare(w *registry.Worker, routerID string) int64 {
	share := w.TokenShare[routerID]
	if share == 0 && w.Budget.TokenBudget() > 0 {
		share = -1
	}
	return share
}

// perRouter reports whether routers see w differently (their own shares).
func perRouter(w *registry.Worker) bool { return len(w.WindowShare) > 0 || len(w.TokenShare) > 0 }

// openField appends field num's tag and a one-byte length placeholder,
// and returns where the length goes (closeField).
func openField(buf []byte, num protowire.Number) ([]byte, int) {
	buf = protowire.AppendTag(buf, num, protowire.BytesType)
	return append(buf, 0), len(buf)
}

// closeField writes the length of the field opened at m, moving its content
// when the length needs more than one byte.
func closeField(buf []byte, m int) []byte {
	n := len(buf) - m - 1
	if n < 0x80 {
		buf[m] = byte(n)
		return buf
	}
	extra := protowire.SizeVarint(uint64(n)) - 1
	buf = append(buf, make([]byte, extra)...)
	copy(buf[m+1+extra:], buf[m+1:m+1+n])
	protowire.AppendVarint(buf[:m], uint64(n))
	return buf
}

// Scalar fields, left out at their zero value as proto3 does.

func appendString(buf []byte, num protowire.Number, v string) []byte {
	if v == "" {
		return buf
	}
	return protowire.AppendString(protowire.AppendTag(buf, num, protowire.BytesType), validUTF8(v))
}

func appendInt(buf []byte, num protowire.Number, v int64) []byte {
	return appendUint(buf, num, uint64(v)) // negative: ten bytes, as int32 and int64 fields encode
}

func appendUint(buf []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return buf
	}
	return protowire.AppendVarint(protowire.AppendTag(buf, num, protowire.VarintType), v)
}

func appendBool(buf []byte, num protowire.Number, v bool) []byte {
	if !v {
		return buf
	}
	return protowire.AppendVarint(protowire.AppendTag(buf, num, protowire.VarintType), 1)
}

func appendDouble(buf []byte, num protowire.Number, v float64) []byte {
	b := math.Float64bits(v)
	if b == 0 { // +0 only: -0 is sent, as proto.Marshal does
		return buf
	}
	return protowire.AppendFixed64(protowire.AppendTag(buf, num, protowire.Fixed64Type), b)
}

// validUTF8 is v with invalid UTF-8 replaced: proto3 strings must be valid
// UTF-8 (proto.Marshal refuses them, a router's decode fails on them), and
// one worker's bad name must not cost every router its snapshot.
func validUTF8(v string) string {
	if utf8.ValidString(v) {
		return v
	}
	return strings.ToValidUTF8(v, "\uFFFD")
}

// appendAck appends the WatchResponse acknowledging report seq, under
// epoch at the router's revision rev.
func appendAck(buf []byte, epoch string, rev, seq uint64) []byte {
	buf = appendString(buf, 1, epoch)
	buf = appendUint(buf, 2, rev)
	buf, m := openField(buf, 8) // report_ack
	buf = appendUint(buf, 1, seq)
	return closeField(buf, m)
}

// rawMessage is a message whose wire bytes are raw (an Empty's unknown
// fields): gRPC's codec copies them without parsing.
func rawMessage(raw []byte) proto.Message {
	m := &emptypb.Empty{}
	m.ProtoReflect().SetUnknown(raw)
	return m
}

// bufPool is encoding buffers by power-of-two size class.
type bufPool [maxBufClass + 1]sync.Pool

const (
	minBufClass = 12 // 4 KiB
	maxBufClass = 26 // 64 MiB; larger buffers are left to the GC
)

// get is an empty buffer of at least size bytes of capacity.
func (p *bufPool) get(size int) *[]byte {
	c := max(minBufClass, bits.Len(uint(max(size, 1)-1)))
	if c <= maxBufClass {
		if b, ok := p[c].Get().(*[]byte); ok {
			return b
		}
	}
	b := make([]byte, 0, 1<<c)
	return &b
}

// put keeps buf (grown from *b or not) for a later get.
func (p *bufPool) put(b *[]byte, buf []byte) {
	c := bits.Len(uint(cap(buf))) - 1 // the largest class it holds
	if c < minBufClass || c > maxBufClass {
		return
	}
	*b = buf[:0]
	p[c].Put(b)
}
