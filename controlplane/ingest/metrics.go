package ingest

import (
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// Collector exposes the registry's load and verdicts at scrape time, so the
// ingest path updates no metric: smg_engine_* per worker/model/dp_rank and
// smg_workers_overloaded per model. A removed worker's smg_engine_* series
// read -1 (series cannot be deleted from a scraper's view).
type Collector struct {
	reg *registry.Registry

	mu      sync.Mutex
	removed map[rankKey]struct{}
	order   []rankKey           // eviction order of removed, oldest first
	models  map[string]struct{} // every model seen, so a model whose last worker went reads 0
}

// maxTombstones bounds how many removed series keep reporting -1.
const maxTombstones = 4096

type rankKey struct{ worker, model, rank string }

var (
	descWaiting    = prometheus.NewDesc("smg_engine_waiting_requests", "Requests waiting in the engine's scheduler queue, as last reported (-1: worker removed).", []string{"worker", "model", "dp_rank"}, nil)
	descTokenUsage = prometheus.NewDesc("smg_engine_token_usage", "KV cache token usage (0-1) the engine last reported (-1: worker removed).", []string{"worker", "model", "dp_rank"}, nil)
	descRunning    = prometheus.NewDesc("smg_engine_running_requests", "Requests in the engine's running batch, as last reported (-1: worker removed).", []string{"worker", "model", "dp_rank"}, nil)
	descThroughput = prometheus.NewDesc("smg_engine_gen_throughput", "Generation throughput (tokens/s) the engine last reported (-1: worker removed).", []string{"worker", "model", "dp_rank"}, nil)
	descCacheHit   = prometheus.NewDesc("smg_engine_cache_hit_rate", "Prefix cache hit rate (0-1) the engine last reported (-1: worker removed).", []string{"worker", "model", "dp_rank"}, nil)
	descOverloaded = prometheus.NewDesc("smg_workers_overloaded", "Workers currently excluded from routing by overload protection.", []string{"model"}, nil)
)

// NewCollector returns a collector over reg; register it on a Registerer.
func NewCollector(reg *registry.Registry) *Collector {
	return &Collector{reg: reg, removed: map[rankKey]struct{}{}, models: map[string]struct{}{}}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descWaiting, descTokenUsage, descRunning, descThroughput, descCacheHit, descOverloaded} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	snap := c.reg.Snapshot()
	overloaded := map[string]int{}
	live := map[rankKey]struct{}{}
	for _, w := range snap.Workers() {
		if w.Overloaded {
			overloaded[w.Model]++
		} else if _, ok := overloaded[w.Model]; !ok {
			overloaded[w.Model] = 0
		}
		for _, r := range w.Load.GetRanks() {
			k := rankKey{w.Spec.GetUrl(), w.Model, strconv.Itoa(int(r.GetDpRank()))}
			live[k] = struct{}{}
			emitRank(ch, k, r)
		}
	}
	c.mu.Lock()
	for m := range overloaded {
		if _, ok := c.models[m]; !ok && len(c.models) < maxTombstones {
			c.models[m] = struct{}{}
		}
	}
	for m := range c.models {
		if _, ok := overloaded[m]; !ok {
			overloaded[m] = 0
		}
	}
	c.mu.Unlock()
	for model, n := range overloaded {
		ch <- prometheus.MustNewConstMetric(descOverloaded, prometheus.GaugeValue, float64(n), model)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.removed {
		if _, back := live[k]; back {
			continue
		}
		emitRank(ch, k, nil)
	}
}

func emitRank(ch chan<- prometheus.Metric, k rankKey, r *smgv1.RankLoad) {
	gone := r == nil
	v := func(x float64) float64 {
		if gone {
			return -1
		}
		return x
	}
	ch <- prometheus.MustNewConstMetric(descWaiting, prometheus.GaugeValue, v(float64(r.GetWaitingRequests())), k.worker, k.model, k.rank)
	ch <- prometheus.MustNewConstMetric(descTokenUsage, prometheus.GaugeValue, v(r.GetTokenUsage()), k.worker, k.model, k.rank)
	ch <- prometheus.MustNewConstMetric(descRunning, prometheus.GaugeValue, v(float64(r.GetRunningRequests())), k.worker, k.model, k.rank)
	ch <- prometheus.MustNewConstMetric(descThroughput, prometheus.GaugeValue, v(r.GetGenThroughput()), k.worker, k.model, k.rank)
	ch <- prometheus.MustNewConstMetric(descCacheHit, prometheus.GaugeValue, v(r.GetCacheHitRate()), k.worker, k.model, k.rank)
}

// Removed records a removed worker so its series read -1 from now on.
func (c *Collector) Removed(w *registry.Worker) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range w.Load.GetRanks() {
		k := rankKey{w.Spec.GetUrl(), w.Model, strconv.Itoa(int(r.GetDpRank()))}
		if _, ok := c.removed[k]; ok {
			continue
		}
		if len(c.order) == maxTombstones {
			delete(c.removed, c.order[0])
			c.order = c.order[1:]
		}
		c.removed[k] = struct{}{}
		c.order = append(c.order, k)
	}
}
