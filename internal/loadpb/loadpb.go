// Package loadpb converts an engine reader's Report into the wire form that
// the poller stores and agents push.
//
// It converts only; it neither polls nor judges.
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
			MaxRunningRequests: clamp32(r.MaxRunning),
		}
	}
	return &smgv1.EngineLoad{
		Source: string(rep.Source), Ranks: ranks,
		WaitingRequests: clamp32(rep.Waiting()), RunningRequests: clamp32(rep.Running()), TokenUsage: rep.TokenUsage(),
		MaxRunningRequests: clamp32(rep.MaxRunning()), ReportedAt: timestamppb.New(at),
	}
}

// clamp32 keeps a request count in the wire's int32 (counts are small; a
// corrupt value must not wrap negative).
func clamp32(n int64) int32 { return int32(min(max(n, 0), math.MaxInt32)) }
