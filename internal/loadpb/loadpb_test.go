package loadpb

import (
	"math"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/engine"
)

// Clamp leaves a sane load as it is and makes every insane number one a load
// can have.
func TestClamp(t *testing.T) {
	sane := &smgv1.EngineLoad{Source: "vllm", WaitingRequests: 3, RunningRequests: 2, MaxRunningRequests: 8, TokenUsage: 0.5,
		Ranks: []*smgv1.RankLoad{{DpRank: 1, WaitingRequests: 3, RunningRequests: 2, MaxRunningRequests: 8, TokenUsage: 0.5, GenThroughput: 12.5, CacheHitRate: 0.25}}}
	if got := Clamp(proto.CloneOf(sane)); !proto.Equal(got, sane) {
		t.Errorf("Clamp changed a sane load: %v", got)
	}
	for _, c := range []struct {
		name       string
		in         float64
		usage, gen float64
	}{
		{"+Inf", math.Inf(1), 1, 0},
		{"-Inf", math.Inf(-1), 0, 0},
		{"NaN", math.NaN(), 0, 0},
		{"negative", -2, 0, 0},
		{"over 1", 7, 1, 7},
	} {
		l := Clamp(&smgv1.EngineLoad{RunningRequests: -1, MaxRunningRequests: -3, WaitingRequests: -9, TokenUsage: c.in, ProcessStartTimeSeconds: c.in,
			Ranks: []*smgv1.RankLoad{{DpRank: -1, RunningRequests: -1, MaxRunningRequests: -3, WaitingRequests: -9,
				TokenUsage: c.in, GenThroughput: c.in, CacheHitRate: c.in}}})
		r := l.Ranks[0]
		if l.RunningRequests != 0 || l.MaxRunningRequests != 0 || l.WaitingRequests != 0 || l.TokenUsage != c.usage ||
			r.DpRank != 0 || r.RunningRequests != 0 || r.MaxRunningRequests != 0 || r.WaitingRequests != 0 ||
			r.TokenUsage != c.usage || r.CacheHitRate != c.usage || r.GenThroughput != c.gen || l.ProcessStartTimeSeconds != c.gen {
			t.Errorf("%s: clamped to %v", c.name, l)
		}
	}
	many := &smgv1.EngineLoad{}
	for range MaxRanks + 5 {
		many.Ranks = append(many.Ranks, &smgv1.RankLoad{DpRank: 1 << 30})
	}
	if l := Clamp(many); len(l.Ranks) != MaxRanks || l.Ranks[0].DpRank != maxDPRank {
		t.Errorf("%d ranks, rank number %d: want %d ranks of at most %d", len(l.Ranks), l.Ranks[0].DpRank, MaxRanks, maxDPRank)
	}
}

// A polled report's engine start time reaches the load.
func TestFromReportStartTime(t *testing.T) {
	rep := engine.Report{Source: "vllm", Ranks: []engine.Rank{{Running: 1}}, StartTime: 1.7e9}
	if got := FromReport(rep, time.Unix(1, 0)).GetProcessStartTimeSeconds(); got != 1.7e9 {
		t.Errorf("process_start_time_seconds = %v, want 1.7e9", got)
	}
}

// A polled report goes through Clamp too: what the poller stores is what an
// agent's push of the same numbers stores.
func TestFromReportIsClamped(t *testing.T) {
	rep := engine.Report{Source: "vllm", Ranks: []engine.Rank{{Waiting: -4, Running: -1, MaxRunning: -3, TokenUsage: math.Inf(1), GenThroughput: math.NaN()}}}
	got := FromReport(rep, time.Unix(1, 0))
	pushed := Clamp(&smgv1.EngineLoad{Source: "vllm", WaitingRequests: -4, RunningRequests: -1, MaxRunningRequests: -3, TokenUsage: math.Inf(1),
		Ranks:      []*smgv1.RankLoad{{WaitingRequests: -4, RunningRequests: -1, MaxRunningRequests: -3, TokenUsage: math.Inf(1), GenThroughput: math.NaN()}},
		ReportedAt: got.ReportedAt})
	if !proto.Equal(got, pushed) {
		t.Errorf("polled %v\npushed %v", got, pushed)
	}
}

// The signals are the ranks' waiting summed and token usage averaged, the
// same whether the poller converts a report or the control plane reads a
// pushed load's ranks.
func TestSignals(t *testing.T) {
	rep := engine.Report{Source: engine.SourceVLLM, Ranks: []engine.Rank{
		{DPRank: 0, Waiting: 3, Running: 10, TokenUsage: 0.5},
		{DPRank: 1, Waiting: 5, Running: 12, TokenUsage: 0.9},
	}}
	l := FromReport(rep, time.Unix(1, 0))
	if l.GetWaitingRequests() != 8 || math.Abs(l.GetTokenUsage()-0.7) > 1e-12 {
		t.Fatalf("FromReport aggregates: waiting %d usage %v, want 8 and 0.7", l.GetWaitingRequests(), l.GetTokenUsage())
	}
	l.Ranks[0].WaitingRequests = -4 // a hostile sender's
	if w, u := Signals(l.Ranks); w != 5 || math.Abs(u-0.7) > 1e-12 {
		t.Fatalf("Signals: waiting %d usage %v, want 5 (a negative rank reads 0) and 0.7", w, u)
	}
	if w, u := Signals(nil); w != 0 || u != 0 {
		t.Fatalf("Signals of no ranks: %d %v, want 0 0", w, u)
	}
}
