package watch

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// headCodec is a router that reads only a response's revision (field 2,
// near the front of the first buffer) and leaves the rest unparsed, with no
// allocation: what the benchmarks below measure is the control plane's
// side. Requests marshal as protobuf.
type headCodec struct{}

type head struct{ revision uint64 }

func (headCodec) Name() string { return protocodec.Name }

func (headCodec) Marshal(v any) (mem.BufferSlice, error) {
	return encoding.GetCodecV2(protocodec.Name).Marshal(v)
}

func (headCodec) Unmarshal(data mem.BufferSlice, v any) error {
	h := v.(*head)
	h.revision = 0
	if len(data) == 0 {
		return nil
	}
	b := data[0].ReadOnlyData()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if num == responseRevisionField && typ == protowire.VarintType {
			h.revision, _ = protowire.ConsumeVarint(b)
			return nil
		}
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
	}
	return nil
}

// responseRevisionField is WatchResponse.revision's field number.
const responseRevisionField = 2

// BenchmarkSnapshot10k is what a snapshot of a 10,000-worker registry costs
// the control plane, sent to one router over loopback gRPC (the router reads
// only the revision). One op:
//
//   - join: one worker's verdict flips (a new revision), then a router
//     joins and is sent the snapshot at it.
//   - load-refresh: every worker's load changes in one commit, then a
//     watching router is sent everything since: a snapshot, as a router's
//     load refresh at 10,000 workers reporting several times a second.
//   - load-commit: the same commit with no router watching (subtract it
//     from load-refresh for the watch's own cost).
func BenchmarkSnapshot10k(b *testing.B) {
	const n = 10000
	b.Run("join", func(b *testing.B) {
		reg := joinFleet(b, n)
		h := start(b, reg, Options{})
		b.ReportAllocs()
		defer cpuPerOp(b)()
		for i := 0; b.Loop(); i++ {
			rev := setOverloaded(b, reg, fmt.Sprintf("w%05d", i%n), i/n%2 == 0)
			ctx, cancel := context.WithCancel(context.Background())
			st := headStream(b, ctx, h, &smgv1.WatchHello{RouterId: "joiner"})
			var m head
			if err := st.RecvMsg(&m); err != nil || m.revision != rev {
				b.Fatalf("joined at %d (%v), want the snapshot at %d", m.revision, err, rev)
			}
			cancel()
		}
	})
	loads := func(b *testing.B, reg *registry.Registry, i int) uint64 {
		rev, err := reg.Update(func(tx *registry.Txn) error {
			for _, w := range reg.Snapshot().Workers() {
				c := w.Clone()
				c.Load = &smgv1.EngineLoad{WaitingRequests: int32(i % 3), RunningRequests: 8 + int32(i%8), TokenUsage: 0.1 + float64(i%40)/100}
				c.LoadRevision++
				tx.Insert(c)
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		return rev
	}
	b.Run("load-refresh", func(b *testing.B) {
		reg := joinFleet(b, n)
		h := start(b, reg, Options{LoadInterval: -1, HeartbeatInterval: 1 << 40})
		st := headStream(b, b.Context(), h, &smgv1.WatchHello{RouterId: "r"})
		var m head
		if err := st.RecvMsg(&m); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		defer cpuPerOp(b)()
		for i := 0; b.Loop(); i++ {
			rev := loads(b, reg, i)
			for m.revision != rev {
				if err := st.RecvMsg(&m); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run("load-commit", func(b *testing.B) {
		reg := joinFleet(b, n)
		b.ReportAllocs()
		defer cpuPerOp(b)()
		for i := 0; b.Loop(); i++ {
			loads(b, reg, i)
		}
	})
}

// headStream opens a watch stream whose responses are read with headCodec.
func headStream(b *testing.B, ctx context.Context, h *harness, hello *smgv1.WatchHello) grpc.ClientStream {
	st, err := h.conn.NewStream(ctx, &smgv1.WatchService_ServiceDesc.Streams[0], smgv1.WatchService_Watch_FullMethodName,
		grpc.ForceCodecV2(headCodec{}))
	if err == nil {
		err = st.SendMsg(&smgv1.WatchRequest{Msg: &smgv1.WatchRequest_Hello{Hello: hello}})
	}
	if err != nil {
		b.Fatal(err)
	}
	return st
}
