package watch

import "github.com/prometheus/client_golang/prometheus"

// metrics of the watch server. Router lag is computed at scrape time from the
// router records, so it is always measured against the current revision.
type metrics struct {
	streams prometheus.Gauge
	sent    *prometheus.CounterVec
	encoded *prometheus.CounterVec
	// sent and encoded by frame kind, resolved once: every stream counts
	// every send (1,000 routers: 20,000 a second at 20 changes a second).
	sentBy, encodedBy [len(kindNames)]prometheus.Counter
	goodbyes          prometheus.Counter
	shared            prometheus.Gauge   // streams held by the shared writers
	stalls            prometheus.Counter // sends that outlasted WriterStall
}

func newMetrics(s *Server, reg prometheus.Registerer) *metrics {
	m := &metrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "smg_watch_streams",
			Help: "Watch streams open from routers."}),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "smg_watch_messages_sent_total",
			Help: "Watch messages sent to routers, by kind (snapshot, delta, heartbeat, goodbye)."}, []string{"kind"}),
		encoded: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "smg_watch_messages_encoded_total",
			Help: "Watch messages marshalled, by kind (snapshot, delta, heartbeat): each is encoded once and the same bytes go to every stream that needs it."}, []string{"kind"}),
		shared: prometheus.NewGauge(prometheus.GaugeOpts{Name: "smg_watch_shared_streams",
			Help: "Watch streams written by the shared writers (the rest are written by their own goroutine: routers behind on their acks, or whose send stalled)."}),
		stalls: prometheus.NewCounter(prometheus.CounterOpts{Name: "smg_watch_writer_stalls_total",
			Help: "Sends to a router that blocked a shared writer for longer than its bound (20 ms): the writer's other streams went to a new writer, the router's stream to its own goroutine."}),
	}
	for k, name := range kindNames {
		m.sentBy[k], m.encodedBy[k] = m.sent.WithLabelValues(name), m.encoded.WithLabelValues(name)
	}
	m.goodbyes = m.sent.WithLabelValues("goodbye")
	if reg != nil {
		reg.MustRegister(m.streams, m.sent, m.encoded, m.shared, m.stalls, lagCollector{s})
	}
	return m
}

var lagDesc = prometheus.NewDesc("smg_router_watch_lag",
	"Revisions a watching router is behind the control plane (current revision minus the revision it acknowledged).",
	[]string{"router"}, nil)

// lagCollector reports smg_router_watch_lag for every router watching.
type lagCollector struct{ s *Server }

func (c lagCollector) Describe(ch chan<- *prometheus.Desc) { ch <- lagDesc }

func (c lagCollector) Collect(ch chan<- prometheus.Metric) {
	for _, r := range c.s.Routers() {
		ch <- prometheus.MustNewConstMetric(lagDesc, prometheus.GaugeValue, float64(r.Lag), r.RouterId)
	}
}
