package router

import (
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/smg-project/smg/router/ttft"
)

// promptAhead is the prompt tokens waiting for prefill on the worker as this
// router sees them: the other routers' part of the control plane's sum plus
// this router's own now.
func promptAhead(wk *Worker, st *workerState) int64 {
	return othersAhead(wk.PromptTokensAhead, wk.AheadReport, st) + st.promptTokens.Load()
}

// othersAhead is the other routers' part of the control plane's sum ahead:
// the sum less this router's part in the report the sum holds (report), or,
// when that is unknown (a control plane that does not acknowledge reports),
// less the router's latest report. The sum seldom holds the latest:
// subtracting it would count the router's own work drained since as the
// others' (or miss theirs when its own grew).
func othersAhead(ahead int64, report uint64, st *workerState) int64 {
	return max(ahead-st.reported.part(report), 0)
}

// predictTTFT is the predicted time to first token of a request of own
// prompt tokens on the worker, now.
func predictTTFT(wk *Worker, st *workerState, own int64) (time.Duration, ttft.Status) {
	return st.ttft.Predict(promptAhead(wk, st), own)
}

// ttftTrack follows one dispatched request from dispatch to its second
// chunk: it feeds the worker's estimator and measures the prediction's error.
type ttftTrack struct {
	m         *ttftMetrics
	est       *ttft.Estimator
	work      int64 // prompt tokens ahead at dispatch plus its own
	predicted time.Duration
	status    ttft.Status
	first     time.Time // when the first byte came (zero before)
	stepDone  bool
}

// startTTFT is called at dispatch, before the request's own prompt tokens
// count as in flight.
func (r *Router) startTTFT(wk *Worker, st *workerState, own int64) ttftTrack {
	ahead := promptAhead(wk, st)
	t := ttftTrack{m: r.ttm, est: st.ttft, work: ahead + max(own, 0)}
	if !st.ttft.AheadPlausible(ahead) {
		t.work = 0 // no rate sample from work nobody could have prefilled
	}
	t.predicted, t.status = st.ttft.Predict(ahead, own)
	if t.status != ttft.OK {
		r.ttm.failOpen[t.status].Inc()
	} else {
		r.ttm.predicted.Observe(t.predicted.Seconds())
	}
	return t
}

// firstByte records a successful answer's first byte, sent after ttft.
func (t *ttftTrack) firstByte(at time.Time, observed time.Duration) {
	t.first = at
	if t.status == ttft.OK && t.predicted > 0 {
		t.m.ratio.Observe(observed.Seconds() / t.predicted.Seconds())
		t.est.ObserveError(observed, t.predicted)
	}
	t.est.ObserveFirstToken(t.work, observed)
}

// chunk records a later chunk of a streamed answer: the first after the
// first byte is one decode step.
func (t *ttftTrack) chunk(now time.Time) {
	if t.stepDone || t.first.IsZero() {
		return
	}
	t.stepDone = true
	t.est.ObserveStep(now.Sub(t.first))
}

// ttftMetrics are the predictor's request metrics.
type ttftMetrics struct {
	predicted prometheus.Observer
	ratio     prometheus.Observer
	failOpen  [3]prometheus.Counter // by ttft.Status (OK unused)
}

func newTTFTMetrics(r *Router, reg prometheus.Registerer) (*ttftMetrics, error) {
	predicted := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "smg_ttft_predicted_seconds",
		Help:    "Predicted time to first token of dispatched requests, on the worker they were sent to.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
	})
	ratio := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "smg_ttft_prediction_ratio",
		Help:    "Observed over predicted time to first token, per answered request that had a prediction.",
		Buckets: []float64{0.25, 0.5, 0.7, 0.8, 0.9, 1, 1.1, 1.25, 1.4, 1.6, 2, 3, 4},
	})
	failOpen := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "smg_ttft_prediction_fail_open_total",
		Help: "Dispatched requests whose worker had no usable TTFT prediction (reason: no_data, implausible): admitted by the running window alone.",
	}, []string{"reason"})
	m := &ttftMetrics{predicted: predicted, ratio: ratio}
	for _, s := range []ttft.Status{ttft.NoData, ttft.Implausible} {
		m.failOpen[s] = failOpen.WithLabelValues(s.String())
	}
	for _, c := range []prometheus.Collector{predicted, ratio, failOpen, newTTFTGauges(r)} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// TTFTLoad is a worker's TTFT prediction in GET /loads.
