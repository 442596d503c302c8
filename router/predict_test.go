package router

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
)

// fakeClock is a router clock the test's engine moves forward.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func (c *fakeClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }
func (c *fakeClock) opts(o *Options)         { o.Now = c.now }
func promptOf(tokens int) string             { return strings.Repeat("x", 4*tokens-2) } // raw JSON: 4*tokens bytes
func completion(tokens int, stream bool) string {
	return fmt.Sprintf(`{"model":%q,"prompt":%q,"stream":%v}`, testModel, promptOf(tokens), stream)
}

// prefillEngine answers after advancing the router's clock by the time a
// prefill at rate tokens/s of the request's prompt (4 bytes a token) and of
// the tokens ahead of it (*ahead) takes, then a second chunk one step later.
func prefillEngine(t *testing.T, clk *fakeClock, rate float64, step time.Duration, ahead *atomic.Int64) *engine {
	return newEngine(t, "e", func(w http.ResponseWriter, r *http.Request) {
		var body struct{ Prompt string }
		b, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(b, &body)
		tokens := float64(len(body.Prompt)+2)/4 + float64(ahead.Load())
		clk.advance(time.Duration(tokens / rate * float64(time.Second)))
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		fmt.Fprint(w, "data: {\"first\":true}\n\n")
		w.(http.Flusher).Flush()
		time.Sleep(20 * time.Millisecond) // a separate read for the router
		clk.advance(step)
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
}

func loadsOf(t *testing.T, h *harness) map[string]WorkerLoad {
	t.Helper()
	var l LoadsResponse
	if err := json.Unmarshal([]byte(h.get("/loads").body), &l); err != nil {
		t.Fatal(err)
	}
	out := map[string]WorkerLoad{}
	for _, w := range l.Workers {
		out[w.WorkerID] = w
	}
	return out
}

// The router learns a worker's prefill rate and step from its answers, adds
// the work ahead the control plane reports, and measures its own error.
func TestPredictionLearnsRateStepAndWorkAhead(t *testing.T) {
	clk := newFakeClock()
	h := newHarness(t, clk.opts)
	var ahead atomic.Int64
	e := prefillEngine(t, clk, 10000, 5*time.Millisecond, &ahead)
	h.apply(e.worker())
	if l := loadsOf(t, h)["e"]; l.TTFTPredictor != "no_data" || l.PredictedTTFTMs != 0 {
		t.Fatalf("before any answer: %+v, want no_data", l.TTFTLoad)
	}
	if a := h.send("/v1/completions", completion(1000, true), ""); a.status != http.StatusOK {
		t.Fatalf("got %d %s", a.status, a.body)
	}
	if got := testutil.ToFloat64(h.r.ttm.failOpen[1]); got != 1 {
		t.Fatalf("fail-open no_data count = %v, want 1", got)
	}
	l := loadsOf(t, h)["e"]
	// 1000 tokens in 100 ms (no step known yet): 10000 tokens/s; the step is 5 ms.
	if l.TTFTPredictor != "ok" || l.PrefillTokensPerSec < 9999 || l.PrefillTokensPerSec > 10001 || l.DecodeStepMs != 5 {
		t.Fatalf("after one answer: %+v, want 10000 tokens/s, 5 ms step", l.TTFTLoad)
	}
	// 4000 tokens ahead reported by the control plane: 400 ms + one and a
	// half steps (no line fitted yet).
	w := e.worker()
	w.PromptTokensAhead = 4000
	h.apply(w)
	if l := loadsOf(t, h)["e"]; l.PromptTokensAhead != 4000 || l.PredictedTTFTMs != 407.5 {
		t.Fatalf("with 4000 tokens ahead: %+v, want 407.5 ms", l.TTFTLoad)
	}
	// This router's part of that sum, in the report the sum holds, is not
	// counted twice, even once it has drained and a later report says so.
	v := h.r.view.Load()
	st := v.states[v.index("e")]
	st.promptTokens.Store(1000)
	held := h.r.Observations()
	st.promptTokens.Store(0)
	if latest := h.r.Observations(); held.Seq == 0 || latest.Seq != held.Seq+1 {
		t.Fatalf("reports numbered %d then %d, want n > 0 then n+1", held.Seq, latest.Seq)
	}
	w.AheadReport = held.Seq
	h.apply(w)
	if l := loadsOf(t, h)["e"]; l.PromptTokensAhead != 3000 {
		t.Fatalf("ahead less this router's own part in the report the sum holds: %d, want 3000", l.PromptTokensAhead)
	}
	// A second request of 1000 tokens behind those 3000 takes 400 ms as
	// predicted (407.5 ms): observed/predicted ~0.98.
	ahead.Store(3000)
	if a := h.send("/v1/completions", completion(1000, false), ""); a.status != http.StatusOK {
		t.Fatalf("got %d %s", a.status, a.body)
	}
	if n := testutil.CollectAndCount(h.reg, "smg_ttft_prediction_ratio"); n != 1 {
		t.Fatalf("ratio series = %d", n)
	}
	out, err := testutil.CollectAndFormat(h.reg, expfmt.TypeTextPlain, "smg_ttft_prediction_ratio")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), `smg_ttft_prediction_ratio_bucket{le="0.9"} 0`) ||
		!strings.Contains(string(out), `smg_ttft_prediction_ratio_bucket{le="1"} 1`) ||
		!strings.Contains(string(out), "smg_ttft_prediction_ratio_count 1") {
		t.Fatalf("ratio histogram:\n%s", out)
	}
	for _, name := range []string{"smg_worker_ttft_predicted_seconds", "smg_worker_prefill_tokens_per_second", "smg_worker_decode_step_seconds"} {
		if n := testutil.CollectAndCount(h.reg, name); n != 1 {
			t.Errorf("%s: %d series, want 1", name, n)
		}
	}
}

