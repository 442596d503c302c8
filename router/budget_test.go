package router

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func budget(tokens int64) func(*Worker) { return func(w *Worker) { w.TokenBudget = tokens } }

func budgetsOn(wait float64) func(*Options) {
	return func(o *Options) {
		o.Policy, o.WorkerTokenBudget, o.WorkerAdmissionWaitSecs = PolicyRoundRobin, true, wait
	}
}

// postTokens sends a chat completion asking for maxTokens of output.
func (h *harness) postTokens(maxTokens int) answer {
	h.t.Helper()
	return h.send("/v1/chat/completions", tokensBody(maxTokens), "")
}

func tokensBody(maxTokens int) string {
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}],"max_tokens":%d}`, testModel, maxTokens)
}

// tokens is the tokens held on worker id.
func (h *harness) tokens(id string) int64 {
	v := h.r.view.Load()
	return v.states[v.index(id)].gate.Tokens()
}

// A worker's token budget admits requests by prompt plus max_tokens: a
// second request that would pass the budget waits (and is reported as token
// demand) until the first ends, then goes; every end gives the tokens back.
func TestTokenBudgetAdmitsByTokens(t *testing.T) {
	release := make(chan struct{})
	a := holdingEngine(t, "a", release)
	h := newHarness(t, budgetsOn(30))
	openRelease := gateOpen(t, release)
	h.apply(a.worker(budget(1000)))
	first := make(chan answer, 1)
	go func() { first <- h.postTokens(600) }()
	waitUntil(t, func() bool { return a.hits.Load() == 1 })
	held := h.tokens("a")
	if held < 600 || held > 620 {
		t.Fatalf("tokens held %d, want 600 of output plus the prompt's few", held)
	}
	second := make(chan answer, 1)
	go func() { second <- h.postTokens(600) }()
	waitUntil(t, func() bool { return h.waiters() == 1 })
	if a.hits.Load() != 1 {
		t.Fatal("a request past the budget reached the engine")
	}
	obs := h.r.Observations()
	if len(obs.Demand) != 1 || obs.Demand[0].TokensInFlight != held || obs.Demand[0].TokensWaiting < 600 {
		t.Fatalf("demand %+v, want the held tokens and the waiting request's", obs.Demand)
	}
	openRelease()
	for _, c := range []chan answer{first, second} {
		if got := <-c; got.status != http.StatusOK {
			t.Fatalf("answer %d %s", got.status, got.body)
		}
	}
	if h.tokens("a") != 0 || h.inFlight("a") != 0 {
		t.Fatalf("after the answers: %d tokens, %d rooms held", h.tokens("a"), h.inFlight("a"))
	}
}

// A worker whose engine reports no KV capacity (no budget yet) is not
// gated by tokens, but the tokens held there are reported, so the control
// plane can learn its capacity from them.
func TestTokensReportedBeforeABudget(t *testing.T) {
	release := make(chan struct{})
	a := holdingEngine(t, "a", release)
	h := newHarness(t, budgetsOn(30))
	openRelease := gateOpen(t, release)
	h.apply(a.worker())
	answers := make(chan answer, 2)
	for range 2 {
		go func() { answers <- h.postTokens(600) }()
	}
	waitUntil(t, func() bool { return a.hits.Load() == 2 })
	obs := h.r.Observations()
	if len(obs.Demand) != 1 || obs.Demand[0].TokensInFlight < 1200 || obs.Demand[0].TokensInFlight != h.tokens("a") {
		t.Fatalf("demand %+v, want the 1200-odd tokens held on the worker without a budget", obs.Demand)
	}
	openRelease()
	for range 2 {
		if got := <-answers; got.status != http.StatusOK {
			t.Fatalf("answer %d %s", got.status, got.body)
		}
	}
}

// A request larger than every worker's whole budget is a 400 naming the
// problem, before any dispatch; the same request without the flag goes.
func TestTokenBudgetTooLargeIsA400(t *testing.T) {
	a := newEngine(t, "a", nil)
	h := newHarness(t, budgetsOn(30))
	h.apply(a.worker(budget(1000)))
	got := h.postTokens(2000)
	if got.status != http.StatusBadRequest || got.errorCode() != CodeContextLength ||
		!strings.Contains(got.body, "more than the KV capacity of every worker for model '"+testModel+"' (1000 tokens at most)") {
		t.Fatalf("answer %d %v %s, want 400 context_length_exceeded naming the capacity", got.status, got.header, got.body)
	}
	if a.hits.Load() != 0 || testutil.ToFloat64(h.r.wm.tokRefused.WithLabelValues(budgetTooLarge)) != 1 {
		t.Fatalf("engine hits %d, refused %v", a.hits.Load(), testutil.ToFloat64(h.r.wm.tokRefused.WithLabelValues(budgetTooLarge)))
	}
	// One worker with room for it: it goes there.
	b := newEngine(t, "b", nil)
	h.apply(a.worker(budget(1000)), b.worker(budget(4000)))
	if got := h.postTokens(2000); got.status != http.StatusOK || got.servedBy() != "b" {
		t.Fatalf("answer %d from %q, want 200 from b", got.status, got.servedBy())
	}

	off := newHarness(t, func(o *Options) { o.Policy = PolicyRoundRobin })
	off.apply(a.worker(budget(1000)))
	if got := off.postTokens(5000); got.status != http.StatusOK {
		t.Fatalf("without --worker-token-budget: %d %s, want the request sent", got.status, got.body)
	}
}

// Every end path gives the tokens back: an engine error, a client that
// leaves while its request runs, a client that leaves while it waits, and
// a request shed at once (counted as refused by the budget).
func TestTokenBudgetReleasedOnEveryEnd(t *testing.T) {
	failing := newEngine(t, "f", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		http.Error(w, "boom", http.StatusInternalServerError)
	})
	h := newHarness(t, func(o *Options) { budgetsOn(30)(o); o.DisableRetries = true })
	h.apply(failing.worker(budget(1000)))
	if got := h.postTokens(600); got.status != http.StatusInternalServerError {
		t.Fatalf("engine error: %d %s", got.status, got.body)
	}
	if h.tokens("f") != 0 {
		t.Fatalf("after an engine error %d tokens held", h.tokens("f"))
	}

	release := make(chan struct{})
	a := holdingEngine(t, "a", release)
	gateOpen(t, release)
	h = newHarness(t, budgetsOn(30))
	h.apply(a.worker(budget(1000)))
	ctx, leave := context.WithCancel(context.Background())
	left := make(chan error, 2)
	send := func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/v1/chat/completions", strings.NewReader(tokensBody(600)))
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		left <- err
	}
	go send()
	waitUntil(t, func() bool { return a.hits.Load() == 1 })
	go send()
	waitUntil(t, func() bool { return h.waiters() == 1 })
	leave()
	for range 2 {
		if err := <-left; err == nil {
			t.Fatal("a client that left got an answer")
		}
	}
	waitUntil(t, func() bool { return h.tokens("a") == 0 && h.inFlight("a") == 0 && h.waiters() == 0 })

	release2 := make(chan struct{})
	b := holdingEngine(t, "b", release2)
	h = newHarness(t, budgetsOn(0))
	open2 := gateOpen(t, release2) // after the harness: its server closes once the held answer ends
	h.apply(b.worker(budget(1000)))
	held := make(chan answer, 1)
	go func() { held <- h.postTokens(600) }()
	waitUntil(t, func() bool { return b.hits.Load() == 1 })
	got := h.postTokens(600)
	if got.status != http.StatusServiceUnavailable || got.errorCode() != CodeShed {
		t.Fatalf("no tokens with a wait of 0: %d %s, want the shed answer", got.status, got.body)
	}
	if n := testutil.ToFloat64(h.r.wm.tokRefused.WithLabelValues(budgetShed)); n != 1 {
		t.Fatalf("smg_worker_token_budget_refused_total{reason=shed} = %v, want 1", n)
	}
	open2()
	if got := <-held; got.status != http.StatusOK || h.tokens("b") != 0 {
		t.Fatalf("held answer %d, %d tokens left", got.status, h.tokens("b"))
	}
}
