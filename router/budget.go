package router

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
)

// DefaultOutputTokens is the output a request is expected to produce under
// --worker-token-budget when it names no max_tokens.
const DefaultOutputTokens = 256

// maxRequestTokens bounds the tokens one request may claim (2^30: far past
// any context), so sums of claims never overflow.
const maxRequestTokens = 1 << 30

// expectedOutput is the output tokens a request may produce: the first of
// max_completion_tokens, max_tokens and sampling_params.max_new_tokens that
// is a non-negative integer, else def. A bad value is left for the engine
// to refuse; the estimate then takes def.
func expectedOutput(f *requestFields, def int64) int64 {
	for _, raw := range [...]rawRef{f.MaxCompletionTokens, f.MaxTokens} {
		if n, ok := tokenCount(raw); ok {
			return n
		}
	}
	if len(f.SamplingParams) > 0 {
		var sp struct {
			MaxNewTokens json.RawMessage `json:"max_new_tokens"`
		}
		if json.Unmarshal(f.SamplingParams, &sp) == nil {
			if n, ok := tokenCount(rawRef(sp.MaxNewTokens)); ok {
				return n
			}
		}
	}
	return def
}

// tokenCount reads a JSON integer in [0, maxRequestTokens].
func tokenCount(raw rawRef) (int64, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] == 'n' {
		return 0, false
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil || n < 0 {
		return 0, false
	}
	return min(n, maxRequestTokens), true
}

// requestTokens is what a request holds of a worker's token budget: its
// prompt plus its expected output for each of its need sequences (a batch
// of prompts, or n choices), bounded.
func requestTokens(prompt, output, need int64) int64 {
	if need = max(1, need); output > 0 && need > maxRequestTokens/output {
		return maxRequestTokens // the product would pass the bound, or wrap
	}
	return min(prompt+need*output, maxRequestTokens)
}

// tooManyTokensEverywhere reports whether tokens exceed the whole token
// budget of every worker of the pool (and every one has a budget): such a
// request can never be admitted. It returns the largest budget.
func (r *Router) tooManyTokensEverywhere(v *view, p *pool, tokens int64) (int64, bool) {
	var largest int64
	for _, i := range p.idx {
		g := &v.states[i].gate
		if !g.TooManyTokens(tokens) {
			return 0, false
		}
		largest = max(largest, g.TokenBudget())
	}
	return largest, largest > 0
}

// refuseContextLength answers a request larger than every worker's whole
// token budget: 400 context_length_exceeded, before any dispatch.
func (r *Router) refuseContextLength(w http.ResponseWriter, model string, prompt, output, tokens, budget int64) int {
	r.wm.tokRefused.WithLabelValues(budgetTooLarge).Inc()
	writeError(w, http.StatusBadRequest, CodeContextLength,
		"The request needs about "+strconv.FormatInt(tokens, 10)+" tokens (prompt about "+strconv.FormatInt(prompt, 10)+
			", expected output "+strconv.FormatInt(output, 10)+" per sequence: max_tokens, or the router's default), more than the KV capacity of every worker"+
			forModel(model)+" ("+strconv.FormatInt(budget, 10)+" tokens at most): shorten the prompt or lower max_tokens", 0)
	return http.StatusBadRequest
}

// noteBudgetShed counts a shed request as refused by token budgets when a
// worker of its pool had a room free for it but not its tokens.
func (r *Router) noteBudgetShed(model string, q *request) {
	if q.tokens <= 0 {
		return
	}
	v := r.view.Load()
	if v == nil {
		return
	}
	p := v.poolOf(model, false)
	if p == nil {
		return
	}
	for _, i := range p.idx {
		if g := &v.states[i].gate; g.HasRoom(q.need, 0) && !g.HasRoom(q.need, q.tokens) {
			r.wm.tokRefused.WithLabelValues(budgetShed).Inc()
			return
		}
	}
}
