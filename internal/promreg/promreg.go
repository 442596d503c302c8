// Package promreg builds the Prometheus registry every smg component exports
// on /metrics: fresh per process (never the global one), with the Go runtime
// and process collectors.
//
// It registers no component's metrics: each component registers its own.
package promreg

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// New returns a fresh registry with the Go and process collectors.
func New() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}
