package scale

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// The control plane must receive from the synthetic agents exactly what the
// generated client sent before they encoded their own messages: the same
// bytes as proto.Marshal of the same ReportRequest, for one record or
// many, with and without sent_at, zero and non-zero values.
func TestReportEncoderMatchesMarshal(t *testing.T) {
	const base, lo, hi = "http://127.0.0.1:1", 40, 140
	enc := newReportEncoder(base, lo, hi)
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 500 {
		n := 1 + rng.IntN(30)
		if round%3 == 0 {
			n = 1
		}
		at := time.Unix(1_790_000_000+rng.Int64N(1_000_000), rng.Int64N(1e9))
		if round%7 == 0 {
			at = time.Unix(at.Unix(), 0) // no nanos: the field is left out
		}
		var sentAt time.Time
		if round%2 == 0 {
			sentAt = at.Add(time.Duration(rng.Int64N(int64(time.Millisecond))))
		}
		enc.begin()
		var recs []*smgv1.LoadRecord
		for range n {
			w := lo + rng.IntN(hi-lo)
			r := rankLoad{waiting: rng.Int32N(3), running: rng.Int32N(20), tokenUsage: rng.Float64()}
			switch rng.IntN(5) {
			case 0:
				r.waiting = 1 << 20 // over the threshold, a longer varint
			case 1:
				r.tokenUsage = 0
			}
			enc.record(w, r, at)
			recs = append(recs, &smgv1.LoadRecord{
				WorkerUrl: workerURL(base, w),
				Load: &smgv1.EngineLoad{Source: loadSource, Ranks: []*smgv1.RankLoad{{
					WaitingRequests: r.waiting, RunningRequests: r.running, TokenUsage: r.tokenUsage,
				}}},
				ObservedAt: timestamppb.New(at),
			})
		}
		want := &smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Records{Records: &smgv1.LoadRecords{Records: recs}}}
		if n == 1 {
			want = &smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Record{Record: recs[0]}}
		}
		if !sentAt.IsZero() {
			want.SentAt = timestamppb.New(sentAt)
		}
		wantBytes, err := proto.MarshalOptions{Deterministic: true}.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		got := enc.message(sentAt)
		if !bytes.Equal(got, wantBytes) {
			t.Logf("got  %x\nwant %x", got, wantBytes)
			var decoded smgv1.ReportRequest
			err := proto.Unmarshal(got, &decoded)
			t.Fatalf("round %d (%d records): encoded %d bytes, proto.Marshal %d; decoded %v (err %v), want %v",
				round, n, len(got), len(wantBytes), &decoded, err, want)
		}
	}
	enc.begin()
	if m := enc.message(time.Now()); m != nil {
		t.Fatalf("a message with no record: %x, want none", m)
	}
}
