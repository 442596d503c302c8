package scale

import (
	"fmt"
	"math"
	"time"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// The synthetic agents encode their ReportRequests with protowire straight
// into one buffer: the bytes proto.Marshal would produce for the same
// message (TestReportEncoderMatchesMarshal), without a struct, a timestamp,
// a URL string or a marshal per record. 100 agent streams at 200,000
// reports/s share the box with the control plane they measure.

// Field numbers of agent.proto, load.proto and timestamp.proto.
const (
	fieldReportRecord     = 2 // ReportRequest.record
	fieldReportRecords    = 6 // ReportRequest.records
	fieldReportSentAt     = 7 // ReportRequest.sent_at
	fieldRecordsRecords   = 1 // LoadRecords.records
	fieldRecordURL        = 1 // LoadRecord.worker_url
	fieldRecordLoad       = 2 // LoadRecord.load
	fieldRecordObservedAt = 6 // LoadRecord.observed_at
	fieldLoadSource       = 1 // EngineLoad.source
	fieldLoadRanks        = 2 // EngineLoad.ranks
	fieldRankWaiting      = 2 // RankLoad.waiting_requests
	fieldRankRunning      = 3 // RankLoad.running_requests
	fieldRankTokenUsage   = 4 // RankLoad.token_usage
	fieldTimestampSeconds = 1
	fieldTimestampNanos   = 2
)

// loadSource is EngineLoad.source of every synthetic record.
const loadSource = "scale"

// rankLoad is the one rank a synthetic record reports.
type rankLoad struct {
	waiting, running int32
	tokenUsage       float64
}

// reportEncoder builds one ReportRequest at a time: begin, a record per
// worker, then message. Its buffers are reused from message to message.
type reportEncoder struct {
	urls [][]byte // by worker - lo: worker_url's field, tag and length included
	lo   int

	recs []byte // the records so far, each as a LoadRecords.records field
	n    int    // records so far
	rec  []byte // one record's body
	sub  []byte // a nested message's body
	msg  []byte // the message
}

func newReportEncoder(base string, lo, hi int) *reportEncoder {
	e := &reportEncoder{lo: lo, urls: make([][]byte, hi-lo)}
	for w := lo; w < hi; w++ {
		e.urls[w-lo] = protowire.AppendString(protowire.AppendTag(nil, fieldRecordURL, protowire.BytesType), workerURL(base, w))
	}
	return e
}

// begin starts a message.
func (e *reportEncoder) begin() { e.recs, e.n = e.recs[:0], 0 }

// record adds worker w's load, observed at.
func (e *reportEncoder) record(w int, r rankLoad, at time.Time) {
	var rb [32]byte
	rank := appendVarintField(rb[:0], fieldRankWaiting, uint64(int64(r.waiting)))
	rank = appendVarintField(rank, fieldRankRunning, uint64(int64(r.running)))
	if r.tokenUsage != 0 {
		rank = protowire.AppendTag(rank, fieldRankTokenUsage, protowire.Fixed64Type)
		rank = protowire.AppendFixed64(rank, math.Float64bits(r.tokenUsage))
	}
	// Inside out: the rank, the load around it, the record around that.
	e.sub = e.sub[:0]
	e.sub = protowire.AppendTag(e.sub, fieldLoadSource, protowire.BytesType)
	e.sub = protowire.AppendString(e.sub, loadSource)
	e.sub = protowire.AppendTag(e.sub, fieldLoadRanks, protowire.BytesType)
	e.sub = protowire.AppendBytes(e.sub, rank)

	e.rec = append(e.rec[:0], e.urls[w-e.lo]...)
	e.rec = protowire.AppendTag(e.rec, fieldRecordLoad, protowire.BytesType)
	e.rec = protowire.AppendBytes(e.rec, e.sub)
	e.rec = appendTimestampField(e.rec, fieldRecordObservedAt, at)

	e.recs = protowire.AppendTag(e.recs, fieldRecordsRecords, protowire.BytesType)
	e.recs = protowire.AppendBytes(e.recs, e.rec)
	e.n++
}

// message is the ReportRequest of the records added since begin: one
// record as ReportRequest.record, several as ReportRequest.records;
// sent_at when sentAt is not zero. Nil when there is no record. Valid until
// the next begin.
func (e *reportEncoder) message(sentAt time.Time) []byte {
	e.msg = e.msg[:0]
	if e.n == 0 {
		return nil
	}
	// proto.Marshal writes a oneof after the other fields: sent_at first.
	if !sentAt.IsZero() {
		e.msg = appendTimestampField(e.msg, fieldReportSentAt, sentAt)
	}
	if e.n == 1 { // recs holds one LoadRecords.records field: its value is the record
		_, _, n := protowire.ConsumeTag(e.recs)
		e.msg = protowire.AppendTag(e.msg, fieldReportRecord, protowire.BytesType)
		return append(e.msg, e.recs[n:]...)
	}
	e.msg = protowire.AppendTag(e.msg, fieldReportRecords, protowire.BytesType)
	return protowire.AppendBytes(e.msg, e.recs)
}

func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 { // proto3: a zero is not sent
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}

// appendTimestampField appends a google.protobuf.Timestamp field.
func appendTimestampField(b []byte, num protowire.Number, t time.Time) []byte {
	var ts [24]byte
	body := appendVarintField(ts[:0], fieldTimestampSeconds, uint64(t.Unix()))
	body = appendVarintField(body, fieldTimestampNanos, uint64(int64(t.Nanosecond())))
	return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), body)
}

// encoded is a message already in its wire form (rawCodec sends it as is).
type encoded []byte

// rawCodec is the synthetic agents' codec: an encoded goes out as its bytes
// (copied into a buffer of gRPC's pool, which gRPC frees once written, so
// the encoder can reuse its own at once); any other proto message is
// marshalled. Received messages are dropped: the agents ignore the control
// plane's assignments. It names itself "proto", so the control plane reads
// it as any agent.
type rawCodec struct{}

var _ encoding.CodecV2 = rawCodec{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	switch m := v.(type) {
	case encoded:
		pool := mem.DefaultBufferPool()
		buf := pool.Get(len(m))
		copy(*buf, m)
		return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
	case proto.Message:
		b, err := proto.Marshal(m)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	return nil, fmt.Errorf("raw codec: cannot marshal %T", v)
}

func (rawCodec) Unmarshal(mem.BufferSlice, any) error { return nil }
