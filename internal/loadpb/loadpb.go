// Package loadpb converts an engine reader's Report into the wire form that
// the poller stores and agents push, and clamps that form's numbers: a load
// the control plane polled and one an agent pushed pass through the same
// Clamp before they are stored.
//
// It converts and clamps; it neither polls nor judges.
package loadpb

import (
	"math"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/engine"
)

// FromReport returns the EngineLoad of rep, read at at; nil for an empty report.
func FromReport(rep engine.Report, at time.Time) *smgv1.EngineLoad {
	if rep.Empty() {
		return nil
	}
	ranks := make([]*smgv1.RankLoad, len(rep.Ranks))
	for i, r := range rep.Ranks {
		ranks[i] = &smgv1.RankLoad{
			DpRank: int32(r.DPRank), WaitingRequests: clamp32(r.Waiting), RunningRequests: clamp32(r.Running),
			TokenUsage: r.TokenUsage, GenThroughput: r.GenThroughput, CacheHitRate: r.CacheHitRate,
			MaxRunningRequests: clamp32(r.MaxRunning), KvCapacityTokens: r.KVCapacity,
		}
	}
	l := Clamp(&smgv1.EngineLoad{
		Source: string(rep.Source), Ranks: ranks, RunningRequests: clamp32(rep.Running()),
		MaxRunningRequests: clamp32(rep.MaxRunning()), KvCapacityTokens: rep.KVCapacity(), ReportedAt: timestamppb.New(at),
		ProcessStartTimeSeconds: rep.StartTime,
	})
	waiting, usage := Signals(l.Ranks)
	l.WaitingRequests, l.TokenUsage = clamp32(waiting), usage
	return l
}

// Signals computes a load's two overload signals from its ranks: waiting
// requests summed and KV token usage averaged over them (a field a rank
// leaves out reads 0). It is the one aggregation of the rule: the control
// plane computes it over whatever aggregates a sender filled in.
func Signals(ranks []*smgv1.RankLoad) (waiting int64, tokenUsage float64) {
	if len(ranks) == 0 {
		return 0, 0
	}
	for _, r := range ranks {
		waiting += int64(max(r.GetWaitingRequests(), 0))
		tokenUsage += r.GetTokenUsage()
	}
	return waiting, tokenUsage / float64(len(ranks))
}

// MaxKVCapacity bounds a KV capacity in tokens (2^40: far above any engine's,
// and sums of many of them stay far from overflowing).
const MaxKVCapacity = 1 << 40

// MaxRanks bounds the ranks a load keeps (the engine reader keeps as many).
const MaxRanks = 1024

// maxDPRank bounds a rank's number (the engine reader reads no larger).
const maxDPRank = 1<<20 - 1

// Clamp makes l's numbers ones a load can have, in place, and returns l:
// counts are at least 0, usage and hit rate within [0, 1], throughput and
// process start time finite and at least 0 (NaN reads 0), rank numbers within [0, 2^20), and at most
// MaxRanks ranks. Every stored load passes through it, whoever read the
// engine: the poller (FromReport) or an agent (its pushed records).
func Clamp(l *smgv1.EngineLoad) *smgv1.EngineLoad {
	if l == nil {
		return nil
	}
	if len(l.Ranks) > MaxRanks {
		clear(l.Ranks[MaxRanks:])
		l.Ranks = l.Ranks[:MaxRanks]
	}
	for _, r := range l.Ranks {
		if r == nil {
			continue
		}
		r.DpRank = min(max(r.DpRank, 0), maxDPRank)
		r.WaitingRequests, r.RunningRequests = max(r.WaitingRequests, 0), max(r.RunningRequests, 0)
		r.MaxRunningRequests = max(r.MaxRunningRequests, 0)
		r.KvCapacityTokens = min(max(r.KvCapacityTokens, 0), MaxKVCapacity)
		r.TokenUsage, r.CacheHitRate, r.GenThroughput = fraction(r.TokenUsage), fraction(r.CacheHitRate), rate(r.GenThroughput)
	}
	l.WaitingRequests, l.RunningRequests = max(l.WaitingRequests, 0), max(l.RunningRequests, 0)
	l.MaxRunningRequests = max(l.MaxRunningRequests, 0)
	l.KvCapacityTokens = min(max(l.KvCapacityTokens, 0), MaxKVCapacity)
	l.TokenUsage = fraction(l.TokenUsage)
	l.ProcessStartTimeSeconds = rate(l.ProcessStartTimeSeconds)
	return l
}

// fraction keeps a ratio within [0, 1]; NaN reads 0.
func fraction(v float64) float64 {
	if !(v > 0) {
		return 0
	}
	return min(v, 1)
}

// rate keeps a finite rate of at least 0; anything else reads 0.
func rate(v float64) float64 {
	if !(v > 0) || math.IsInf(v, 1) {
		return 0
	}
	return v
}

// clamp32 keeps a request count in the wire's int32 (counts are small; a
// corrupt value must not wrap negative).
func clamp32(n int64) int32 { return int32(min(max(n, 0), math.MaxInt32)) }
