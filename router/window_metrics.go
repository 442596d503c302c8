package router

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/smg-project/smg/internal/promseries"
	"github.com/smg-project/smg/router/admission"
)

// StageAdmissionWindow is the shed stage of a request that found no room in
// its pool's running windows in time (--worker-admission-window only).
const StageAdmissionWindow = "admission_window"

// Reasons of smg_worker_token_budget_refused_total.
const (
	budgetTooLarge = "too_large" // larger than every worker's whole budget: 400
	budgetShed     = "shed"      // no budget freed in time while rooms were free: 503
)

// windowMetrics count the wait path of --worker-admission-window and
// --worker-token-budget and show each worker's window and token budget as
// this router holds them (read at scrape time).
type windowMetrics struct {
	waits, sheds prometheus.Counter
	wait         prometheus.Observer
	r            *Router
	rooms        *prometheus.Desc
	inFlight     *prometheus.Desc
	waiting      *prometheus.Desc
	tokLimit     *prometheus.Desc
	tokInUse     *prometheus.Desc
	tokBudget    *prometheus.Desc
	tokRefused   *prometheus.CounterVec

	mu     sync.Mutex
	scrape uint64                     // count of scrapes, to mark what each saw
	pairs  map[string]*workerLabelSet // by URL, the gated workers the last scrape saw
}

// workerLabelSet is a gated worker's worker=URL pair, kept across scrapes
// (NewConstMetric built it anew for each series of each scrape).
type workerLabelSet struct {
	labels []*dto.LabelPair // nil: the URL is not UTF-8, no series
	seen   uint64
}

func newWindowMetrics(r *Router, reg prometheus.Registerer) (*windowMetrics, error) {
	m := &windowMetrics{
		r:     r,
		pairs: map[string]*workerLabelSet{},
		waits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "smg_worker_admission_waits_total",
			Help: "Requests that waited for a room in a running window and were admitted.",
		}),
		sheds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "smg_worker_admission_sheds_total",
			Help: "Requests shed because no room in their pool's running windows freed in time.",
		}),
		rooms: prometheus.NewDesc("smg_worker_admission_limit",
			"Rooms this router may hold on the worker: its share of the running window (plus queue allowance), -1 when ungated.",
			[]string{"worker"}, nil),
		inFlight: prometheus.NewDesc("smg_worker_admission_in_flight",
			"Rooms this router's requests hold on the worker.", []string{"worker"}, nil),
		waiting: prometheus.NewDesc("smg_worker_admission_waiting",
			"Rooms asked for by requests waiting in this router for the worker's pool, by class.", []string{"model", "class"}, nil),
		tokLimit: prometheus.NewDesc("smg_worker_token_budget_limit",
			"Tokens this router may hold on the worker: its share of the worker's token budget (--worker-token-budget), -1 when ungated.",
			[]string{"worker"}, nil),
		tokInUse: prometheus.NewDesc("smg_worker_token_budget_in_use",
			"Tokens (prompt plus expected output) this router's requests hold on the worker.", []string{"worker"}, nil),
		tokBudget: prometheus.NewDesc("smg_worker_token_budget_capacity",
			"The worker's whole token budget: its KV capacity in tokens, reported by the engine or learned.", []string{"worker"}, nil),
		tokRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "smg_worker_token_budget_refused_total",
			Help: "Requests refused by token budgets: too_large (400 context_length_exceeded) or shed (no budget freed in time while rooms were free).",
		}, []string{"reason"}),
	}
	if r.opts.WorkerTokenBudget {
		m.tokRefused.WithLabelValues(budgetTooLarge)
		m.tokRefused.WithLabelValues(budgetShed)
	}
	hist := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "smg_worker_admission_wait_seconds",
		Help:    "Time requests waited for a room before admission or shed.",
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
	})
	m.wait = hist
	for _, c := range []prometheus.Collector{m.waits, m.sheds, hist, m.tokRefused, m} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *windowMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.rooms
	ch <- m.inFlight
	ch <- m.waiting
	ch <- m.tokLimit
	ch <- m.tokInUse
	ch <- m.tokBudget
}

func (m *windowMetrics) Collect(ch chan<- prometheus.Metric) {
	gauges := m.gated()
	for i := range gauges {
		ch <- &gauges[i]
	}
	m.r.wlMu.Lock()
	defer m.r.wlMu.Unlock()
	for k, wl := range m.r.waitlists {
		if k.decode {
			continue
		}
		for c, n := range wl.WaitingByClass() {
			ch <- prometheus.MustNewConstMetric(m.waiting, prometheus.GaugeValue, float64(n), k.model, admission.Class(c).String())
		}
	}
}

// gated is one scrape's smg_worker_admission_limit and _in_flight series
// and smg_worker_token_budget_* series, one slice for them all over the
// pairs kept per worker.
func (m *windowMetrics) gated() []promseries.Gauge {
	v := m.r.view.Load()
	if v == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.scrape++
	gauges := make([]promseries.Gauge, 5*int(v.size()))
	k, gated := 0, 0
	for i := range v.size() {
		w := v.worker(i)
		rooms, _ := m.r.windowRooms(w)
		tokens := m.r.tokenBudget(w)
		if rooms <= 0 && tokens <= 0 {
			continue
		}
		gated++
		p := m.pairs[w.URL]
		if p == nil {
			p = &workerLabelSet{labels: promseries.Pairs("worker", w.URL)}
			m.pairs[w.URL] = p
		}
		p.seen = m.scrape
		if p.labels == nil {
			continue
		}
		g := &v.states[i].gate
		if rooms > 0 {
			gauges[k].Set(m.rooms, p.labels, float64(g.Limit()))
			gauges[k+1].Set(m.inFlight, p.labels, float64(g.InFlight()))
			k += 2
		}
		if tokens > 0 {
			gauges[k].Set(m.tokLimit, p.labels, float64(g.TokenLimit()))
			gauges[k+1].Set(m.tokInUse, p.labels, float64(g.Tokens()))
			gauges[k+2].Set(m.tokBudget, p.labels, float64(g.TokenBudget()))
			k += 3
		}
	}
	if len(m.pairs) > gated {
		for url, p := range m.pairs {
			if p.seen != m.scrape {
				delete(m.pairs, url)
			}
		}
	}
	return gauges[:k]
}
