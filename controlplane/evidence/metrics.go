package evidence

import (
	"cmp"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/promseries"
)

// Collector exposes the registry's load and verdicts at scrape time, so the
// ingest path updates no metric: smg_engine_* per worker/model/dp_rank and
// smg_workers_overloaded per model. A removed worker's smg_engine_* series
// read -1 (series cannot be deleted from a scraper's view).
//
// A scrape at 10,000 workers writes 50,000 series: label pairs are kept
// with their worker until its URL, model or ranks change, and values go out
// in one slice of gauges in the registry's label order (re-sorted only when
// a series comes or goes): two allocations per series, not 17.
type Collector struct {
	reg *registry.Registry

	mu         sync.Mutex
	scrape     uint64                  // count of scrapes, to mark what each saw
	workers    map[string]*workerPairs // by worker id, every worker the last scrape saw
	models     map[string]*modelPairs  // models with workers, and the ones remembered
	remembered int                     // models kept after their last worker went
	removed    map[rankKey]*rankPairs
	order      []rankKey                   // eviction order of removed, oldest first
	sorted     []*rankPairs                // every rank of workers and removed in label order
	ranks      [sharedRanks]*dto.LabelPair // dp_rank pairs shared by every worker
	dirty      bool                        // sorted misses a series or holds one dropped
}

// maxTombstones bounds how many removed series keep reporting -1, and how
// many models keep reporting smg_workers_overloaded 0 after their last worker.
const maxTombstones = 4096

type rankKey struct{ worker, model, rank string }

// engineDescs in the order a rank's five series are written.
var engineDescs = [5]*prometheus.Desc{
	engineDesc("smg_engine_waiting_requests", "Requests waiting in the engine's scheduler queue, as last reported"),
	engineDesc("smg_engine_token_usage", "KV cache token usage (0-1) the engine last reported"),
	engineDesc("smg_engine_running_requests", "Requests in the engine's running batch, as last reported"),
	engineDesc("smg_engine_gen_throughput", "Generation throughput (tokens/s) the engine last reported"),
	engineDesc("smg_engine_cache_hit_rate", "Prefix cache hit rate (0-1) the engine last reported"),
}

var descOverloaded = prometheus.NewDesc("smg_workers_overloaded", "Workers currently excluded from routing by overload protection.", []string{"model"}, nil)

func engineDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(name, help+" (-1: worker removed).", []string{"worker", "model", "dp_rank"}, nil)
}

// The label names, shared by every pair built here (read-only once built).
var nameWorker, nameRank = "worker", "dp_rank"

// sharedRanks is how many dp_ranks (0 up) share one dp_rank pair across
// workers: fewer pairs per worker, less heap for each GC to mark.
const sharedRanks = 64

// workerPairs is a worker's label pairs as of the last scrape that saw it.
type workerPairs struct {
	url, model string
	worker     *dto.LabelPair // worker=url (nil: not UTF-8)
	modelPairs *modelPairs
	ranks      []rankPairs // as the worker's ranks, never grown (sorted and the pairs point into it)
	seen       uint64      // scrape that saw the worker last
}

// rankPairs is one rank's series: a worker's, or a removed one's, written
// at -1 unless a live worker has the same.
type rankPairs struct {
	rank    int32
	key     rankKey
	labels  []*dto.LabelPair // nil: a duplicate rank, or a label not UTF-8: not written
	load    *smgv1.RankLoad  // this scrape's, while it runs
	seen    uint64           // the last scrape that saw it (removed: a live worker with it)
	removed bool
}

// modelPairs is a model's smg_workers_overloaded series and its count in
// the scrape that saw it last.
type modelPairs struct {
	labels     []*dto.LabelPair
	overloaded int
	seen       uint64
	remembered bool
}

// NewCollector returns a collector over reg; register it on a Registerer.
func NewCollector(reg *registry.Registry) *Collector {
	return &Collector{reg: reg, workers: map[string]*workerPairs{}, models: map[string]*modelPairs{},
		removed: map[rankKey]*rankPairs{}}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range engineDescs {
		ch <- d
	}
	ch <- descOverloaded
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ranks, models := c.collect()
	for i := range ranks {
		ch <- &ranks[i]
	}
	for i := range models {
		ch <- &models[i]
	}
}

