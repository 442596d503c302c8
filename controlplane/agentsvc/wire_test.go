package agentsvc

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/testutil"
)

// checkDecode holds the stream's decoder to proto.Unmarshal on data: what
// it accepts, proto.Unmarshal accepts and decodes to the same records
// (unknown fields aside); a records message proto.Unmarshal accepts, it
// accepts too (anything else goes to proto.Unmarshal).
func checkDecode(t *testing.T, d *recordsDecoder, data []byte) {
	t.Helper()
	ref := &smgv1.ReportRequest{}
	refErr := proto.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(data, ref)
	recs, sentAt, ok := d.decode(data)
	if !ok {
		if refErr == nil && recordsShaped(data) {
			t.Fatalf("decoder declined a records message proto.Unmarshal accepts: %x", data)
		}
		return
	}
	if refErr != nil {
		t.Fatalf("decoder accepted what proto.Unmarshal rejects (%v): %x", refErr, data)
	}
	var wantSent time.Time
	if ts := ref.GetSentAt(); ts != nil {
		wantSent = ts.AsTime()
	}
	if !sentAt.Equal(wantSent) {
		t.Fatalf("sent_at %v, proto.Unmarshal's %v: %x", sentAt, wantSent, data)
	}
	var want []*smgv1.LoadRecord
	switch m := ref.Msg.(type) {
	case *smgv1.ReportRequest_Record:
		want = []*smgv1.LoadRecord{m.Record}
	case *smgv1.ReportRequest_Records:
		want = m.Records.GetRecords()
	default:
		t.Fatalf("decoder took a %T message: %x", ref.Msg, data)
	}
	if len(recs) != len(want) {
		t.Fatalf("decoded %d records, proto.Unmarshal %d: %x", len(recs), len(want), data)
	}
	det := proto.MarshalOptions{Deterministic: true}
	for i, r := range recs {
		got, err := det.Marshal(r.own())
		if err != nil {
			t.Fatal(err)
		}
		exp, err := det.Marshal(want[i])
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, exp) { // bytes, not proto.Equal: a NaN equals itself
			t.Fatalf("record %d decodes to %v, proto.Unmarshal to %v: %x", i, r.own(), want[i], data)
		}
	}
}

// recordsShaped reports whether data's fields are all LoadRecords (6) or
// one LoadRecord (2), each length-delimited.
func recordsShaped(data []byte) bool {
	single, batches := 0, 0
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeField(data)
		if n < 0 || typ != protowire.BytesType {
			return false
		}
		switch num {
		case 2:
			single++
		case 6:
			batches++
		case 7:
		default:
			return false
		}
		data = data[n:]
	}
	return (single == 1 && batches == 0) || (single == 0 && batches > 0)
}

// randomRequest is a ReportRequest with every field of its records set at
// random (from the schema), sent_at or not, sometimes followed by another message (the
// wire concatenation proto.Unmarshal merges).
func randomRequest(rng *rand.Rand) []byte {
	var out []byte
	for range 1 + rng.IntN(2) {
		var m proto.Message
		switch rng.IntN(5) {
		case 0:
			r := &smgv1.LoadRecord{}
			testutil.FillRandom(r, rng)
			m = &smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Record{Record: r}}
		case 1:
			m = &smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Event{Event: &smgv1.EngineEvent{WorkerUrl: "http://e:1"}}}
		default:
			rs := &smgv1.LoadRecords{}
			testutil.FillRandom(rs, rng)
			m = &smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Records{Records: rs}}
		}
		if rng.IntN(2) == 0 {
			at := &timestamppb.Timestamp{}
			testutil.FillRandom(at, rng)
			m.(*smgv1.ReportRequest).SentAt = at
		}
		b, err := proto.Marshal(m)
		if err != nil {
			panic(err)
		}
		out = append(out, b...)
	}
	return out
}

// mutate damages b: a byte changed, dropped or added, or a cut.
func mutate(b []byte, rng *rand.Rand) []byte {
	b = bytes.Clone(b)
	if len(b) == 0 {
		return []byte{byte(rng.Uint32())}
	}
	i := rng.IntN(len(b))
	switch rng.IntN(5) {
	case 0:
		b[i] = byte(rng.Uint32())
	case 1:
		b[i] ^= 1 << rng.IntN(8)
	case 2:
		b = append(b[:i], b[i+1:]...)
	case 3:
		b = append(b[:i], append([]byte{byte(rng.Uint32())}, b[i:]...)...)
	default:
		b = b[:i]
	}
	return b
}