// An engine whose first byte comes before any prefill shows an infinite
// rate: the predictor calls it implausible, predicts nothing and counts the
// requests that go without a prediction.
func TestPredictionFailsOpenOnALyingEngine(t *testing.T) {
	clk := newFakeClock()
	h := newHarness(t, clk.opts)
	e := prefillEngine(t, clk, 1e12, 0, new(atomic.Int64))
	h.apply(e.worker())
	for range 2 {
		if a := h.send("/v1/completions", completion(1000, false), ""); a.status != http.StatusOK {
			t.Fatalf("got %d %s", a.status, a.body)
		}
	}
	if l := loadsOf(t, h)["e"]; l.TTFTPredictor != "implausible" || l.PredictedTTFTMs != 0 {
		t.Fatalf("lying engine: %+v, want implausible and no prediction", l.TTFTLoad)
	}
	if got := testutil.ToFloat64(h.r.ttm.failOpen[2]); got != 1 {
		t.Fatalf("fail-open implausible count = %v, want 1", got)
	}
	if n := testutil.CollectAndCount(h.reg, "smg_worker_ttft_predicted_seconds"); n != 0 {
		t.Fatalf("an implausible worker exported %d predictions", n)
	}
}

// The control plane's sum ahead holds one report of this router's own, the
// one it acknowledged last before the worker's state arrived (AheadReport):
// that report's part is what is subtracted, not the latest report's (the
// router's own work drained since is not counted as the other routers'). With
// no report acknowledged, or one no longer kept, the latest is. The router's
// own tokens in flight now are added either way.
func TestWorkAheadSubtractsTheReportTheSumHolds(t *testing.T) {
	st := &workerState{}
	st.reported.record(1, 3000)                           // acked: the sum holds it
	st.reported.record(2, 500)                            // the latest, not acked: its work drained since report 1
	st.promptTokens.Store(200)                            // in flight now
	w := &Worker{PromptTokensAhead: 4000, AheadReport: 1} // report 1's 3000, the others' 1000
	h := hotOf(w, st)
	if got := workAhead(&h); got != 1000+200 {
		t.Fatalf("sum holding report 1: %d, want 4000 - 3000 + 200", got)
	}
	if got := promptAhead(w, st); got != 1000+200 {
		t.Fatalf("promptAhead: %d, want 1200 as workAhead", got)
	}
	// No ack (a control plane that sends none): the latest report.
	w.AheadReport = 0
	h = hotOf(w, st)
	if got := workAhead(&h); got != 3500+200 {
		t.Fatalf("no ack: %d, want 4000 - 500 + 200", got)
	}
	// Acks out of step with the reports: an ack of report 4 (reports 3 and
	// 4 repeated report 2's 500, acks of 2 and 3 never came).
	st.reported.record(3, 500)
	st.reported.record(4, 500)
	st.reported.record(5, 100)
	w.AheadReport = 4
	if got := promptAhead(w, st); got != 3500+200 {
		t.Fatalf("sum holding report 4: %d, want 4000 - 500 + 200", got)
	}
	// A part above the sum counts no other router's work.
	w.PromptTokensAhead, w.AheadReport = 2000, 1
	if got := promptAhead(w, st); got != 200 {
		t.Fatalf("part above the sum: %d, want only its own 200", got)
	}
}

// A router keeps its recent reports per worker as changes: a report is
// found by number until maxOwnReports changes later; one older than every
// change kept, or 0, is the latest report.
func TestOwnReportsByNumber(t *testing.T) {
	var o ownReports
	if got := o.part(1); got != 0 {
		t.Fatalf("nothing reported: %d, want 0", got)
	}
	o.record(3, 700)
	if _, ok := o.at(2); ok {
		t.Fatalf("report 2, before the first kept, was found")
	}
	o.record(4, 700) // a repeat: no change kept
	o.record(6, 0)
	o.record(5, 900) // out of order: older than the newest kept, ignored as a change
	for seq, want := range map[uint64]int64{3: 700, 4: 700, 5: 700, 6: 0, 100: 0} {
		if got, ok := o.at(seq); !ok || got != want {
			t.Errorf("report %d: %d %v, want %d", seq, got, ok, want)
		}
	}
	o.record(0, 42) // not numbered: the latest only
	if got := o.part(0); got != 42 {
		t.Fatalf("part(0) = %d, want the latest 42", got)
	}
	for i := range uint64(maxOwnReports) {
		o.record(10+i, int64(i+1))
	}
	if got := o.part(6); got != int64(maxOwnReports) {
		t.Fatalf("report 6, no longer kept: %d, want the latest %d", got, maxOwnReports)
	}
	if got := o.part(10); got != 1 {
		t.Fatalf("report 10: %d, want 1", got)
	}
}
