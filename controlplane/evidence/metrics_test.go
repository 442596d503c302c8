package evidence_test

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/smg-project/smg/controlplane/evidence"
	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	smgtest "github.com/smg-project/smg/internal/testutil"
)

// refCollector is the collector as it was before its label pairs were kept
// across scrapes (NewConstMetric per series, maps per scrape): the
// reference the new one must expose byte for byte.
type refCollector struct {
	reg     *registry.Registry
	mu      sync.Mutex
	removed map[refKey]struct{}
	order   []refKey
	models  map[string]struct{}
}

type refKey struct{ worker, model, rank string }

const refMaxTombstones = 4096

var refDescs = func() map[string]*prometheus.Desc {
	labels := []string{"worker", "model", "dp_rank"}
	return map[string]*prometheus.Desc{
		"waiting":    prometheus.NewDesc("smg_engine_waiting_requests", "Requests waiting in the engine's scheduler queue, as last reported (-1: worker removed).", labels, nil),
		"usage":      prometheus.NewDesc("smg_engine_token_usage", "KV cache token usage (0-1) the engine last reported (-1: worker removed).", labels, nil),
		"running":    prometheus.NewDesc("smg_engine_running_requests", "Requests in the engine's running batch, as last reported (-1: worker removed).", labels, nil),
		"throughput": prometheus.NewDesc("smg_engine_gen_throughput", "Generation throughput (tokens/s) the engine last reported (-1: worker removed).", labels, nil),
		"hit":        prometheus.NewDesc("smg_engine_cache_hit_rate", "Prefix cache hit rate (0-1) the engine last reported (-1: worker removed).", labels, nil),
		"overloaded": prometheus.NewDesc("smg_workers_overloaded", "Workers currently excluded from routing by overload protection.", []string{"model"}, nil),
	}
}()

func newRefCollector(reg *registry.Registry) *refCollector {
	return &refCollector{reg: reg, removed: map[refKey]struct{}{}, models: map[string]struct{}{}}
}

func (c *refCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range refDescs {
		ch <- d
	}
}

