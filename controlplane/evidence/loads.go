package evidence

import (
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// Report takes one load report for a worker, and ownership of load. A nil
// or empty report is "no report": the veto clears (fail open). The signals
// are the ranks' (loadpb.Signals), whatever aggregates the sender set.
func (in *Inbox) Report(workerID string, load *smgv1.EngineLoad) error {
	return in.report(workerID, load, false)
}

// ReportCopy is Report of a copy of load, which stays the caller's, made
// in the worker's pending load or spare: no allocation per report.
func (in *Inbox) ReportCopy(workerID string, load *smgv1.EngineLoad) error {
	return in.report(workerID, load, true)
}

func (in *Inbox) report(workerID string, load *smgv1.EngineLoad, copied bool) error {
	if load == nil || len(load.GetRanks()) == 0 {
		return in.NoReport(workerID)
	}
	w := in.reg.Get(workerID)
	if w == nil {
		return ErrUnknownWorker
	}
	return in.pend(workerID, w, nil, load, copied, nil)
}

// setLoad stores a report on c, a clone.
func setLoad(c *registry.Worker, load *smgv1.EngineLoad) {
	c.Load = load
	c.LoadRevision++
	c.Evidence.NoReport = false
}

// Refresh records an answer that confirms the stored load: the
// LoadRevision moves at the next flush (at once without Coalesce) unless a
// newer load does. Routers count dispatches since a worker's last load
// revision: an engine whose figures stay the same would collect them
// without end and be routed around.
func (in *Inbox) Refresh(workerID string) error {
	w := in.reg.Get(workerID)
	if w == nil {
		return ErrUnknownWorker
	}
	for in.cellOf(workerID, w).pendRefresh() {
	}
	if in.opts.Coalesce {
		return nil
	}
	return in.commit([]string{workerID}, nil)
}

// NoReport records a poll that produced no report: the overload veto
// clears at once.
func (in *Inbox) NoReport(workerID string) error {
	w := in.reg.Get(workerID)
	if w == nil {
		return ErrUnknownWorker
	}
	for in.cellOf(workerID, w).pendNoReport() {
	}
	return in.commit([]string{workerID}, nil)
}

// Rebuild clears the overload veto of every worker (the monitor lost its
// state): reset gives each worker's record without it (nil: marked "no
// report", its last load kept). What the cells held is dropped in the same
// transaction; what came while it ran is judged again after it.
func (in *Inbox) Rebuild(why string, reset func(*registry.Worker) *registry.Worker) {
	in.fmu.Lock()
	defer in.fmu.Unlock()
	n, workers := 0, 0
	_, err := in.reg.Update(func(t *registry.Txn) error {
		ws := t.Workers()
		n, workers = 0, len(ws)
		in.cells.Range(func(_ string, c *Slot) bool { c.drop(); return true })
		for _, w := range ws {
			if w.Overloaded {
				n++
			}
			if reset != nil {
				t.Insert(reset(w))
				continue
			}
			if w.Evidence.NoReport {
				continue
			}
			c := w.Clone()
			c.Evidence.NoReport = true
			t.Insert(c)
		}
		return nil
	})
	in.done(nil, err)
	in.log.Warn("Load monitor rebuilt its state: overload vetoes cleared for every worker", "reason", why, "workers", workers, "cleared", n)
	in.cells.Range(func(id string, _ *Slot) bool { in.judgeAgain(id); return true })
}

// loadBlock is a copied load with room for one rank and its timestamp: one
// allocation for the common load.
type loadBlock struct {
	load  smgv1.EngineLoad
	ranks [1]*smgv1.RankLoad
	rank  smgv1.RankLoad
	at    timestamppb.Timestamp
}

// newLoad returns an empty load in one loadBlock.
func newLoad() *smgv1.EngineLoad {
	blk := &loadBlock{}
	blk.ranks[0] = &blk.rank
	blk.load.Ranks = blk.ranks[:0]
	blk.load.ReportedAt = &blk.at
	return &blk.load
}

// CopyLoad copies every known field of src into dst (the caller's alone;
// nil: a new load), reusing its ranks and timestamp, and returns it.
func CopyLoad(dst, src *smgv1.EngineLoad) *smgv1.EngineLoad {
	if dst == nil {
		dst = newLoad()
	}
	dst.Source = src.GetSource()
	dst.WaitingRequests, dst.RunningRequests = src.GetWaitingRequests(), src.GetRunningRequests()
	dst.TokenUsage, dst.MaxRunningRequests = src.GetTokenUsage(), src.GetMaxRunningRequests()
	dst.KvCapacityTokens, dst.ProcessStartTimeSeconds = src.GetKvCapacityTokens(), src.GetProcessStartTimeSeconds()
	if at := src.GetReportedAt(); at != nil {
		if dst.ReportedAt == nil {
			dst.ReportedAt = &timestamppb.Timestamp{}
		}
		dst.ReportedAt.Seconds, dst.ReportedAt.Nanos = at.GetSeconds(), at.GetNanos()
	} else {
		dst.ReportedAt = nil
	}
	ranks := dst.Ranks[:0]
	for i, s := range src.GetRanks() {
		var r *smgv1.RankLoad
		if i < cap(ranks) && ranks[:i+1][i] != nil {
			r = ranks[:i+1][i]
		} else {
			r = &smgv1.RankLoad{}
		}
		r.DpRank, r.WaitingRequests, r.RunningRequests = s.GetDpRank(), s.GetWaitingRequests(), s.GetRunningRequests()
		r.TokenUsage, r.GenThroughput, r.CacheHitRate = s.GetTokenUsage(), s.GetGenThroughput(), s.GetCacheHitRate()
		r.MaxRunningRequests, r.KvCapacityTokens = s.GetMaxRunningRequests(), s.GetKvCapacityTokens()
		ranks = append(ranks, r)
	}
	dst.Ranks = ranks
	return dst
}
