package agentsvc

import (
	"math"
	"testing"

	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// Numbers an agent pushes for its engines are clamped as the poller's own
// reads are (loadpb.Clamp): a negative count reads 0, an infinite usage 1, a
// NaN rate 0, whichever way the records arrive (one record, a batch).
func TestPushedNumbersClampedAsPolledOnes(t *testing.T) {
	h := start(t, defaultConfig())
	h.put(t, worker("w1", "http://127.0.0.1:8001", ""), worker("w2", "http://127.0.0.1:8002", ""))
	st, _ := h.open(t, t.Context(), &smgv1.AgentHello{Node: "n1"})
	hostile := func(url string) *smgv1.LoadRecord {
		return &smgv1.LoadRecord{WorkerUrl: url, Load: &smgv1.EngineLoad{Source: "vllm",
			WaitingRequests: -5, RunningRequests: -1, MaxRunningRequests: -3, TokenUsage: math.Inf(1),
			Ranks: []*smgv1.RankLoad{{DpRank: -7, WaitingRequests: -5, RunningRequests: -1, MaxRunningRequests: -3,
				TokenUsage: math.Inf(1), GenThroughput: math.NaN(), CacheHitRate: -0.5}}}}
	}
	send(t, st, &smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Record{Record: hostile("http://127.0.0.1:8001")}})
	send(t, st, &smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Records{Records: &smgv1.LoadRecords{
		Records: []*smgv1.LoadRecord{hostile("http://127.0.0.1:8002")}}}})
	h.waitFor(t, "both records stored", func(s *registry.Snapshot) bool {
		return s.Get("w1").Load != nil && s.Get("w2").Load != nil
	})
	closeCleanly(t, st)
	for _, id := range []string{"w1", "w2"} {
		l := h.reg.Snapshot().Get(id).Load
		r := l.GetRanks()[0]
		if l.GetWaitingRequests() != 0 || l.GetRunningRequests() != 0 || l.GetMaxRunningRequests() != 0 || l.GetTokenUsage() != 1 {
			t.Errorf("%s: stored load waiting %d running %d max_running %d token_usage %v, want 0 0 0 1",
				id, l.GetWaitingRequests(), l.GetRunningRequests(), l.GetMaxRunningRequests(), l.GetTokenUsage())
		}
		if r.GetDpRank() != 0 || r.GetWaitingRequests() != 0 || r.GetRunningRequests() != 0 || r.GetMaxRunningRequests() != 0 ||
			r.GetTokenUsage() != 1 || r.GetGenThroughput() != 0 || r.GetCacheHitRate() != 0 {
			t.Errorf("%s: stored rank %v, want every count 0, token_usage 1, gen_throughput 0, cache_hit_rate 0", id, r)
		}
	}
}