func (c *refCollector) Collect(ch chan<- prometheus.Metric) {
	overloaded := map[string]int{}
	live := map[refKey]struct{}{}
	for _, w := range c.reg.Snapshot().Workers() {
		if w.Overloaded {
			overloaded[w.Model]++
		} else if _, ok := overloaded[w.Model]; !ok {
			overloaded[w.Model] = 0
		}
		for _, r := range w.Load.GetRanks() {
			k := refKey{w.Spec.GetUrl(), w.Model, strconv.Itoa(int(r.GetDpRank()))}
			live[k] = struct{}{}
			refEmit(ch, k, r)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for m := range overloaded {
		if _, ok := c.models[m]; !ok && len(c.models) < refMaxTombstones {
			c.models[m] = struct{}{}
		}
	}
	for m := range c.models {
		if _, ok := overloaded[m]; !ok {
			overloaded[m] = 0
		}
	}
	for model, n := range overloaded {
		ch <- prometheus.MustNewConstMetric(refDescs["overloaded"], prometheus.GaugeValue, float64(n), model)
	}
	for k := range c.removed {
		if _, back := live[k]; !back {
			refEmit(ch, k, nil)
		}
	}
}

func refEmit(ch chan<- prometheus.Metric, k refKey, r *smgv1.RankLoad) {
	v := func(x float64) float64 {
		if r == nil {
			return -1
		}
		return x
	}
	for name, x := range map[string]float64{"waiting": float64(r.GetWaitingRequests()), "usage": r.GetTokenUsage(),
		"running": float64(r.GetRunningRequests()), "throughput": r.GetGenThroughput(), "hit": r.GetCacheHitRate()} {
		ch <- prometheus.MustNewConstMetric(refDescs[name], prometheus.GaugeValue, v(x), k.worker, k.model, k.rank)
	}
}

func (c *refCollector) Removed(w *registry.Worker) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range w.Load.GetRanks() {
		k := refKey{w.Spec.GetUrl(), w.Model, strconv.Itoa(int(r.GetDpRank()))}
		if _, ok := c.removed[k]; ok {
			continue
		}
		if len(c.order) == refMaxTombstones {
			delete(c.removed, c.order[0])
			c.order = c.order[1:]
		}
		c.removed[k] = struct{}{}
		c.order = append(c.order, k)
	}
}

// exposition is g's text exposition, what a scraper reads.
func exposition(t *testing.T, g prometheus.Gatherer) string {
	t.Helper()
	s, err := smgtest.Exposition(g)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// fleet is a registry changed at random, with the new collector and the
// reference over it, each told of the removals.
type fleet struct {
	t       *testing.T
	rng     *rand.Rand
	reg     *registry.Registry
	c       *evidence.Collector
	ref     *refCollector
	got     *prometheus.Registry
	want    *prometheus.Registry
	urls    int // URLs handed out so far
	nModels int
}

func newFleet(t *testing.T, seed uint64, models int) *fleet {
	reg := registry.New("test", 0)
	f := &fleet{t: t, rng: rand.New(rand.NewPCG(seed, 1)), reg: reg, c: evidence.NewCollector(reg),
		ref: newRefCollector(reg), got: prometheus.NewRegistry(), want: prometheus.NewRegistry(), nModels: models}
	f.got.MustRegister(f.c)
	f.want.MustRegister(f.ref)
	return f
}

// load is a report of distinct dp_ranks with random figures.
func (f *fleet) load() *smgv1.EngineLoad {
	l := &smgv1.EngineLoad{WaitingRequests: f.rng.Int32N(4)}
	for _, r := range f.rng.Perm(4)[:f.rng.IntN(4)] {
		l.Ranks = append(l.Ranks, &smgv1.RankLoad{DpRank: int32(r * 5), WaitingRequests: f.rng.Int32N(20),
			RunningRequests: f.rng.Int32N(300), TokenUsage: f.rng.Float64(), GenThroughput: f.rng.Float64() * 3000,
			CacheHitRate: f.rng.Float64()})
	}
	return l
}

func (f *fleet) model() string { return fmt.Sprintf("model-%d", f.rng.IntN(f.nModels)) }

// newURL is a URL no worker had.
func (f *fleet) newURL() string {
	f.urls++
	return fmt.Sprintf("http://10.0.%d.%d:8000", f.urls/250, f.urls%250)
}

// step makes n random changes in one transaction: workers appear (some at a
// removed worker's URL again), disappear, report, change model, URL or
// ranks, go in and out of overload.
func (f *fleet) step(n int) {
	var gone []*registry.Worker
	_, err := f.reg.Update(func(tx *registry.Txn) error {
		ws := tx.Workers()
		used := map[string]bool{}
		for _, w := range ws {
			used[w.Spec.GetUrl()] = true
		}
		freeURL := func() string {
			if f.urls > 0 && f.rng.IntN(3) == 0 { // a URL seen before, if no worker holds it now
				u := fmt.Sprintf("http://10.0.%d.%d:8000", 0, 1+f.rng.IntN(min(f.urls, 249)))
				if !used[u] {
					used[u] = true
					return u
				}
			}
			u := f.newURL()
			used[u] = true
			return u
		}
		for range n {
			var w *registry.Worker
			if len(ws) > 0 {
				w = ws[f.rng.IntN(len(ws))]
				if tx.Get(w.ID) == nil {
					continue // removed in this step already
				}
				w = tx.Get(w.ID)
			}
			switch op := f.rng.IntN(10); {
			case w == nil || op == 0:
				tx.Insert(&registry.Worker{Registered: registry.Registered{ID: fmt.Sprintf("w%d", f.rng.IntN(1<<20)), Spec: &smgv1.WorkerSpec{Url: freeURL()}, Model: f.model(), Thresholds: judge.Thresholds{WaitingRequests: 2}}, State: registry.State{Health: registry.HealthHealthy, Load: f.load()}})
			case op == 1:
				tx.Delete(w.ID)
				delete(used, w.Spec.GetUrl())
				gone = append(gone, w)
			case op == 2:
				c := w.Clone()
				c.Model = f.model()
				tx.Insert(c)
			case op == 3:
				c := w.Clone()
				delete(used, c.Spec.GetUrl())
				c.Spec = &smgv1.WorkerSpec{Url: freeURL()}
				tx.Insert(c)
			case op == 4:
				c := w.Clone()
				c.Load = nil
				tx.Insert(c)
			default:
				c := w.Clone()
				c.Load = f.load()
				tx.Insert(c)
			}
		}
		return nil
	})
	if err != nil {
		f.t.Fatal(err)
	}
	for _, w := range gone {
		f.c.Removed(w)
		f.ref.Removed(w)
	}
}

// The new collector exposes what the old construction did, byte for byte,
// scrape after scrape while workers appear, report, change labels and go.
func TestCollectorExposesAsNewConstMetricDid(t *testing.T) {
	for seed := range uint64(20) {
		f := newFleet(t, seed, 1+int(seed%4))
		for round := range 30 {
			f.step(1 + f.rng.IntN(12))
			got, want := exposition(t, f.got), exposition(t, f.want)
			if got != want {
				t.Fatalf("seed %d round %d: exposition differs\n--- got\n%s\n--- want (NewConstMetric)\n%s", seed, round, got, want)
			}
			if round%7 == 0 && exposition(t, f.got) != want {
				t.Fatalf("seed %d round %d: a second scrape of the same registry differs", seed, round)
			}
		}
	}
}

// Past the bounds: more removed series than are kept at -1 (the oldest go
// first) and more models than are remembered once their workers go.
func TestCollectorBoundsAsNewConstMetricDid(t *testing.T) {
	f := newFleet(t, 7, 1)
	const n = 4096 + 300
	_, err := f.reg.Update(func(tx *registry.Txn) error {
		for i := range n {
			tx.Insert(&registry.Worker{Registered: registry.Registered{ID: fmt.Sprintf("w%05d", i), Spec: &smgv1.WorkerSpec{Url: fmt.Sprintf("http://e%05d", i)}, Model: fmt.Sprintf("m%05d", i)}, State: registry.State{Health: registry.HealthHealthy, Load: &smgv1.EngineLoad{Ranks: []*smgv1.RankLoad{{WaitingRequests: int32(i)}}}}})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Which models stay once more than the bound had workers at once was
	// up to map order in the old construction: compared apart.
	engine := func(exp string) string {
		var keep []string
		for _, l := range strings.Split(exp, "\n") {
			if !strings.Contains(l, "smg_workers_overloaded") {
				keep = append(keep, l)
			}
		}
		return strings.Join(keep, "\n")
	}
	check := func(what string, models int) {
		t.Helper()
		got, want := exposition(t, f.got), exposition(t, f.want)
		if engine(got) != engine(want) {
			t.Fatalf("%s: smg_engine_* exposition differs (%d against %d bytes)", what, len(got), len(want))
		}
		if c, err := testutil.GatherAndCount(f.got, "smg_workers_overloaded"); err != nil || c != models {
			t.Fatalf("%s: %d models (err %v), want %d", what, c, err, models)
		}
	}
	check("all live", n)
	snap := f.reg.Snapshot()
	_, err = f.reg.Update(func(tx *registry.Txn) error {
		for i := range n {
			tx.Delete(fmt.Sprintf("w%05d", i))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		w := snap.Get(fmt.Sprintf("w%05d", i))
		f.c.Removed(w)
		f.ref.Removed(w)
	}
	check("all removed", 4096)
	if c, err := testutil.GatherAndCount(f.got, "smg_engine_waiting_requests"); err != nil || c != 4096 {
		t.Fatalf("%d removed series at -1 (err %v), want the newest 4096", c, err)
	}
}

// Series follow the workers: a new worker's appear, a removed worker's read
// -1, and a series whose labels no worker has any more (a model or URL
// changed, a rank gone) vanishes.
func TestCollectorSeriesFollowWorkers(t *testing.T) {
	reg := registry.New("test", 0)
	c := evidence.NewCollector(reg)
	pr := prometheus.NewRegistry()
	pr.MustRegister(c)
	put := func(id, url, model string, ranks ...int32) {
		t.Helper()
		l := &smgv1.EngineLoad{}
		for _, r := range ranks {
			l.Ranks = append(l.Ranks, &smgv1.RankLoad{DpRank: r, WaitingRequests: 10*r + 1})
		}
		if _, err := reg.Update(func(tx *registry.Txn) error {
			tx.Insert(&registry.Worker{Registered: registry.Registered{ID: id, Spec: &smgv1.WorkerSpec{Url: url}, Model: model}, State: registry.State{Health: registry.HealthHealthy, Load: l}})
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(series ...string) {
		t.Helper()
		want := "# HELP smg_engine_waiting_requests Requests waiting in the engine's scheduler queue, as last reported (-1: worker removed).\n" +
			"# TYPE smg_engine_waiting_requests gauge\n"
		for _, s := range series {
			want += "smg_engine_waiting_requests" + s + "\n"
		}
		if len(series) == 0 {
			want = ""
		}
		if err := testutil.GatherAndCompare(pr, strings.NewReader(want), "smg_engine_waiting_requests"); err != nil {
			t.Fatal(err)
		}
	}
	put("a", "http://a", "m1", 0, 1)
	expect(`{dp_rank="0",model="m1",worker="http://a"} 1`, `{dp_rank="1",model="m1",worker="http://a"} 11`)
	put("b", "http://b", "m1", 0)
	expect(`{dp_rank="0",model="m1",worker="http://a"} 1`, `{dp_rank="0",model="m1",worker="http://b"} 1`,
		`{dp_rank="1",model="m1",worker="http://a"} 11`)
	put("a", "http://a", "m2", 0, 1) // model changed: the m1 series vanish
	expect(`{dp_rank="0",model="m1",worker="http://b"} 1`, `{dp_rank="0",model="m2",worker="http://a"} 1`,
		`{dp_rank="1",model="m2",worker="http://a"} 11`)
	put("a", "http://a2", "m2", 1) // URL changed, rank 0 gone
	expect(`{dp_rank="0",model="m1",worker="http://b"} 1`, `{dp_rank="1",model="m2",worker="http://a2"} 11`)
	old := reg.Snapshot().Get("b")
	if _, err := reg.Update(func(tx *registry.Txn) error { tx.Delete("b"); return nil }); err != nil {
		t.Fatal(err)
	}
	c.Removed(old)
	expect(`{dp_rank="0",model="m1",worker="http://b"} -1`, `{dp_rank="1",model="m2",worker="http://a2"} 11`)
	put("b2", "http://b", "m1", 0, 2) // back at the same URL: live again, and a new rank
	expect(`{dp_rank="0",model="m1",worker="http://b"} 1`, `{dp_rank="1",model="m2",worker="http://a2"} 11`,
		`{dp_rank="2",model="m1",worker="http://b"} 21`)
	if _, err := reg.Update(func(tx *registry.Txn) error { tx.Delete("a"); tx.Delete("b2"); return nil }); err != nil {
		t.Fatal(err)
	}
	// Gone without Removed (a registry that lost them otherwise): nothing
	// stays but b's tombstone.
	expect(`{dp_rank="0",model="m1",worker="http://b"} -1`)
	// Removed before any scrape saw it.
	put("c", "http://c", "m1", 4)
	old = reg.Snapshot().Get("c")
	if _, err := reg.Update(func(tx *registry.Txn) error { tx.Delete("c"); return nil }); err != nil {
		t.Fatal(err)
	}
	c.Removed(old)
	expect(`{dp_rank="0",model="m1",worker="http://b"} -1`, `{dp_rank="4",model="m1",worker="http://c"} -1`)
}

// A report naming one dp_rank twice keeps the first: NewConstMetric made two
// series with the same labels and the whole scrape failed.
func TestCollectorDuplicateRankKeepsTheFirst(t *testing.T) {
	reg := registry.New("test", 0)
	pr := prometheus.NewRegistry()
	pr.MustRegister(evidence.NewCollector(reg))
	if _, err := reg.Update(func(tx *registry.Txn) error {
		tx.Insert(&registry.Worker{Registered: registry.Registered{ID: "a", Spec: &smgv1.WorkerSpec{Url: "http://a"}, Model: "m"}, State: registry.State{Health: registry.HealthHealthy, Load: &smgv1.EngineLoad{Ranks: []*smgv1.RankLoad{{DpRank: 3, WaitingRequests: 7}, {DpRank: 3, WaitingRequests: 9}, {DpRank: 1, WaitingRequests: 2}}}}})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := `# HELP smg_engine_waiting_requests Requests waiting in the engine's scheduler queue, as last reported (-1: worker removed).
# TYPE smg_engine_waiting_requests gauge
smg_engine_waiting_requests{dp_rank="1",model="m",worker="http://a"} 2
smg_engine_waiting_requests{dp_rank="3",model="m",worker="http://a"} 7
`
	if err := testutil.GatherAndCompare(pr, strings.NewReader(want), "smg_engine_waiting_requests"); err != nil {
		t.Fatal(err)
	}
}

// A label that is not UTF-8 (no valid registration has one) drops that
// worker's series: MustNewConstMetric panicked, and with it the control plane.
func TestCollectorSkipsLabelsNotUTF8(t *testing.T) {
	reg := registry.New("test", 0)
	c := evidence.NewCollector(reg)
	pr := prometheus.NewRegistry()
	pr.MustRegister(c)
	load := func() *smgv1.EngineLoad { return &smgv1.EngineLoad{Ranks: []*smgv1.RankLoad{{WaitingRequests: 5}}} }
	if _, err := reg.Update(func(tx *registry.Txn) error {
		tx.Insert(&registry.Worker{Registered: registry.Registered{ID: "a", Spec: &smgv1.WorkerSpec{Url: "http://a"}, Model: "m"}, State: registry.State{Health: registry.HealthHealthy, Load: load()}})
		tx.Insert(&registry.Worker{Registered: registry.Registered{ID: "b", Spec: &smgv1.WorkerSpec{Url: "http://\xff"}, Model: "m"}, State: registry.State{Health: registry.HealthHealthy, Load: load()}})
		tx.Insert(&registry.Worker{Registered: registry.Registered{ID: "c", Spec: &smgv1.WorkerSpec{Url: "http://c"}, Model: "\xfe"}, State: registry.State{Health: registry.HealthHealthy, Load: load()}})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	c.Removed(reg.Snapshot().Get("b"))
	want := `# HELP smg_engine_waiting_requests Requests waiting in the engine's scheduler queue, as last reported (-1: worker removed).
# TYPE smg_engine_waiting_requests gauge
smg_engine_waiting_requests{dp_rank="0",model="m",worker="http://a"} 5
# HELP smg_workers_overloaded Workers currently excluded from routing by overload protection.
# TYPE smg_workers_overloaded gauge
smg_workers_overloaded{model="m"} 0
`
	if err := testutil.GatherAndCompare(pr, strings.NewReader(want), "smg_engine_waiting_requests", "smg_workers_overloaded"); err != nil {
		t.Fatal(err)
	}
}

// An unchanged worker's series reuse the label pairs of the last scrape;
// a changed model builds new ones.
func TestCollectorKeepsLabelPairs(t *testing.T) {
	reg := registry.New("test", 0)
	pr := prometheus.NewRegistry()
	pr.MustRegister(evidence.NewCollector(reg))
	put := func(model string, waiting int32) {
		t.Helper()
		if _, err := reg.Update(func(tx *registry.Txn) error {
			tx.Insert(&registry.Worker{Registered: registry.Registered{ID: "a", Spec: &smgv1.WorkerSpec{Url: "http://a"}, Model: model}, State: registry.State{Health: registry.HealthHealthy, Load: &smgv1.EngineLoad{Ranks: []*smgv1.RankLoad{{WaitingRequests: waiting}}}}})
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	series := func() *dto.Metric {
		t.Helper()
		mfs, err := pr.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "smg_engine_waiting_requests" && len(mf.Metric) == 1 {
				return mf.Metric[0]
			}
		}
		t.Fatal("no smg_engine_waiting_requests series")
		return nil
	}
	put("m", 1)
	first := series()
	put("m", 2) // a new report, same labels
	second := series()
	if second.GetGauge().GetValue() != 2 {
		t.Fatalf("value %v, want 2", second.GetGauge().GetValue())
	}
	for i := range first.Label {
		if first.Label[i] != second.Label[i] {
			t.Fatalf("label %s built anew for an unchanged worker", first.Label[i].GetName())
		}
	}
	if first.GetGauge().GetValue() != 1 {
		t.Fatalf("the first scrape's value changed to %v under its reader", first.GetGauge().GetValue())
	}
	put("m2", 3)
	third := series()
	if third.Label[1].GetValue() != "m2" || third.Label[1] == second.Label[1] {
		t.Fatalf("model label %q (reused %v) after the model changed", third.Label[1].GetValue(), third.Label[1] == second.Label[1])
	}
}

// Scrapes run concurrently with each other and with reports, label
// changes and removals; each sees one consistent registry (every family
// of smg_engine_* has the same series).
func TestCollectorConcurrentScrapes(t *testing.T) {
	f := newFleet(t, 99, 3)
	f.step(40)
	// Every smg_engine_* family of one scrape has the same series.
	sameLength := func(mfs []*dto.MetricFamily) error {
		lengths := map[int]bool{}
		for _, mf := range mfs {
			if strings.HasPrefix(mf.GetName(), "smg_engine_") {
				lengths[len(mf.Metric)] = true
			}
		}
		if len(lengths) > 1 {
			return fmt.Errorf("smg_engine_* families of one scrape differ in length: %v", lengths)
		}
		return nil
	}
	err := smgtest.GatherWhile(f.got, 4, sameLength, func() {
		for range 200 {
			f.step(5)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := exposition(t, f.got), exposition(t, f.want); got != want {
		t.Fatalf("after concurrent scrapes the exposition differs\n--- got\n%s\n--- want\n%s", got, want)
	}
}
