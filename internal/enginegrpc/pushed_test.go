package enginegrpc

import (
	"math"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	commonpb "github.com/smg-project/smg/gen/smg/grpc/common"
)

// TestReadPushed: a batch's load record is read, or refused with a reason
// when it cannot be believed; a batch without one is not a record.
func TestReadPushed(t *testing.T) {
	sec := func(v float64) *float64 { return &v }
	for _, tc := range []struct {
		name    string
		batch   *commonpb.KvEventBatch
		ok, bad bool
		silence *time.Duration
	}{
		{"no record (older servicer)", &commonpb.KvEventBatch{SequenceNumber: 3}, false, false, nil},
		{"plain", &commonpb.KvEventBatch{DpRank: proto.Int32(1), Load: &commonpb.PushedLoad{DpRank: 1, NumWaitingReqs: 2, TokenUsage: 0.3, MaxTotalNumTokens: 4096}}, true, false, nil},
		{"with silence", &commonpb.KvEventBatch{Load: &commonpb.PushedLoad{EngineSilenceSeconds: sec(2.5)}}, true, false, ptrDur(2500 * time.Millisecond)},
		{"zero silence is a figure", &commonpb.KvEventBatch{Load: &commonpb.PushedLoad{EngineSilenceSeconds: sec(0)}}, true, false, ptrDur(0)},
		{"unknown rank", &commonpb.KvEventBatch{Load: &commonpb.PushedLoad{DpRank: 5000}}, true, true, nil},
		{"rank 2^31-1", &commonpb.KvEventBatch{Load: &commonpb.PushedLoad{DpRank: math.MaxInt32}}, true, true, nil},
		{"negative rank", &commonpb.KvEventBatch{Load: &commonpb.PushedLoad{DpRank: -1}}, true, true, nil},
		{"another rank's record", &commonpb.KvEventBatch{DpRank: proto.Int32(0), Load: &commonpb.PushedLoad{DpRank: 1}}, true, true, nil},
		{"negative waiting", &commonpb.KvEventBatch{Load: &commonpb.PushedLoad{NumWaitingReqs: -4}}, true, true, nil},
		{"NaN usage", &commonpb.KvEventBatch{Load: &commonpb.PushedLoad{TokenUsage: math.NaN()}}, true, true, nil},
		{"usage 2^31", &commonpb.KvEventBatch{Load: &commonpb.PushedLoad{TokenUsage: 1 << 31}}, true, true, nil},
		{"NaN silence", &commonpb.KvEventBatch{Load: &commonpb.PushedLoad{EngineSilenceSeconds: sec(math.NaN())}}, true, true, nil},
		{"negative silence", &commonpb.KvEventBatch{Load: &commonpb.PushedLoad{EngineSilenceSeconds: sec(-1)}}, true, true, nil},
		{"silence 2^31 s", &commonpb.KvEventBatch{Load: &commonpb.PushedLoad{EngineSilenceSeconds: sec(1 << 31)}}, true, true, nil},
		{"negative KV capacity", &commonpb.KvEventBatch{Load: &commonpb.PushedLoad{MaxTotalNumTokens: -1}}, true, true, nil},
		{"negative prefill", &commonpb.KvEventBatch{Load: &commonpb.PushedLoad{PrefillTokensInHand: -1}}, true, true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, ok, err := ReadPushed(tc.batch)
			if ok != tc.ok || (err != nil) != tc.bad {
				t.Fatalf("ok %v err %v", ok, err)
			}
			if c := tc.batch.GetLoad().GetMaxTotalNumTokens(); !tc.bad && p.Load.KVCapacity != int64(c) {
				t.Fatalf("KV capacity %d, want %d", p.Load.KVCapacity, c)
			}
			if !tc.bad && ok && ((p.Silence == nil) != (tc.silence == nil) || (p.Silence != nil && *p.Silence != *tc.silence)) {
				t.Fatalf("silence %v, want %v", p.Silence, tc.silence)
			}
		})
	}
}

func ptrDur(d time.Duration) *time.Duration { return &d }

// TestRanksCover: a worker's poll tick is skipped only when every rank that
// pushes delivered within the interval; the merged record takes the longest
// silence, sums the prefill, and is a step wire only if every rank's is.
func TestRanksCover(t *testing.T) {
	t0 := time.Unix(1000, 0)
	iv := 10 * time.Second
	s := func(d time.Duration) *time.Duration { return &d }
	type push struct {
		rank int
		at   time.Duration
		p    Pushed
	}
	for _, tc := range []struct {
		name      string
		pushes    []push
		now       time.Duration
		covers    bool
		silence   *time.Duration
		prefill   int64
		step      bool
		afterStop bool
	}{
		{name: "nothing pushed: poll", now: 0, covers: false},
		{name: "one rank, fresh", pushes: []push{{0, 0, Pushed{StepWire: true}}}, now: 9 * time.Second, covers: true, step: true},
		{name: "one rank, interval passed", pushes: []push{{0, 0, Pushed{}}}, now: 10 * time.Second, covers: false},
		{name: "two ranks, one stale", pushes: []push{{0, 0, Pushed{}}, {1, 5 * time.Second, Pushed{}}}, now: 11 * time.Second, covers: false},
		{name: "two ranks, both fresh", pushes: []push{{0, 2 * time.Second, Pushed{Silence: s(time.Second), Prefill: 5, StepWire: true}}, {1, 5 * time.Second, Pushed{Silence: s(3 * time.Second), Prefill: 7}}},
			now: 11 * time.Second, covers: true, silence: s(3 * time.Second), prefill: 12},
		{name: "stream ended: poll takes over", pushes: []push{{0, 0, Pushed{}}}, now: time.Second, covers: false, afterStop: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r Ranks
			var m Merged
			for _, p := range tc.pushes {
				p.p.Load.Rank = p.rank
				var err error
				if m, err = r.Add(p.p, t0.Add(p.at)); err != nil {
					t.Fatal(err)
				}
			}
			if tc.afterStop {
				r.Reset()
			}
			if got := r.Covers(iv, t0.Add(tc.now)); got != tc.covers {
				t.Fatalf("covers %v", got)
			}
			if len(tc.pushes) == 0 || tc.afterStop {
				return
			}
			if len(m.Loads) != len(tc.pushes) || m.Prefill != tc.prefill || m.StepWire != tc.step ||
				(m.Silence == nil) != (tc.silence == nil) || (m.Silence != nil && *m.Silence != *tc.silence) {
				t.Fatalf("merged %+v", m)
			}
		})
	}
}
