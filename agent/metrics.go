package agent

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

type metrics struct {
	connected *prometheus.GaugeVec
	connects  prometheus.Counter
	engines   prometheus.Gauge
	polls     *prometheus.CounterVec
	sent      *prometheus.CounterVec
	badPushes prometheus.Counter
}

// Poll outcomes, the outcome label of smg_agent_polls_total.
const (
	outcomeReport           = "report"
	outcomeNoReport         = "no_report"
	outcomeTransportFailure = "transport_failure"
	outcomeTimeout          = "timeout"
)

func newMetrics(r prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		connected: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "smg_agent_connected",
			Help: "1 while the agent's stream to the control plane is up.",
		}, []string{"controlplane"}),
		connects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "smg_agent_stream_connects_total",
			Help: "Streams to the control plane opened (the first connect and every reconnect).",
		}),
		engines: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "smg_agent_engines",
			Help: "Engines the agent polls (its own and those assigned to its node).",
		}),
		polls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "smg_agent_polls_total",
			Help: "Engine polls by outcome: report, no_report (answered without a usable load), transport_failure, timeout.",
		}, []string{"outcome"}),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "smg_agent_messages_sent_total",
			Help: "Messages sent to the control plane by kind: hello, record, event, heartbeat (records counted one by one, also when several go in one message).",
		}, []string{"kind"}),
		badPushes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "smg_agent_bad_pushed_loads_total",
			Help: "Load records on gRPC engines' KV event batches dropped as unbelievable (a rank out of range or not the batch's, a negative count, a usage that is not a fraction, NaN).",
		}),
	}
	if r == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.connected, m.connects, m.engines, m.polls, m.sent, m.badPushes} {
		if err := r.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Handler serves the agent's own /metrics (from g) and /health.
func Handler(g prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	mux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	return mux
}