type TTFTLoad struct {
	// PromptTokensAhead is the prompt tokens waiting for prefill on the
	// worker: other routers' (from the control plane) plus this router's.
	PromptTokensAhead int64 `json:"prompt_tokens_ahead"`
	// PrefillTokensPerSec and DecodeStepMs are the worker's measured rates
	// (0: not measured yet).
	PrefillTokensPerSec float64 `json:"prefill_tokens_per_sec"`
	DecodeStepMs        float64 `json:"decode_step_ms"`
	// PredictedTTFTMs is the predicted time to first token of a request
	// with an empty prompt sent now (the fixed time plus the work ahead over the rate); 0 when
	// TTFTPredictor is not "ok".
	PredictedTTFTMs float64 `json:"predicted_ttft_ms"`
	// TTFTPredictor: ok, no_data (no first token measured, or none in 30 s) or
	// implausible (a rate, or work ahead, outside the predictor's bounds: not
	// used).
	TTFTPredictor string `json:"ttft_predictor"`
	// TTFTMarginMs is what TTFT objectives add to the prediction: the 90th
	// percentile of the latest observed less predicted TTFTs (>= 0),
	// decayed while none is measured.
	TTFTMarginMs float64 `json:"ttft_margin_ms"`
}

func ttftLoad(wk *Worker, st *workerState) TTFTLoad {
	rate, _ := st.ttft.Rate()
	d, s := predictTTFT(wk, st, 0)
	return TTFTLoad{PromptTokensAhead: promptAhead(wk, st), PrefillTokensPerSec: rate,
		DecodeStepMs: float64(st.ttft.Step()) / 1e6, PredictedTTFTMs: float64(d) / 1e6, TTFTPredictor: s.String(),
		TTFTMarginMs: float64(st.ttft.Margin()) / 1e6}
}

// ttftGauges shows each regular worker's prediction at scrape time.
type ttftGauges struct {
	r          *Router
	predicted  *prometheus.Desc
	rate, step *prometheus.Desc
}

func newTTFTGauges(r *Router) *ttftGauges {
	return &ttftGauges{r: r,
		predicted: prometheus.NewDesc("smg_worker_ttft_predicted_seconds",
			"Predicted time to first token of a request with an empty prompt sent to the worker now (workers with a usable prediction only).", []string{"worker"}, nil),
		rate: prometheus.NewDesc("smg_worker_prefill_tokens_per_second",
			"Prefill rate measured on the worker: prompt tokens (its own and those ahead) over time to first token.", []string{"worker"}, nil),
		step: prometheus.NewDesc("smg_worker_decode_step_seconds",
			"Decode step time measured on the worker: the time between the first two chunks of a streamed answer.", []string{"worker"}, nil),
	}
}

func (g *ttftGauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- g.predicted
	ch <- g.rate
	ch <- g.step
}

func (g *ttftGauges) Collect(ch chan<- prometheus.Metric) {
	v := g.r.view.Load()
	if v == nil {
		return
	}
	for i := range v.size() {
		wk, st := v.worker(i), v.states[i]
		rate, s := st.ttft.Rate()
		if s == ttft.NoData || !utf8.ValidString(wk.URL) {
			continue
		}
		ch <- prometheus.MustNewConstMetric(g.rate, prometheus.GaugeValue, rate, wk.URL)
		ch <- prometheus.MustNewConstMetric(g.step, prometheus.GaugeValue, st.ttft.Step().Seconds(), wk.URL)
		if d, s := predictTTFT(wk, st, 0); s == ttft.OK {
			ch <- prometheus.MustNewConstMetric(g.predicted, prometheus.GaugeValue, d.Seconds(), wk.URL)
		}
	}
}
