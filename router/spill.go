package router

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Spill-over (--spill-over): a request whose every local candidate is
// vetoed or has no room goes to an external worker (a provider) of its
// model instead of being steered, made to wait or shed, within the
// provider's budget (requests/s and tokens/s). The control plane splits
// each budget evenly among the routers (Worker.WindowShare, in millionths);
// past the budget the spec's answer stands.

// Spill-over reasons (smg_router_spillover_total's reason label): why the
// local candidates could not take the request.
const (
	SpillOverload    = "overload"    // every candidate over its overload ceiling
	SpillLiveness    = "liveness"    // the only routable candidates are doubted by liveness
	SpillNoRoom      = "no_room"     // running windows full (or others already waiting for a room)
	SpillUnavailable = "unavailable" // no routable local candidate (none, unhealthy, breakers open)
)

// Refusal reasons (smg_router_spillover_refused_total): why a request that
// could have spilled did not.
const (
	SpillRefusedBudget   = "budget"   // every routable external worker is past its budget
	SpillRefusedProvider = "provider" // no external worker of the model is routable (breaker open, 429 hold)
)

// spillPart is a whole budget in the parts routers are granted (the
// control plane's windows.SpillParts).
const spillPart = 1_000_000

type spiller struct {
	now     func() time.Time
	mu      sync.Mutex
	budgets map[string]*spillBudget // by worker ID

	spilled *prometheus.CounterVec // model, reason
	refused *prometheus.CounterVec // model, reason
}

func newSpiller(now func() time.Time, reg prometheus.Registerer) (*spiller, error) {
	s := &spiller{now: now, budgets: map[string]*spillBudget{},
		spilled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "smg_router_spillover_total",
			Help: "Requests sent to an external worker (spill-over) because no local candidate could take them, by why.",
		}, []string{"model", "reason"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "smg_router_spillover_refused_total",
			Help: "Requests that could not spill over (past the budget, or no routable external worker) and got the spec's answer.",
		}, []string{"model", "reason"}),
	}
	for _, c := range []prometheus.Collector{s.spilled, s.refused} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// addSpill files external worker i under model (buildView, --spill-over).
func (v *view) addSpill(model string, i int32) {
	if v.spill == nil {
		v.spill = map[string][]int32{}
	}
	v.spill[model] = append(v.spill[model], i)
}

// spillBudget is one external worker's budget at this router: two token
// buckets, each full at one second of its rate. A request passes while a
// bucket is above zero and takes its cost, which may leave it below zero (a
// long request is not refused for ever): over time the rate holds.
type spillBudget struct {
	requests, tokens float64 // levels
	last             time.Time
}

// take spends one request and tokens from w's budget (this router's part
// of it) and reports whether the budget allowed it.
func (s *spiller) take(w *Worker, tokens float64) bool {
	p := w.Provider
	part := 1.0 // no share from a control plane: the whole budget
	switch {
	case w.WindowShare < 0:
		return false // none granted to this router yet
	case w.WindowShare > 0:
		part = float64(w.WindowShare) / spillPart
	}
	reqRate, tokRate := p.SpillRequestsPerSec*part, p.SpillTokensPerSec*part
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.budgets[w.ID]
	if b == nil {
		b = &spillBudget{requests: reqRate, tokens: tokRate, last: now}
		s.budgets[w.ID] = b
	}
	if dt := now.Sub(b.last).Seconds(); dt > 0 {
		b.requests = min(b.requests+dt*reqRate, max(reqRate, 1))
		b.tokens = min(b.tokens+dt*tokRate, tokRate)
		b.last = now
	}
	limitReq, limitTok := p.SpillRequestsPerSec > 0, p.SpillTokensPerSec > 0
	if (limitReq && b.requests < 1) || (limitTok && b.tokens <= 0) {
		return false
	}
	if limitReq {
		b.requests--
	}
	if limitTok {
		b.tokens -= tokens
	}
	return true
}

// spillReason says why the local candidates cannot take q (out from
// selection; a chosen worker behind requests already waiting for a room
// has none either), or "" when they can.
func spillReason(p *pool, out outcome, q *request) string {
	switch out {
	case overloadFallback, shedAll:
		return SpillOverload
	case livenessFallback:
		return SpillLiveness
	case full:
		return SpillNoRoom
	case noneAvailable:
		return SpillUnavailable
	}
	if q.need > 0 && p.wl != nil && p.wl.Waiters() > 0 {
		return SpillNoRoom
	}
	return ""
}

// spillOver picks the external worker a request goes to instead of the
// local choice (i, out) when the local candidates cannot take it and an
// external worker of the model is routable within its budget; otherwise
// it returns (i, out) unchanged and spilled false.
func (r *Router) spillOver(v *view, p *pool, i int32, out outcome, q *request, body []byte, promptTokens int64) (int32, outcome, bool) {
	ext := v.spill[p.model]
	if len(ext) == 0 {
		return i, out, false
	}
	reason := spillReason(p, out, q)
	if reason == "" {
		return i, out, false
	}
	tokens := float64(promptTokens + maxTokens(body))
	refusal := SpillRefusedProvider
	start := int(p.rr.Add(1))
	for k := range ext {
		j := ext[(start+k)%len(ext)]
		h := v.hot.at(j)
		if !h.healthy || h.st == q.avoid || !h.st.routable(&r.cb, q.now) {
			continue
		}
		if !r.spill.take(v.worker(j), tokens) {
			refusal = SpillRefusedBudget
			continue
		}
		r.spill.spilled.WithLabelValues(p.model, reason).Inc()
		return j, chosen, true
	}
	r.spill.refused.WithLabelValues(p.model, refusal).Inc()
	return i, out, false
}

// maxTokens is the request's max_tokens (or max_completion_tokens), 0 when
// it names neither: the output side of a spilled request's token cost.
func maxTokens(body []byte) int64 {
	var n int64
	walkTop(body, func(key []byte, start, end int) bool {
		if k := string(key); k == "max_tokens" || k == "max_completion_tokens" {
			n = max(n, parseNonNegative(body[start:end]))
		}
		return false
	})
	return n
}

// parseNonNegative reads a JSON integer in [0, 1e9]; anything else is 0.
func parseNonNegative(v []byte) int64 {
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' || n > 1e9 {
			return 0
		}
		n = n*10 + int64(c-'0')
	}
	return n
}
