package enginegrpc

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/smg-project/smg/internal/engine"
)

// Read polls GetLoads as one load report, bounded by engine.RequestTimeout
// when ctx has no earlier deadline (a servicer that never answers). A report
// with a rank that cannot be believed is no report: the engine answered
// (contact) but its load is not used.
func (c *Client) Read(ctx context.Context) (engine.Report, error) {
	if d, ok := ctx.Deadline(); !ok || time.Until(d) > engine.RequestTimeout {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, engine.RequestTimeout)
		defer cancel()
	}
	loads, err := c.Loads(ctx)
	if err != nil {
		return engine.Report{}, err
	}
	f, _ := c.Flavor(ctx)
	return ToReport(f, loads)
}

// ToReport turns a worker's ranks into a load report (sorted by rank, one
// entry per rank). Empty or absurd loads are engine.ErrNoReport.
func ToReport(flavor string, loads []RankLoad) (engine.Report, error) {
	if len(loads) == 0 {
		return engine.Report{}, fmt.Errorf("%w: GetLoads listed no rank", engine.ErrNoReport)
	}
	if len(loads) > MaxRanks {
		return engine.Report{}, fmt.Errorf("%w: GetLoads listed %d ranks (at most %d)", engine.ErrNoReport, len(loads), MaxRanks)
	}
	rep := engine.Report{Source: engine.SourceGRPCVLLM}
	if flavor == FlavorSGLang {
		rep.Source = engine.SourceGRPCSGLang
	}
	seen := map[int]bool{}
	for _, l := range loads {
		if err := l.Check(MaxRanks); err != nil {
			return engine.Report{}, fmt.Errorf("%w: %v", engine.ErrNoReport, err)
		}
		if seen[l.Rank] {
			return engine.Report{}, fmt.Errorf("%w: dp_rank %d listed twice", engine.ErrNoReport, l.Rank)
		}
		seen[l.Rank] = true
		rep.Ranks = append(rep.Ranks, engine.Rank{DPRank: l.Rank, Waiting: int64(l.Waiting), Running: int64(l.Running),
			TokenUsage: l.TokenUsage, GenThroughput: l.Throughput, CacheHitRate: l.CacheHitRate, MaxRunning: int64(l.MaxRunning), KVCapacity: l.KVCapacity})
	}
	slices.SortFunc(rep.Ranks, func(a, b engine.Rank) int { return a.DPRank - b.DPRank })
	return rep, nil
}

// MaxRanks bounds the DP ranks one worker may report.
const MaxRanks = 1024
