package windows

import (
	"maps"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/smg-project/smg/controlplane/registry"
	"github.com/smg-project/smg/internal/promseries"
)

// Collector shows each worker's admission window and token budget and
// their shares, read from the registry at scrape time. A series' label
// pairs are kept with the worker until its URL, a source or its routers
// change, so a scrape builds none for a fleet that did not change (a
// worker per router each: at thousands of workers NewConstMetric's pairs
// were most of a scrape's garbage).
type Collector struct {
	reg  *registry.Registry
	desc [numDims]struct{ total, share *prometheus.Desc }

	mu      sync.Mutex
	scrape  uint64                  // count of scrapes, to mark what each saw
	workers map[string]*windowPairs // by worker id, the gated workers the last scrape saw
}

// windowPairs is a gated worker's label pairs as of the last scrape.
type windowPairs struct {
	url  string
	dims [numDims]dimPairs
	seen uint64
}

// dimPairs is one dimension's label pairs (rooms or tokens).
type dimPairs struct {
	source string
	total  []*dto.LabelPair            // worker, source
	shares map[string][]*dto.LabelPair // by router: worker, router
}

// NewCollector returns the admission window and token budget collector
// over reg.
func NewCollector(reg *registry.Registry) *Collector {
	c := &Collector{reg: reg, workers: map[string]*windowPairs{}}
	c.desc[dimRooms].total = prometheus.NewDesc("smg_worker_admission_window",
		"Running window of the worker under --worker-admission-window (0: none known), by source (spec, engine, learned).",
		[]string{"worker", "source"}, nil)
	c.desc[dimRooms].share = prometheus.NewDesc("smg_worker_admission_share",
		"Rooms of the worker's window (plus queue allowance) granted to each router.",
		[]string{"worker", "router"}, nil)
	c.desc[dimTokens].total = prometheus.NewDesc("smg_worker_token_budget",
		"Token budget of the worker under --worker-token-budget (its KV capacity in tokens; 0: none known), by source (engine, learned).",
		[]string{"worker", "source"}, nil)
	c.desc[dimTokens].share = prometheus.NewDesc("smg_worker_token_budget_share",
		"Tokens of the worker's token budget granted to each router.",
		[]string{"worker", "router"}, nil)
	return c
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.desc {
		ch <- d.total
		ch <- d.share
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	gauges := c.collect()
	for i := range gauges {
		ch <- &gauges[i]
	}
}

// dimOf is w's window in dimension dim: its size, source and shares (ok
// false: none).
func dimOf(w *registry.Worker, dim int) (total int64, source string, shares map[string]int64, ok bool) {
	if dim == dimTokens {
		if w.Budget == nil {
			return 0, "", nil, false
		}
		return w.Budget.Tokens, w.Budget.Source, w.TokenShare, true
	}
	if w.Admission == nil {
		return 0, "", nil, false
	}
	return w.Admission.Window, w.Admission.Source, w.WindowShare, true
}

// collect builds one scrape's gauges under the lock, sending nothing.
func (c *Collector) collect() []promseries.Gauge {
	workers := c.reg.Snapshot().Workers()
	n, gated := 0, 0
	for _, w := range workers {
		if w.Admission != nil || w.Budget != nil {
			gated++
		}
		for dim := range numDims {
			if _, _, shares, ok := dimOf(w, dim); ok {
				n += 1 + len(shares)
			}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.scrape++
	gauges := make([]promseries.Gauge, n)
	k := 0
	for _, w := range workers {
		if w.Admission == nil && w.Budget == nil {
			continue
		}
		p := c.pairsOf(w)
		for dim := range numDims {
			total, source, shares, ok := dimOf(w, dim)
			if !ok {
				continue
			}
			d := p.dim(dim, source)
			if d.total != nil {
				gauges[k].Set(c.desc[dim].total, d.total, float64(total))
				k++
			}
			for r, v := range shares {
				labels, ok := d.shares[r]
				if !ok {
					labels = promseries.Pairs("worker", p.url, "router", r)
					d.shares[r] = labels
				}
				if labels != nil {
					gauges[k].Set(c.desc[dim].share, labels, float64(v))
					k++
				}
			}
			if len(d.shares) > len(shares) { // routers gone since
				for r := range d.shares {
					if _, ok := shares[r]; !ok {
						delete(d.shares, r)
					}
				}
			}
		}
	}
	if len(c.workers) > gated {
		maps.DeleteFunc(c.workers, func(_ string, p *windowPairs) bool { return p.seen != c.scrape })
	}
	return gauges[:k]
}

// pairsOf returns the gated worker w's pairs, built anew when its URL
// changed.
func (c *Collector) pairsOf(w *registry.Worker) *windowPairs {
	url := w.Spec.GetUrl()
	p := c.workers[w.ID]
	if p == nil || p.url != url {
		p = &windowPairs{url: url}
		c.workers[w.ID] = p
	}
	p.seen = c.scrape
	return p
}

// dim returns dimension dim's pairs, its total's built anew when its
// source changed.
func (p *windowPairs) dim(dim int, source string) *dimPairs {
	d := &p.dims[dim]
	if d.shares == nil {
		d.shares = map[string][]*dto.LabelPair{}
	} else if d.source == source {
		return d
	}
	d.source, d.total = source, promseries.Pairs("worker", p.url, "source", source)
	return d
}
