package agentsvc

import (
	"errors"
	"math"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// rawRequest receives a ReportRequest's wire bytes (protobuf-go calls the
// legacy Unmarshal method of a message that has one), for recordsDecoder;
// they are copied, as the codec frees its buffer when Unmarshal returns.
type rawRequest struct{ buf []byte }

func (r *rawRequest) Reset()         { r.buf = r.buf[:0] }
func (r *rawRequest) String() string { return "agentsvc.rawRequest" }
func (r *rawRequest) ProtoMessage()  {}

func (r *rawRequest) Unmarshal(b []byte) error {
	r.buf = append(r.buf[:0], b...)
	return nil
}

// maxKeptBuffer bounds the receive buffer a stream keeps between messages:
// one large message must not pin its size for the life of the stream.
const maxKeptBuffer = 256 << 10

func (r *rawRequest) release() {
	if cap(r.buf) > maxKeptBuffer {
		r.buf = nil
	}
}

// wireRecord is a LoadRecord as the stream reads it: url aliases the
// message's bytes, and load, silence and observedAt point into the record's
// own buffers, reused by the next message; own makes a LoadRecord to keep.
type wireRecord struct {
	url        []byte
	load       *smgv1.EngineLoad      // nil, or &loadBuf
	silence    *durationpb.Duration   // nil, or &silenceBuf
	observedAt *timestamppb.Timestamp // nil, or &observedBuf
	stepWire   bool
	prefill    int64

	loadBuf     smgv1.EngineLoad
	reportedBuf timestamppb.Timestamp
	silenceBuf  durationpb.Duration
	observedBuf timestamppb.Timestamp
}

// maxKeptRanks bounds the ranks a record keeps for reuse.
const maxKeptRanks = 64

// setProto makes r the record p (decoded by proto.Unmarshal); r aliases p.
func (r *wireRecord) setProto(p *smgv1.LoadRecord) {
	r.url = append(r.url[:0], p.GetWorkerUrl()...)
	r.load, r.silence, r.observedAt = p.GetLoad(), p.GetEngineSilence(), p.GetObservedAt()
	r.stepWire, r.prefill = p.GetStepWire(), p.GetPrefillTokensInHand()
}

// own returns a LoadRecord of r's content that the caller may keep (a nil
// message clones to nil).
func (r *wireRecord) own() *smgv1.LoadRecord {
	return &smgv1.LoadRecord{WorkerUrl: string(r.url), StepWire: r.stepWire, PrefillTokensInHand: r.prefill,
		Load: proto.CloneOf(r.load), EngineSilence: proto.CloneOf(r.silence), ObservedAt: proto.CloneOf(r.observedAt)}
}

// recordsDecoder decodes a ReportRequest of load records into records it
// reuses, with no allocation per record. It accepts what proto.Unmarshal
// accepts and yields what it yields, unknown fields left out
// (FuzzDecodeRecords, TestDecodeRecordsReadsEveryField).
type recordsDecoder struct {
	recs   []*wireRecord
	source string // the latest load source, reused while it repeats
	sent   timestamppb.Timestamp
}

// errWire is a record proto.Unmarshal would reject; the caller decodes the
// message with proto.Unmarshal again for its error.
var errWire = errors.New("agentsvc: malformed record")

// maxKeptRecords bounds the records a decoder keeps for reuse.
const maxKeptRecords = 4096

// decode returns the records of b when b is a ReportRequest whose every
// field is a LoadRecords (merged, their records in order) or whose one
// field is a LoadRecord, and its sent_at (zero when unset); ok is false for
// any other message, and for a malformed one (proto.Unmarshal says why).
func (d *recordsDecoder) decode(b []byte) (recs []*wireRecord, sentAt time.Time, ok bool) {
	if len(d.recs) > maxKeptRecords {
		d.recs = nil
	}
	single, batches, n, hasSent := 0, 0, 0, false
	d.sent.Seconds, d.sent.Nanos = 0, 0
	fr := fieldReader{b: b}
	for fr.next() {
		var err error
		switch f := &fr.f; {
		case f.is(2, protowire.BytesType):
			single++
			err = d.record(f.p, n)
			n++
		case f.is(6, protowire.BytesType):
			batches++
			n, err = d.records(f.p, n)
		case f.is(7, protowire.BytesType):
			hasSent = true
			err = secondsNanos(f.p, &d.sent.Seconds, &d.sent.Nanos)
		default:
			return nil, sentAt, false
		}
		if err != nil {
			return nil, sentAt, false
		}
	}
	if fr.err != nil || !(single == 1 && batches == 0) && !(single == 0 && batches > 0) {
		return nil, sentAt, false
	}
	if hasSent {
		sentAt = d.sent.AsTime()
	}
	return d.recs[:n], sentAt, true
}

// records decodes a LoadRecords into the records from index n on and
// returns the index after its last.
func (d *recordsDecoder) records(b []byte, n int) (int, error) {
	fr := fieldReader{b: b}
	for fr.next() {
		if fr.f.is(1, protowire.BytesType) {
			if err := d.record(fr.f.p, n); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, fr.err
}

// record decodes a LoadRecord into the record at index n, reused.
func (d *recordsDecoder) record(b []byte, n int) error {
	if n == len(d.recs) {
		d.recs = append(d.recs, &wireRecord{})
	}
	r := d.recs[n]
	r.url, r.load, r.silence, r.observedAt = nil, nil, nil, nil
	r.stepWire, r.prefill = false, 0
	fr := fieldReader{b: b}
	for fr.next() {
		switch f := &fr.f; {
		case f.is(1, protowire.BytesType):
			if !utf8.Valid(f.p) {
				return errWire
			}
			r.url = f.p
		case f.is(2, protowire.BytesType):
			if r.load == nil { // a second occurrence merges into the first
				ranks := r.loadBuf.Ranks[:0]
				if cap(ranks) > maxKeptRanks {
					ranks = nil
				}
				clearLoad(&r.loadBuf, ranks)
				r.load = &r.loadBuf
			}
			if err := d.load(f.p, r.load, &r.reportedBuf); err != nil {
				return err
			}
		case f.is(3, protowire.BytesType):
			if r.silence == nil {
				r.silenceBuf.Seconds, r.silenceBuf.Nanos = 0, 0
				r.silence = &r.silenceBuf
			}
			if err := secondsNanos(f.p, &r.silence.Seconds, &r.silence.Nanos); err != nil {
				return err
			}
		case f.is(4, protowire.VarintType):
			r.stepWire = f.v != 0
		case f.is(5, protowire.VarintType):
			r.prefill = int64(f.v)
		case f.is(6, protowire.BytesType):
			if r.observedAt == nil {
				r.observedBuf.Seconds, r.observedBuf.Nanos = 0, 0
				r.observedAt = &r.observedBuf
			}
			if err := secondsNanos(f.p, &r.observedAt.Seconds, &r.observedAt.Nanos); err != nil {
				return err
			}
		}
	}
	return fr.err
}

// load decodes an EngineLoad into l, merging (as a repeated occurrence
// merges); its reported_at goes to ts.
func (d *recordsDecoder) load(b []byte, l *smgv1.EngineLoad, ts *timestamppb.Timestamp) error {
	fr := fieldReader{b: b}
	for fr.next() {
		switch f := &fr.f; {
		case f.is(1, protowire.BytesType):
			if !utf8.Valid(f.p) {
				return errWire
			}
			if string(f.p) != d.source {
				d.source = string(f.p)
			}
			l.Source = d.source
		case f.is(2, protowire.BytesType):
			if err := rank(f.p, nextRank(l)); err != nil {
				return err
			}
		case f.is(3, protowire.VarintType):
			l.WaitingRequests = int32(f.v)
		case f.is(4, protowire.VarintType):
			l.RunningRequests = int32(f.v)
		case f.is(5, protowire.Fixed64Type):
			l.TokenUsage = math.Float64frombits(f.v)
		case f.is(6, protowire.VarintType):
			l.MaxRunningRequests = int32(f.v)
		case f.is(8, protowire.VarintType):
			l.KvCapacityTokens = int64(f.v)
		case f.is(9, protowire.Fixed64Type):
			l.ProcessStartTimeSeconds = math.Float64frombits(f.v)
		case f.is(7, protowire.BytesType):
			if l.ReportedAt == nil {
				ts.Seconds, ts.Nanos = 0, 0
				l.ReportedAt = ts
			}
			if err := secondsNanos(f.p, &l.ReportedAt.Seconds, &l.ReportedAt.Nanos); err != nil {
				return err
			}
		}
	}
	return fr.err
}

// clearLoad empties l, keeping ranks' memory. Field by field, not Reset:
// Reset's atomic store of the message's type information costs more than
// decoding the record (these buffers are never used through reflection;
// TestDecodeRecordsMatchesProtoUnmarshal fails if a field is left over).
func clearLoad(l *smgv1.EngineLoad, ranks []*smgv1.RankLoad) {
	l.Source, l.Ranks, l.ReportedAt = "", ranks, nil
	l.WaitingRequests, l.RunningRequests, l.MaxRunningRequests, l.TokenUsage = 0, 0, 0, 0
	l.KvCapacityTokens, l.ProcessStartTimeSeconds = 0, 0
}

// nextRank appends a rank to l, reusing a RankLoad of an earlier record.
func nextRank(l *smgv1.EngineLoad) *smgv1.RankLoad {
	n := len(l.Ranks)
	if n < cap(l.Ranks) {
		l.Ranks = l.Ranks[:n+1]
		if r := l.Ranks[n]; r != nil {
			r.DpRank, r.WaitingRequests, r.RunningRequests, r.MaxRunningRequests = 0, 0, 0, 0
			r.TokenUsage, r.GenThroughput, r.CacheHitRate = 0, 0, 0
			r.KvCapacityTokens = 0
			return r
		}
	} else {
		l.Ranks = append(l.Ranks, nil)
	}
	r := &smgv1.RankLoad{}
	l.Ranks[n] = r
	return r
}

// rank decodes a RankLoad into r.
func rank(b []byte, r *smgv1.RankLoad) error {
	fr := fieldReader{b: b}
	for fr.next() {
		switch f := &fr.f; {
		case f.is(1, protowire.VarintType):
			r.DpRank = int32(f.v)
		case f.is(2, protowire.VarintType):
			r.WaitingRequests = int32(f.v)
		case f.is(3, protowire.VarintType):
			r.RunningRequests = int32(f.v)
		case f.is(4, protowire.Fixed64Type):
			r.TokenUsage = math.Float64frombits(f.v)
		case f.is(5, protowire.Fixed64Type):
			r.GenThroughput = math.Float64frombits(f.v)
		case f.is(6, protowire.Fixed64Type):
			r.CacheHitRate = math.Float64frombits(f.v)
		case f.is(7, protowire.VarintType):
			r.MaxRunningRequests = int32(f.v)
		case f.is(8, protowire.VarintType):
			r.KvCapacityTokens = int64(f.v)
		}
	}
	return fr.err
}

// secondsNanos decodes a Timestamp or a Duration (the same two fields),
// merging into seconds and nanos.
func secondsNanos(b []byte, seconds *int64, nanos *int32) error {
	fr := fieldReader{b: b}
	for fr.next() {
		switch f := &fr.f; {
		case f.is(1, protowire.VarintType):
			*seconds = int64(f.v)
		case f.is(2, protowire.VarintType):
			*nanos = int32(f.v)
		}
	}
	return fr.err
}

// fieldReader reads the fields of a message in order into f; next is false
// at the end of the message or at a malformed field (err).
type fieldReader struct {
	b   []byte
	f   wireField
	err error
}

func (r *fieldReader) next() bool {
	if len(r.b) == 0 {
		return false
	}
	n, err := nextField(r.b, &r.f)
	if err != nil {
		r.err = err
		return false
	}
	r.b = r.b[n:]
	return true
}

// wireField is one field of a message: a varint or fixed64 value in v, a
// length-delimited one in p.
type wireField struct {
	num protowire.Number
	typ protowire.Type
	v   uint64
	p   []byte
}

// is reports whether f is field num of wire type typ: a known field of
// another wire type is an unknown field to proto.Unmarshal (kept there,
// dropped here), as is any other number.
func (f wireField) is(num protowire.Number, typ protowire.Type) bool {
	return f.num == num && f.typ == typ
}

// nextField reads the first field of b (not empty) into f and returns its
// length, rejecting what proto.Unmarshal rejects: a field number out of
// range, an end-group tag (no group is open in a message field), a
// truncated or overlong value, a group never closed.
func nextField(b []byte, f *wireField) (n int, err error) {
	var t uint64
	tn := 1
	if b[0] < 0x80 {
		t = uint64(b[0])
	} else if t, tn = protowire.ConsumeVarint(b); tn < 0 {
		return 0, errWire
	}
	num, typ := t>>3, protowire.Type(t&7)
	if num < uint64(protowire.MinValidNumber) || num > uint64(protowire.MaxValidNumber) || typ == protowire.EndGroupType {
		return 0, errWire
	}
	f.num, f.typ = protowire.Number(num), typ
	b = b[tn:]
	var vn int
	switch typ {
	case protowire.VarintType:
		f.v, vn = protowire.ConsumeVarint(b)
	case protowire.Fixed64Type:
		f.v, vn = protowire.ConsumeFixed64(b)
	case protowire.BytesType:
		f.p, vn = protowire.ConsumeBytes(b)
	default: // groups and fixed32: no field read here has them
		vn = protowire.ConsumeFieldValue(f.num, typ, b)
	}
	if vn < 0 {
		return 0, errWire
	}
	return tn + vn, nil
}