func TestDecodeRecordsMatchesProtoUnmarshal(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 15))
	var d recordsDecoder // one decoder throughout: reuse must not leak a record into the next
	for range 3000 {
		data := randomRequest(rng)
		checkDecode(t, &d, data)
		for range 3 {
			data = mutate(data, rng)
			checkDecode(t, &d, data)
		}
	}
}

func TestDecodeRecordsEdgeCases(t *testing.T) {
	rec := func(fields ...[]byte) []byte { return bytes.Join(fields, nil) }
	field := func(num protowire.Number, v []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), v)
	}
	varint := func(num protowire.Number, v uint64) []byte {
		return protowire.AppendVarint(protowire.AppendTag(nil, num, protowire.VarintType), v)
	}
	rank := field(2, varint(2, 5))
	for name, data := range map[string][]byte{
		"one record":                field(2, rec(field(1, []byte("http://e:1")), field(2, rank))),
		"two batches merge":         rec(field(6, field(1, field(1, []byte("a")))), field(6, field(1, field(1, []byte("b"))))),
		"load twice merges ranks":   field(6, field(1, rec(field(2, rank), field(2, rec(rank, varint(3, 9)))))),
		"invalid UTF-8 url":         field(6, field(1, field(1, []byte{0xff, 0xfe}))),
		"invalid UTF-8 source":      field(6, field(1, field(2, field(1, []byte{0xc0})))),
		"field number 0":            field(6, field(1, varint(0, 1))),
		"end group in a record":     field(6, field(1, protowire.AppendTag(nil, 9, protowire.EndGroupType))),
		"field number past the max": field(6, field(1, varint(protowire.MaxValidNumber+1, 1))),
		"known field, other type":   field(6, field(1, rec(varint(1, 7), field(4, []byte("x")), varint(2, 3)))),
		"unknown group":             field(6, field(1, protowire.AppendTag(protowire.AppendTag(nil, 40, protowire.StartGroupType), 40, protowire.EndGroupType))),
		"unclosed group":            field(6, field(1, protowire.AppendTag(nil, 40, protowire.StartGroupType))),
		"overlong varint":           field(6, field(1, rec(protowire.AppendTag(nil, 5, protowire.VarintType), bytes.Repeat([]byte{0xff}, 10), []byte{1}))),
		"truncated length":          append(protowire.AppendTag(nil, 6, protowire.BytesType), 0x80),
		"record then batch":         rec(field(2, nil), field(6, nil)),
		"sent_at around a batch":    rec(field(7, varint(1, 5)), field(6, field(1, field(1, []byte("a")))), field(7, varint(2, 9))),
		"sent_at alone":             field(7, varint(1, 5)),
		"malformed sent_at":         rec(field(6, nil), field(7, varint(0, 5))),
		"empty message":             nil,
		"timestamps":                field(6, field(1, rec(field(6, rec(varint(1, 5), varint(2, 7))), field(3, varint(1, 1<<63))))),
		"reported_at in a load":     field(6, field(1, field(2, field(7, varint(2, 1))))),
		"doubles in a rank":         field(6, field(1, field(2, field(2, protowire.AppendFixed64(protowire.AppendTag(nil, 4, protowire.Fixed64Type), 1<<62))))),
		"token usage as a varint":   field(6, field(1, field(2, varint(5, 3)))),
		"negative int32 as 64 bits": field(6, field(1, field(2, varint(3, ^uint64(0))))),
		"hello (not records)":       field(1, field(1, []byte("n1"))),
	} {
		t.Run(name, func(t *testing.T) {
			var d recordsDecoder
			checkDecode(t, &d, data)
		})
	}
}

func FuzzDecodeRecords(f *testing.F) {
	rng := rand.New(rand.NewPCG(1, 5))
	for range 20 {
		f.Add(randomRequest(rng))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var d recordsDecoder
		checkDecode(t, &d, data)
		checkDecode(t, &d, data) // again, on a decoder that has been used
	})
}

