package admission

import (
	"sort"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Admission outcomes (the outcome label of smg_scheduler_admit_total).
const (
	OutcomeAdmitted        = "admitted"
	OutcomeQueueFull       = "rejected_queue_full"
	OutcomeQueueTimeout    = "rejected_queue_timeout"
	OutcomePreempted       = "preempted"
	OutcomeClientCancelled = "client_cancelled"
	OutcomeOverFairShare   = "rejected_over_fair_share"
)

// SchedulerMetrics are SMG's smg_scheduler_* series.
type SchedulerMetrics struct {
	admit        *prometheus.CounterVec
	wait         *prometheus.HistogramVec
	preemption   *prometheus.CounterVec
	clamp        *prometheus.CounterVec
	unknown      *prometheus.CounterVec
	starvation   *prometheus.CounterVec
	inflight     *prometheus.GaugeVec
	depth        *prometheus.GaugeVec
	sizeLimit    *prometheus.GaugeVec
	utilization  prometheus.Gauge
	pressure     *prometheus.GaugeVec
	overShare    *prometheus.CounterVec
	tokens       *prometheus.CounterVec
	packed       *prometheus.CounterVec
	waitByClass  [NumClasses]prometheus.Observer
	admitByClass [NumClasses]map[string]prometheus.Counter

	tenants tenantLabels
}

// NewSchedulerMetrics registers the scheduler's series on reg.
func NewSchedulerMetrics(reg prometheus.Registerer) (*SchedulerMetrics, error) {
	byClass := []string{"class"}
	m := &SchedulerMetrics{
		admit: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "smg_scheduler_admit_total", Help: "Scheduler decisions by class and outcome.",
		}, []string{"class", "outcome"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "smg_scheduler_queue_wait_seconds", Help: "Time from arrival to admission, by class.",
			Buckets: []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}, byClass),
		preemption: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "smg_scheduler_preemption_total", Help: "Requests cancelled before their first byte, by victim and preemptor class.",
		}, []string{"victim_class", "by_class"}),
		clamp: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "smg_scheduler_clamp_total", Help: "Requests whose class the tenant's max_class lowered.",
		}, []string{"tenant", "requested_class", "effective_class"}),
		unknown: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "smg_scheduler_unknown_priority_value_total", Help: "x-smg-priority values that named no class (taken as default).",
		}, []string{"tenant"}),
		starvation: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "smg_scheduler_starvation_promotion_total", Help: "Queue heads admitted ahead of the class order because they waited past the starvation threshold.",
		}, byClass),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "smg_scheduler_inflight", Help: "Admitted requests holding a slot, by class.",
		}, byClass),
		depth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "smg_scheduler_queue_depth", Help: "Requests waiting, by class.",
		}, byClass),
		sizeLimit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "smg_scheduler_queue_size_limit", Help: "Configured queue size, by class.",
		}, byClass),
		utilization: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "smg_scheduler_utilization", Help: "Slots in flight over capacity (the sum of this router's granted shares).",
		}),
		pressure: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "smg_scheduler_class_capacity_pressure", Help: "0-1, the worse of the class's queue fill and slot pressure.",
		}, byClass),
		overShare: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "smg_scheduler_fair_share_refused_total", Help: "Requests refused with 429 because their tenant held its fair share while another tenant was active (fair_share).",
		}, []string{"tenant"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "smg_scheduler_tenant_tokens_total", Help: "Tokens served per tenant as its virtual token counter counts them (prompt tokens x1, output tokens x2, before its weight; fair_share).",
		}, []string{"tenant"}),
		packed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "smg_scheduler_fair_share_packed_total", Help: "Requests admitted while their tenant wanted more than its weighted share beside another active tenant, placed on workers in the fleet's fixed order (fair_share.pack_over_share).",
		}, []string{"tenant"}),
	}
	for _, c := range []prometheus.Collector{m.admit, m.wait, m.preemption, m.clamp, m.unknown, m.starvation,
		m.inflight, m.depth, m.sizeLimit, m.utilization, m.pressure, m.overShare, m.tokens, m.packed} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, cl := range Classes {
		n := cl.String()
		m.waitByClass[cl] = m.wait.WithLabelValues(n)
		m.admitByClass[cl] = map[string]prometheus.Counter{}
		for _, o := range []string{OutcomeAdmitted, OutcomeQueueFull, OutcomeQueueTimeout, OutcomePreempted, OutcomeClientCancelled, OutcomeOverFairShare} {
			m.admitByClass[cl][o] = m.admit.WithLabelValues(n, o)
		}
		m.starvation.WithLabelValues(n)
		m.inflight.WithLabelValues(n)
		m.depth.WithLabelValues(n)
		m.pressure.WithLabelValues(n)
	}
	return m, nil
}

// CountUnknown counts a header value that named no class.
func (m *SchedulerMetrics) CountUnknown(tenant string) {
	m.unknown.WithLabelValues(m.tenants.label(tenant)).Inc()
}

// CountOverShare counts a refusal of a tenant over its fair share.
func (m *SchedulerMetrics) CountOverShare(tenant string) {
	m.overShare.WithLabelValues(m.tenants.label(tenant)).Inc()
}

// CountPacked counts a request of a tenant over its weighted share placed
// in the fleet's fixed order.
func (m *SchedulerMetrics) CountPacked(tenant string) {
	m.packed.WithLabelValues(m.tenants.label(tenant)).Inc()
}

// CountClamp counts a class lowered by the tenant's ceiling.
func (m *SchedulerMetrics) CountClamp(tenant string, requested, effective Class) {
	m.clamp.WithLabelValues(m.tenants.label(tenant), requested.String(), effective.String()).Inc()
}

// tenantLabels bounds the tenant label's cardinality: the first topN tenants
// keep their name, every later one is "other", so hostile callers (one
// tenant per source address) cannot grow the series without bound.
type tenantLabels struct {
	mu    sync.Mutex
	topN  int
	named map[string]bool
}

func (t *tenantLabels) init(topN int, configured map[string]Class) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.topN = topN
	t.named = make(map[string]bool, topN)
	keys := make([]string, 0, len(configured))
	for k := range configured {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if len(t.named) < topN {
			t.named[k] = true
		}
	}
}

func (t *tenantLabels) label(tenant string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.named[tenant] {
		return tenant
	}
	if len(t.named) < t.topN {
		t.named[tenant] = true
		return tenant
	}
	return "other"
}
