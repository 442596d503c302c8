package windows

import "github.com/smg-project/smg/controlplane/registry"

// Token budget sources (registry.Budget.Source).
const (
	BudgetEngine = "engine" // the engine's reported KV capacity in tokens
)

// budgetOf returns the tokens to split for w and its budget record, under
// TokenBudget: a regular worker's KV capacity in tokens as its engine
// reports it (summed over DP ranks). None (0, nil) for PD workers, external
// ones, or with the option off; a record with no tokens while the capacity
// is unknown (never gated by tokens).
func (a *Allocator) budgetOf(w *registry.Worker) (int64, *registry.Budget) {
	if !a.opts.TokenBudget || w.Type == "prefill" || w.Type == "decode" {
		return 0, nil
	}
	b := &registry.Budget{}
	if n := w.Load.GetKvCapacityTokens(); n > 0 {
		b.Tokens, b.Source = n, BudgetEngine
	}
	return b.Tokens, b
}
