package router

import (
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/smg-project/smg/router/admission"
	"github.com/smg-project/smg/router/ttft"
)

// CodeTTFTObjective is the refusal of a request no worker is predicted to
// answer within its class's TTFT objective (503, Retry-After from the
// prediction).
const CodeTTFTObjective = "ttft_objective_unreachable"

// meets reports whether a candidate is predicted to send q's first token by
// q's objective (always, without one, and for a worker with an implausible
// prediction: it fails open to the running window). A worker with no first
// token measured yet meets it only with nothing ahead of q there: the first
// request alone teaches the rate, where admitting every request until then
// filled the engine blind.
func (q *request) meets(h *hotWorker) bool {
	if q.ttftBy == 0 {
		return true
	}
	d, s := objectivePrediction(h, q.own)
	switch s {
	case ttft.NoData:
		return workAhead(h) == 0
	case ttft.Implausible:
		return true
	}
	return q.now+int64(d) <= q.ttftBy
}

// workAhead is the prompt tokens ahead of a request on h as this router sees
// them (the other routers' from the control plane, plus its own).
func workAhead(h *hotWorker) int64 {
	return othersAhead(h.ahead, h.aheadReport, h.st) + h.st.promptTokens.Load()
}

// objectivePrediction is the TTFT an objective is held against on h: the
// prediction plus the worker's margin (the 90th percentile of its latest
// observed less predicted TTFTs), so the objective holds for the requests
// the predictor under-estimates too.
func objectivePrediction(h *hotWorker, own int64) (time.Duration, ttft.Status) {
	d, s := h.st.ttft.Predict(workAhead(h), own)
	return d + h.st.ttft.Margin(), s
}

// objectiveMetrics count the objective gate's answers by class.
type objectiveMetrics struct {
	refused, waits [admission.NumClasses]prometheus.Counter
}

func newObjectiveMetrics(reg prometheus.Registerer) (*objectiveMetrics, error) {
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "smg_ttft_objective_refused_total",
		Help: "Requests refused with ttft_objective_unreachable: no worker predicted to meet their class's TTFT objective in time.",
	}, []string{"class"})
	waits := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "smg_ttft_objective_waits_total",
		Help: "Requests that waited for a room on a worker predicted to meet their class's TTFT objective.",
	}, []string{"class"})
	m := &objectiveMetrics{}
	for _, c := range admission.Classes {
		m.refused[c] = refused.WithLabelValues(c.String())
		m.waits[c] = waits.WithLabelValues(c.String())
	}
	for _, c := range []prometheus.Collector{refused, waits} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// setObjectives fills r.objectives: the class's objective from the
// scheduler's YAML, else --ttft-objective-secs (0: off). A bad flag value is
// logged (when logBad) with its fallback, no default objective; the router
// still starts.
func (r *Router) setObjectives(logBad bool) {
	var def time.Duration
	if s := r.opts.TTFTObjectiveSecs; s != 0 {
		var err error
		if def, err = admission.ObjectiveFromSecs(s); err != nil && logBad {
			r.log.Error("Bad --ttft-objective-secs; no default TTFT objective", "problem", "--ttft-objective-secs "+err.Error(),
				"fallback", "classes without an objective in the scheduler YAML are admitted by the running window alone")
		}
	}
	for _, c := range admission.Classes {
		r.objectives[c] = def
		if r.sched != nil {
			if d := r.sched.Config().Classes[c].TTFTObjective; d > 0 {
				r.objectives[c] = d
			}
		}
	}
}

// objectiveQueueTimeout bounds a door's queue timeout for class c by its
// objective: a request never waits in the router longer than its objective.
func (r *Router) objectiveQueueTimeout(c admission.Class, d time.Duration) time.Duration {
	if o := r.objectives[c]; o > 0 && o < d {
		return o
	}
	return d
}

// objectiveGate decides for q (with an objective) in pool p of v.
func (r *Router) objectiveGate(v *view, p *pool, q *request) (admission.ObjectiveVerdict, time.Duration, time.Duration) {
	var buf [16]admission.Candidate
	return admission.DecideObjectiveIn(p.wl, time.Duration(q.ttftBy-q.now), r.objectiveCandidates(v, p, q, buf[:0]))
}

// objectiveLeft is how much longer q, waiting for a room in model's
// regular pool, may wait as the predictions stand now: until the best
// worker that would meet its objective could no longer (0: none would; a
// worker with room that meets it leaves the wait to its own end). It runs
// under the pool's waitlist lock, so it reads no pace (Waiter.Left).
func (r *Router) objectiveLeft(model string, q *request) time.Duration {
	v := r.view.Load()
	if v == nil {
		return math.MaxInt64
	}
	p := v.poolOf(model, false)
	if p == nil {
		return math.MaxInt64 // the try answers it
	}
	q.now = r.now()
	var buf [16]admission.Candidate
	switch verdict, wait, _ := admission.DecideObjective(time.Duration(q.ttftBy-q.now), r.objectiveCandidates(v, p, q, buf[:0])); verdict {
	case admission.ObjectiveGo:
		return math.MaxInt64
	case admission.ObjectiveWait:
		return wait
	}
	return 0
}

// objectiveCandidates appends q's routable candidates in pool p of v to
// cands, as the objective gate sees them.
func (r *Router) objectiveCandidates(v *view, p *pool, q *request, cands []admission.Candidate) []admission.Candidate {
	for _, i := range p.idx {
		h := v.hot.at(i)
		if !h.eligible || h.st == q.avoid || !h.st.breaker.allow(&r.cb, q.now) {
			continue
		}
		d, s := objectivePrediction(h, q.own)
		if s == ttft.NoData && workAhead(h) > 0 {
			continue // no rate yet and busy learning it: meets nothing (see meets)
		}
		cands = append(cands, admission.Candidate{TTFT: d, Predicted: s == ttft.OK,
			Room: q.need == 0 || h.st.gate.HasRoom(q.need, q.tokens)})
	}
	return cands
}

// refuseObjective answers a request refused by its objective.
func (r *Router) refuseObjective(w http.ResponseWriter, q *request, model string, retry time.Duration) int {
	r.om.refused[q.class].Inc()
	secs := int(min(math.Ceil(retry.Seconds()), 3600))
	writeError(w, http.StatusServiceUnavailable, CodeTTFTObjective,
		"No worker"+forModel(model)+" is predicted to send a first token within the "+q.class.String()+
			" objective ("+strconv.FormatFloat(r.objectives[q.class].Seconds(), 'f', -1, 64)+" s)", max(secs, 1))
	return http.StatusServiceUnavailable
}

// capQueueTimeouts bounds each class's scheduler queue timeout by its TTFT
// objective (the YAML's, else the flag's when valid), so a request never
// waits in the router longer than its objective.
func capQueueTimeouts(cfg *admission.SchedulerConfig, opts Options) {
	def, _ := admission.ObjectiveFromSecs(opts.TTFTObjectiveSecs) // a bad value is logged by setObjectives
	for _, c := range admission.Classes {
		cc := &cfg.Classes[c]
		o := cc.TTFTObjective
		if o == 0 {
			o = def
		}
		if o > 0 && o < cc.QueueTimeout {
			cc.QueueTimeout = o
		}
	}
}