func TestDecodeRecordsAllocatesNothingPerRecord(t *testing.T) {
	rs := &smgv1.LoadRecords{}
	for i := range 100 {
		r := record("http://e:8000", int32(i)).GetRecord()
		r.Load.ReportedAt = timestamppb.New(time.Unix(1_700_000_000, 5))
		rs.Records = append(rs.Records, r)
	}
	b, _ := proto.Marshal(&smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Records{Records: rs}})
	var d recordsDecoder
	d.decode(b)
	if n := testing.AllocsPerRun(100, func() {
		if recs, _, ok := d.decode(b); !ok || len(recs) != 100 {
			t.Fatal("not decoded")
		}
	}); n != 0 {
		t.Errorf("%v allocations per message of 100 records, want 0", n)
	}
}

// rawBytes sends bytes as they are (the legacy Marshal method), so a test
// can send what no proto.Marshal would write.
type rawBytes []byte

func (rawBytes) Reset()                     {}
func (rawBytes) String() string             { return "rawBytes" }
func (rawBytes) ProtoMessage()              {}
func (r rawBytes) Marshal() ([]byte, error) { return r, nil }

// A message that proto.Unmarshal would reject breaks the stream as gRPC's
// codec did (codes.Internal), applying none of its records, and the
// stream's engines record a connection failure; unknown fields are skipped.
func TestMalformedRecordsBreakTheStream(t *testing.T) {
	cfg := defaultConfig()
	cfg.liveness.StallSecs = 0
	h := start(t, cfg)
	h.put(t, worker("w1", "http://e1:8000", "n1"), worker("w2", "http://e2:8000", "n1"))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	st, _ := h.open(t, ctx, &smgv1.AgentHello{Node: "n1"})

	good, _ := proto.Marshal(record("http://e1:8000", 6).GetRecord())
	unknown := protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 1)
	batch := func(recs ...[]byte) []byte {
		var inner []byte
		for _, r := range recs {
			inner = protowire.AppendBytes(protowire.AppendTag(inner, 1, protowire.BytesType), r)
		}
		return protowire.AppendBytes(protowire.AppendTag(nil, 6, protowire.BytesType), inner)
	}
	if err := st.SendMsg(rawBytes(batch(append(bytes.Clone(good), unknown...)))); err != nil {
		t.Fatal(err)
	}
	h.waitFor(t, "the record with an unknown field applied", func(s *registry.Snapshot) bool {
		return s.Get("w1").Overloaded && s.Get("w1").AgentNode == "n1"
	})

	good2, _ := proto.Marshal(record("http://e2:8000", 9).GetRecord())
	badURL := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), []byte{0xff})
	if err := st.SendMsg(rawBytes(batch(good2, badURL))); err != nil {
		t.Fatal(err)
	}
	_, err := st.Recv()
	if status.Code(err) != codes.Internal {
		t.Fatalf("stream ended with %v, want Internal (a message that does not decode)", err)
	}
	h.waitFor(t, "the stream's engines unreachable", func(s *registry.Snapshot) bool {
		return s.Get("w1").Liveness == smgv1.Veto_VETO_UNREACHABLE
	})
	if w2 := h.reg.Get("w2"); w2.Load != nil {
		t.Fatalf("a record of the malformed message was applied: %v", w2.Load)
	}
}

// BenchmarkDecodeRecords decodes a LoadRecords of 100 records as agents
// send them (a load of one rank, its time, the record's time); ns/op and
// allocs/op are per record, against proto.Unmarshal.
func BenchmarkDecodeRecords(b *testing.B) {
	rs := &smgv1.LoadRecords{}
	at := timestamppb.New(time.Unix(1_700_000_000, 5))
	for i := range 100 {
		r := record(fmt.Sprintf("http://10.0.%d.%d:8000", i/250, i%250), int32(i%4)).GetRecord()
		r.Load.ReportedAt, r.ObservedAt = at, at
		rs.Records = append(rs.Records, r)
	}
	data, _ := proto.Marshal(&smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Records{Records: rs}})
	b.Run("decoder", func(b *testing.B) {
		var d recordsDecoder
		b.ReportAllocs()
		for b.Loop() {
			d.decode(data)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(100*b.N), "ns/record")
	})
	b.Run("proto.Unmarshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := proto.Unmarshal(data, &smgv1.ReportRequest{}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(100*b.N), "ns/record")
	})
}
