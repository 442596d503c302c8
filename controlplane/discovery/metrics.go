package discovery

import "github.com/prometheus/client_golang/prometheus"

// PodStates are the values of smg_discovery_pods{state}.
var PodStates = []string{"ready", "not_ready", "no_ip", "conflict"}

// Events are the values of smg_discovery_events_total{event}.
var Events = []string{"added", "removed", "updated", "ip_changed", "lost_ready", "bad_annotation", "conflict", "rejected"}

// Metrics are discovery's series.
type Metrics struct {
	pods   *prometheus.GaugeVec
	events *prometheus.CounterVec
}

// NewMetrics registers discovery's series on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		pods: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "smg_discovery_pods",
			Help: "Engine pods matched by a service-discovery selector, by state (ready, not_ready, no_ip, conflict)."}, []string{"state"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "smg_discovery_events_total",
			Help: "Service-discovery events: added, removed, updated, ip_changed, lost_ready, bad_annotation, conflict, rejected."}, []string{"event"}),
	}
	for _, s := range PodStates {
		m.pods.WithLabelValues(s)
	}
	for _, e := range Events {
		m.events.WithLabelValues(e)
	}
	for _, c := range []prometheus.Collector{m.pods, m.events} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *Metrics) event(e string) { m.events.WithLabelValues(e).Inc() }
