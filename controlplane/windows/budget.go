package windows

import (
	"slices"

	"github.com/smg-project/smg/controlplane/registry"
)

// Token budget sources (registry.Budget.Source).
const (
	BudgetEngine  = "engine"  // the engine's reported KV capacity in tokens
	BudgetLearned = "learned" // learned from KV usage against the tokens routers hold there
)

// Learning the KV capacity of an engine that reports none: at each new load
// report with KV usage u of at least kvLearnMinUsage, the tokens the
// routers hold on the worker T give a sample T/u. T counts output not
// generated yet and prompt the prefix cache shares, so a sample errs above
// the capacity, toward admitting (fail-open), never toward refusing what
// fits. The capacity is the median of the latest kvLearnSamples. A sample
// is capped at kvLearnGrowth times the capacity learned and at
// MaxLearnedKV, so an engine lying about its usage cannot grow it without
// bound (smg_worker_token_budget_learn_capped_total counts capped ones).
const (
	kvLearnMinUsage = 0.2
	kvLearnSamples  = 5
	kvLearnGrowth   = 2
	// MaxLearnedKV bounds a learned KV capacity (2^26 tokens: above any
	// single engine's KV cache today).
	MaxLearnedKV = 1 << 26
)

// kvLearner is one worker's learned KV capacity. Guarded by Allocator.mu.
type kvLearner struct {
	rev     uint64  // load revision of the latest sample
	samples []int64 // latest, oldest first
	learned int64   // 0: not learned yet
}

// budgetOf returns the tokens to split for w and its budget record, under
// TokenBudget: a regular worker's KV capacity in tokens as its engine
// reports it (summed over DP ranks), else as learned. None (0, nil) for PD
// workers, external ones, or with the option off; a record with no tokens
// while the capacity is unknown (never gated by tokens).
func (a *Allocator) budgetOf(w *registry.Worker) (int64, *registry.Budget) {
	if !a.opts.TokenBudget || w.Type == "prefill" || w.Type == "decode" {
		return 0, nil
	}
	b := &registry.Budget{}
	if n := w.Load.GetKvCapacityTokens(); n > 0 {
		b.Tokens, b.Source = n, BudgetEngine
		return b.Tokens, b
	}
	if b.Learned = a.learnKV(w); b.Learned > 0 {
		b.Tokens, b.Source = b.Learned, BudgetLearned
	}
	return b.Tokens, b
}

// learnKV folds w's latest load report into its learned KV capacity and
// returns it (0: not learned yet).
func (a *Allocator) learnKV(w *registry.Worker) int64 {
	l := a.kv[w.ID]
	if l == nil {
		l = &kvLearner{}
		a.kv[w.ID] = l
	}
	if w.Load == nil || w.LoadRevision == l.rev {
		return l.learned
	}
	l.rev = w.LoadRevision
	u := observation(w.Load).Usage
	var held int64
	for _, rs := range a.routers {
		if !rs.gone {
			held += max(0, min(rs.demand[w.ID].GetTokensInFlight(), MaxLearnedKV))
		}
	}
	if u < kvLearnMinUsage || held <= 0 {
		return l.learned
	}
	sample := int64(float64(held) / u)
	limit := int64(MaxLearnedKV)
	if l.learned > 0 {
		limit = min(limit, l.learned*kvLearnGrowth)
	}
	if sample > limit {
		sample = limit
		a.kvCapped.Inc()
	}
	l.samples = append(l.samples, sample)
	if len(l.samples) > kvLearnSamples {
		l.samples = l.samples[1:]
	}
	if len(l.samples) == kvLearnSamples {
		sorted := slices.Sorted(slices.Values(l.samples))
		l.learned = sorted[len(sorted)/2]
	}
	return l.learned
}
