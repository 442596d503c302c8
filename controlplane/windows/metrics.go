package windows

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/smg-project/smg/controlplane/registry"
	"github.com/smg-project/smg/internal/promseries"
)

// Collector shows each worker's admission window and its shares, read from
// the registry at scrape time. A series' label pairs are kept with the
// worker until its URL, its window's source or its routers change, so a
// scrape builds none for a fleet that did not change (a worker per router
// each: at thousands of workers NewConstMetric's pairs were most of a
// scrape's garbage).
type Collector struct {
	reg           *registry.Registry
	window, share *prometheus.Desc

	mu      sync.Mutex
	scrape  uint64                  // count of scrapes, to mark what each saw
	workers map[string]*windowPairs // by worker id, the gated workers the last scrape saw
}

// windowPairs is a gated worker's label pairs as of the last scrape.
type windowPairs struct {
	url, source string
	window      []*dto.LabelPair            // worker, source
	shares      map[string][]*dto.LabelPair // by router: worker, router
	seen        uint64
}

// NewCollector returns the admission window collector over reg.
func NewCollector(reg *registry.Registry) *Collector {
	return &Collector{
		reg: reg,
		window: prometheus.NewDesc("smg_worker_admission_window",
			"Running window of the worker under --worker-admission-window (0: none known), by source (spec, engine, learned).",
			[]string{"worker", "source"}, nil),
		share: prometheus.NewDesc("smg_worker_admission_share",
			"Rooms of the worker's window (plus queue allowance) granted to each router.",
			[]string{"worker", "router"}, nil),
		workers: map[string]*windowPairs{},
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.window
	ch <- c.share
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	gauges := c.collect()
	for i := range gauges {
		ch <- &gauges[i]
	}
}

// collect builds one scrape's gauges under the lock, sending nothing.
func (c *Collector) collect() []promseries.Gauge {
	workers := c.reg.Snapshot().Workers()
	n, gated := 0, 0
	for _, w := range workers {
		if w.Admission != nil {
			n += 1 + len(w.WindowShare)
			gated++
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.scrape++
	gauges := make([]promseries.Gauge, n)
	k := 0
	for _, w := range workers {
		if w.Admission == nil {
			continue
		}
		p := c.pairsOf(w)
		if p.window != nil {
			gauges[k].Set(c.window, p.window, float64(w.Admission.Window))
			k++
		}
		for r, rooms := range w.WindowShare {
			labels, ok := p.shares[r]
			if !ok {
				labels = promseries.Pairs("worker", p.url, "router", r)
				p.shares[r] = labels
			}
			if labels != nil {
				gauges[k].Set(c.share, labels, float64(rooms))
				k++
			}
		}
		if len(p.shares) > len(w.WindowShare) { // routers gone since
			for r := range p.shares {
				if _, ok := w.WindowShare[r]; !ok {
					delete(p.shares, r)
				}
			}
		}
	}
	if len(c.workers) > gated {
		for id, p := range c.workers {
			if p.seen != c.scrape {
				delete(c.workers, id)
			}
		}
	}
	return gauges[:k]
}

// pairsOf returns the gated worker w's pairs, built anew when its URL or
// its window's source changed.
func (c *Collector) pairsOf(w *registry.Worker) *windowPairs {
	url := w.Spec.GetUrl()
	p := c.workers[w.ID]
	if p == nil || p.url != url {
		p = &windowPairs{url: url, source: w.Admission.Source, shares: map[string][]*dto.LabelPair{},
			window: promseries.Pairs("worker", url, "source", w.Admission.Source)}
		c.workers[w.ID] = p
	} else if p.source != w.Admission.Source {
		p.source, p.window = w.Admission.Source, promseries.Pairs("worker", url, "source", w.Admission.Source)
	}
	p.seen = c.scrape
	return p
}
