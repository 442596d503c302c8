package router

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/smg-project/smg/router/admission"
)

// Shed and fallback stages (the spec's `stage` label values).
const (
	StageSelection   = "selection"
	StageDispatch    = "dispatch"
	StagePDAdmission = "pd_admission"
)

var stages = []string{StageSelection, StageDispatch, StagePDAdmission}

// Proxied routes, for per-route metrics resolved once.
const (
	routeChat = iota
	routeCompletions
	routeEmbeddings
	routeGenerate
	routeCount
)

var routeNames = [routeCount]string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/generate"}

var statusClasses = [...]string{"2xx", "3xx", "4xx", "5xx", "other"}

type metrics struct {
	overloadFallback, livenessFallback, shed *prometheus.CounterVec

	requests [routeCount][len(statusClasses)]prometheus.Counter
	duration [routeCount]prometheus.Observer
	retries  prometheus.Counter
	upstream *prometheus.CounterVec // kind: connection | timeout | status_5xx | other
	limiter  *admission.LimiterMetrics
	revision prometheus.Gauge
	failOpen prometheus.Counter
	breakers *prometheus.CounterVec // to: open | half_open | closed

	connections prometheus.Gauge       // client connections open (capped by --max-connections)
	connsClosed *prometheus.CounterVec // reason: idle_at_cap | idle_at_client_cap | client_cap
	refused     *prometheus.CounterVec // reason: loop | body_timeout
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		overloadFallback: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "smg_worker_overload_fallback_total",
			Help: "Requests steered to an overloaded worker because every candidate was vetoed.",
		}, []string{"stage"}),
		livenessFallback: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "smg_worker_liveness_fallback_total",
			Help: "Requests steered to a worker vetoed by liveness because the only routable candidates were.",
		}, []string{"stage"}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "smg_worker_overload_shed_total",
			Help: "Requests rejected with worker_overload_protection_shed, by stage.",
		}, []string{"stage"}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "smg_router_retries_total", Help: "Upstream attempts retried on another try.",
		}),
		upstream: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "smg_router_upstream_failures_total",
			Help: "Failed upstream attempts by kind (connection failures are reported to the control plane).",
		}, []string{"kind"}),
		revision: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "smg_router_snapshot_revision", Help: "Revision of the fleet snapshot in use.",
		}),
		failOpen: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "smg_router_fail_open_total", Help: "Times the router dropped the control plane's vetoes after losing it.",
		}),
		breakers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "smg_router_circuit_breaker_transitions_total", Help: "Circuit breaker transitions, by new state.",
		}, []string{"to"}),
	}
	m.connections = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "smg_router_connections", Help: "Client connections open on the router's port (at most --max-connections).",
	})
	m.connsClosed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "smg_router_connections_closed_total",
		Help: "Client connections closed by the connection caps, by reason: idle_at_cap (an idle one, for a new client at --max-connections), idle_at_client_cap (a client's own idle one, for its new one at --max-connections-per-client), client_cap (a new one: every connection of its client is busy).",
	}, []string{"reason"})
	m.refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "smg_router_refused_total",
		Help: "Requests refused before routing, by reason: loop (already passed an smg router), body_timeout (body not received within --body-read-timeout-secs).",
	}, []string{"reason"})
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "smg_router_requests_total", Help: "Proxied requests by route and status class.",
	}, []string{"route", "status"})
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "smg_router_request_duration_seconds",
		Help:    "Time from request arrival to the end of the answer, by route.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 12),
	}, []string{"route"})
	for _, c := range []prometheus.Collector{m.overloadFallback, m.livenessFallback, m.shed, m.retries,
		m.upstream, m.revision, m.failOpen, m.breakers, m.connections, m.connsClosed, m.refused, requests, duration} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	// Pre-create every label value so series read 0 instead of being absent.
	for _, s := range stages {
		m.overloadFallback.WithLabelValues(s)
		m.livenessFallback.WithLabelValues(s)
		m.shed.WithLabelValues(s)
	}
	var err error
	if m.limiter, err = admission.NewLimiterMetrics(reg); err != nil {
		return nil, err
	}
	for r := range routeCount {
		for c, class := range statusClasses {
			m.requests[r][c] = requests.WithLabelValues(routeNames[r], class)
		}
		m.duration[r] = duration.WithLabelValues(routeNames[r])
	}
	for _, k := range []string{"connection", "timeout", "status_5xx", "other"} {
		m.upstream.WithLabelValues(k)
	}
	m.breakers.WithLabelValues("open")
	m.breakers.WithLabelValues("closed")
	m.breakers.WithLabelValues("half_open")
	m.refused.WithLabelValues(refusedLoop)
	m.refused.WithLabelValues(refusedBodyTimeout)
	for _, r := range []string{connClosedIdleAtCap, connClosedIdleAtClientCap, connClosedClientCap} {
		m.connsClosed.WithLabelValues(r)
	}
	return m, nil
}

func statusClass(code int) int {
	if code >= 200 && code < 600 {
		return code/100 - 2
	}
	return len(statusClasses) - 1
}
