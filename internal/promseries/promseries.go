// Package promseries writes scrape-time gauges over label pairs kept across
// scrapes, for collectors with a series per worker: NewConstMetric builds
// every label pair anew on every scrape (17 allocations a series of three
// labels), which at 10,000 workers made each scrape a garbage collection's
// worth of garbage.
//
// It holds label pairs, not values: collectors read their values at scrape
// time.
package promseries

import (
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Pairs returns the label pairs name=value, given as name, value, name,
// value..., sorted by name as a registry expects them. It returns nil when
// a value is not UTF-8 (NewConstMetric panicked on it): leave the series out.
// The pairs are read-only once built; every scrape may share them.
func Pairs(nameValues ...string) []*dto.LabelPair {
	out := make([]*dto.LabelPair, 0, len(nameValues)/2)
	for i := 0; i+1 < len(nameValues); i += 2 {
		if !utf8.ValidString(nameValues[i+1]) {
			return nil
		}
		out = append(out, &dto.LabelPair{Name: &nameValues[i], Value: &nameValues[i+1]})
	}
	slices.SortFunc(out, func(a, b *dto.LabelPair) int { return strings.Compare(a.GetName(), b.GetName()) })
	return out
}

// Gauge is one series of one scrape: a prometheus.Metric over label pairs
// kept across scrapes. A collector makes a scrape's gauges as one slice,
// never grown once set (Set points into it), and sends pointers into it;
// the scrape's encoder reads them after Collect returns, so the slice is
// never reused.
type Gauge struct {
	desc   *prometheus.Desc
	labels []*dto.LabelPair
	value  float64
	g      dto.Gauge
}

// Set makes g the series of desc with labels (from Pairs) at v.
func (g *Gauge) Set(desc *prometheus.Desc, labels []*dto.LabelPair, v float64) {
	g.desc, g.labels, g.value = desc, labels, v
	g.g.Value = &g.value
}

// Desc implements prometheus.Metric.
func (g *Gauge) Desc() *prometheus.Desc { return g.desc }

// Write implements prometheus.Metric.
func (g *Gauge) Write(m *dto.Metric) error {
	m.Label, m.Gauge = g.labels, &g.g
	return nil
}