// collect builds one scrape's gauges under the lock (sending none: a slow
// scraper never holds it): every live rank's, every removed one no live
// worker shadows, in label order, and every model's.
func (c *Collector) collect() (ranks, models []promseries.Gauge) {
	workers := c.reg.Snapshot().Workers()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.scrape++
	now := c.scrape
	for _, w := range workers {
		p := c.pairsOf(w)
		p.seen = now
		m := p.modelPairs
		if m.seen != now {
			m.seen, m.overloaded = now, 0
		}
		if w.Overloaded {
			m.overloaded++
		}
		for i, r := range w.Load.GetRanks() {
			rp := &p.ranks[i]
			if rp.labels == nil {
				continue
			}
			rp.seen, rp.load = now, r
			if len(c.removed) > 0 {
				if t := c.removed[rp.key]; t != nil {
					t.seen = now
				}
			}
		}
	}
	if len(c.workers) > len(workers) {
		for id, p := range c.workers {
			if p.seen != now {
				delete(c.workers, id)
				c.dirty = true
			}
		}
	}
	if c.dirty {
		c.sort()
	}
	ranks = make([]promseries.Gauge, len(engineDescs)*len(c.sorted))
	k := 0
	for _, s := range c.sorted {
		switch {
		case !s.removed && s.seen == now:
			r := s.load
			s.load = nil // the registry's record, not kept past the scrape
			v := [5]float64{float64(r.GetWaitingRequests()), r.GetTokenUsage(), float64(r.GetRunningRequests()),
				r.GetGenThroughput(), r.GetCacheHitRate()}
			for j, d := range engineDescs {
				ranks[k].Set(d, s.labels, v[j])
				k++
			}
		case s.removed && s.seen != now:
			for _, d := range engineDescs {
				ranks[k].Set(d, s.labels, -1)
				k++
			}
		}
	}
	models = make([]promseries.Gauge, len(c.models))
	k2 := 0
	for name, m := range c.models {
		switch {
		case m.seen == now:
		case m.remembered:
			m.overloaded = 0
		default:
			delete(c.models, name) // forgotten with its last worker
			continue
		}
		if m.labels != nil {
			models[k2].Set(descOverloaded, m.labels, float64(m.overloaded))
			k2++
		}
	}
	return ranks[:k], models[:k2]
}

// sort rebuilds sorted: by dp_rank, model and worker, the order of their
// label pairs, as the registry sorts a family's series.
func (c *Collector) sort() {
	c.sorted = c.sorted[:0]
	for _, p := range c.workers {
		for i := range p.ranks {
			if rp := &p.ranks[i]; rp.labels != nil {
				c.sorted = append(c.sorted, rp)
			}
		}
	}
	c.sorted = slices.AppendSeq(c.sorted, maps.Values(c.removed))
	slices.SortFunc(c.sorted, func(a, b *rankPairs) int {
		return cmp.Or(strings.Compare(a.key.rank, b.key.rank), strings.Compare(a.key.model, b.key.model), strings.Compare(a.key.worker, b.key.worker))
	})
	clear(c.sorted[len(c.sorted):cap(c.sorted)]) // drop what the last sort held
	c.dirty = false
}

// pairsOf returns w's label pairs, built anew only when its URL, model or
// ranks changed since the last scrape. Duplicate dp_ranks in one report
// (an agent's mistake) keep the first: two series with the same labels
// would fail the whole scrape.
func (c *Collector) pairsOf(w *registry.Worker) *workerPairs {
	url, ranks := w.Spec.GetUrl(), w.Load.GetRanks()
	p := c.workers[w.ID]
	if p == nil || p.url != url || p.model != w.Model {
		p = &workerPairs{url: url, model: w.Model, modelPairs: c.model(w.Model)}
		if utf8.ValidString(url) {
			p.worker = &dto.LabelPair{Name: &nameWorker, Value: &p.url}
		}
		c.workers[w.ID] = p
		c.dirty = true
	}
	if slices.EqualFunc(p.ranks, ranks, func(rp rankPairs, r *smgv1.RankLoad) bool { return rp.rank == r.GetDpRank() }) {
		return p
	}
	c.dirty = true
	p.ranks = make([]rankPairs, len(ranks))
	for i, r := range ranks {
		rp := &p.ranks[i]
		rp.rank = r.GetDpRank()
		rp.key = rankKey{url, w.Model, strconv.Itoa(int(rp.rank))}
		dup := slices.ContainsFunc(ranks[:i], func(o *smgv1.RankLoad) bool { return o.GetDpRank() == rp.rank })
		if !dup && p.worker != nil && p.modelPairs.labels != nil {
			rp.labels = []*dto.LabelPair{c.rankPair(rp), p.modelPairs.labels[0], p.worker}
		}
	}
	return p
}

// rankPair is rp's dp_rank pair: one for every worker's rank below
// sharedRanks, else rp's own.
func (c *Collector) rankPair(rp *rankPairs) *dto.LabelPair {
	if rp.rank < 0 || rp.rank >= sharedRanks {
		return &dto.LabelPair{Name: &nameRank, Value: &rp.key.rank}
	}
	if c.ranks[rp.rank] == nil {
		v := rp.key.rank // not a pointer into rp: the pair outlives the worker
		c.ranks[rp.rank] = &dto.LabelPair{Name: &nameRank, Value: &v}
	}
	return c.ranks[rp.rank]
}

// model returns the model's series, created on first sight; the first
// maxTombstones models are remembered after their last worker goes.
func (c *Collector) model(name string) *modelPairs {
	m := c.models[name]
	if m == nil {
		m = &modelPairs{labels: promseries.Pairs("model", name)}
		if c.remembered < maxTombstones {
			m.remembered = true
			c.remembered++
		}
		c.models[name] = m
	}
	return m
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
		labels := promseries.Pairs("worker", k.worker, "model", k.model, "dp_rank", k.rank)
		if labels == nil { // not UTF-8
			continue
		}
		if len(c.order) == maxTombstones {
			delete(c.removed, c.order[0])
			c.order = c.order[1:]
		}
		c.removed[k] = &rankPairs{key: k, labels: labels, removed: true}
		c.order = append(c.order, k)
		c.dirty = true
	}
}
