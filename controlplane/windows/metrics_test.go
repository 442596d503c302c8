package windows

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	smgtest "github.com/smg-project/smg/internal/testutil"
)

// refCollector is the collector as it was before its label pairs were kept
// across scrapes (NewConstMetric per series): the reference.
type refCollector struct{ c *Collector }

func (r refCollector) Describe(ch chan<- *prometheus.Desc) { r.c.Describe(ch) }

func (r refCollector) Collect(ch chan<- prometheus.Metric) {
	for _, w := range r.c.reg.Snapshot().Workers() {
		url := w.Spec.GetUrl()
		if w.Admission != nil {
			ch <- prometheus.MustNewConstMetric(r.c.desc[dimRooms].total, prometheus.GaugeValue, float64(w.Admission.Window), url, w.Admission.Source)
			for rt, n := range w.WindowShare {
				ch <- prometheus.MustNewConstMetric(r.c.desc[dimRooms].share, prometheus.GaugeValue, float64(n), url, rt)
			}
		}
		if w.Budget != nil {
			ch <- prometheus.MustNewConstMetric(r.c.desc[dimTokens].total, prometheus.GaugeValue, float64(w.Budget.Tokens), url, w.Budget.Source)
			for rt, n := range w.TokenShare {
				ch <- prometheus.MustNewConstMetric(r.c.desc[dimTokens].share, prometheus.GaugeValue, float64(n), url, rt)
			}
		}
	}
}

// windowFleet is a registry changed at random under the collector and the
// reference.
type windowFleet struct {
	t         *testing.T
	rng       *rand.Rand
	reg       *registry.Registry
	got, want *prometheus.Registry
}

func newWindowFleet(t *testing.T, seed uint64) *windowFleet {
	reg := registry.New("test", 0)
	f := &windowFleet{t: t, rng: rand.New(rand.NewPCG(seed, 2)), reg: reg, got: prometheus.NewRegistry(), want: prometheus.NewRegistry()}
	f.got.MustRegister(NewCollector(reg))
	f.want.MustRegister(refCollector{NewCollector(reg)})
	return f
}

// admission is nil (not gated) or a random window and source; shares a
// random subset of five routers (nil, empty or some).
func (f *windowFleet) admission() (*registry.Admission, map[string]int64) {
	if f.rng.IntN(5) == 0 {
		return nil, nil
	}
	adm := &registry.Admission{Window: f.rng.Int64N(64), Source: []string{"spec", "engine", "learned", ""}[f.rng.IntN(4)]}
	if f.rng.IntN(6) == 0 {
		return adm, nil
	}
	shares := map[string]int64{}
	for _, r := range f.rng.Perm(5)[:f.rng.IntN(5)] {
		shares[fmt.Sprintf("router-%d", r)] = f.rng.Int64N(16)
	}
	return adm, shares
}

// budget is nil (off) or a random budget and source; shares as admission's.
func (f *windowFleet) budget() (*registry.Budget, map[string]int64) {
	adm, shares := f.admission()
	if adm == nil {
		return nil, nil
	}
	b := &registry.Budget{Tokens: adm.Window * 1000, Source: []string{"engine", "learned", ""}[f.rng.IntN(3)]}
	for r := range shares {
		shares[r] *= 1000
	}
	return b, shares
}

// step makes n random changes: workers appear, go, change URL, window,
// source or routers.
func (f *windowFleet) step(n int) {
	_, err := f.reg.Update(func(tx *registry.Txn) error {
		for range n {
			id := fmt.Sprintf("w%d", f.rng.IntN(12))
			old := tx.Get(id)
			switch {
			case old != nil && f.rng.IntN(6) == 0:
				tx.Delete(id)
			case old == nil || f.rng.IntN(6) == 0:
				url := fmt.Sprintf("http://%s-%d", id, f.rng.IntN(3)) // one worker's URL at a time
				if old != nil {
					tx.Delete(id)
				}
				w := &registry.Worker{Registered: registry.Registered{ID: id, Spec: &smgv1.WorkerSpec{Url: url}, Model: "m", Type: "decode"}, State: registry.State{Health: registry.HealthHealthy}}
				w.Admission, w.WindowShare = f.admission()
				w.Budget, w.TokenShare = f.budget()
				tx.Insert(w)
			default:
				w := old.Clone()
				if f.rng.IntN(2) == 0 {
					w.Admission, w.WindowShare = f.admission()
				} else {
					w.Budget, w.TokenShare = f.budget()
				}
				tx.Insert(w)
			}
		}
		return nil
	})
	if err != nil {
		f.t.Fatal(err)
	}
}

func (f *windowFleet) compare(what string) {
	f.t.Helper()
	got, err := smgtest.Exposition(f.got)
	if err != nil {
		f.t.Fatal(err)
	}
	want, err := smgtest.Exposition(f.want)
	if err != nil {
		f.t.Fatal(err)
	}
	if got != want {
		f.t.Fatalf("%s: exposition differs\n--- got\n%s\n--- want (NewConstMetric)\n%s", what, got, want)
	}
}

// The collector exposes what NewConstMetric did, byte for byte, scrape
// after scrape while workers and their routers come, change and go.
func TestCollectorExposesAsNewConstMetricDid(t *testing.T) {
	for seed := range uint64(20) {
		f := newWindowFleet(t, seed)
		for round := range 30 {
			f.step(1 + f.rng.IntN(6))
			f.compare(fmt.Sprintf("seed %d round %d", seed, round))
		}
	}
}

// A router's share vanishes with the router; a worker's series with the
// worker or its window.
func TestCollectorSeriesFollowWorkersAndRouters(t *testing.T) {
	reg := registry.New("test", 0)
	pr := prometheus.NewRegistry()
	pr.MustRegister(NewCollector(reg))
	put := func(id, url string, adm *registry.Admission, shares map[string]int64) {
		t.Helper()
		if _, err := reg.Update(func(tx *registry.Txn) error {
			tx.Insert(&registry.Worker{Registered: registry.Registered{ID: id, Spec: &smgv1.WorkerSpec{Url: url}, Model: "m"}, State: registry.State{Health: registry.HealthHealthy}, Shares: registry.Shares{Admission: adm, WindowShare: shares}})
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(window, share []string) {
		t.Helper()
		want := ""
		if len(window) > 0 {
			want += "# HELP smg_worker_admission_window Running window of the worker under --worker-admission-window (0: none known), by source (spec, engine, learned).\n# TYPE smg_worker_admission_window gauge\n"
			for _, s := range window {
				want += "smg_worker_admission_window" + s + "\n"
			}
		}
		if len(share) > 0 {
			want += "# HELP smg_worker_admission_share Rooms of the worker's window (plus queue allowance) granted to each router.\n# TYPE smg_worker_admission_share gauge\n"
			for _, s := range share {
				want += "smg_worker_admission_share" + s + "\n"
			}
		}
		if err := testutil.GatherAndCompare(pr, strings.NewReader(want), "smg_worker_admission_window", "smg_worker_admission_share"); err != nil {
			t.Fatal(err)
		}
	}
	put("a", "http://a", &registry.Admission{Window: 8, Source: "spec"}, map[string]int64{"r1": 5, "r2": 3})
	expect([]string{`{source="spec",worker="http://a"} 8`}, []string{`{router="r1",worker="http://a"} 5`, `{router="r2",worker="http://a"} 3`})
	put("a", "http://a", &registry.Admission{Window: 9, Source: "engine"}, map[string]int64{"r2": 9})
	expect([]string{`{source="engine",worker="http://a"} 9`}, []string{`{router="r2",worker="http://a"} 9`})
	put("b", "http://b", &registry.Admission{Window: 4, Source: "learned"}, map[string]int64{"r1": 4})
	put("a", "http://a", nil, nil) // no longer gated
	expect([]string{`{source="learned",worker="http://b"} 4`}, []string{`{router="r1",worker="http://b"} 4`})
	if _, err := reg.Update(func(tx *registry.Txn) error { tx.Delete("b"); return nil }); err != nil {
		t.Fatal(err)
	}
	expect(nil, nil)
}

// A URL or router id that is not UTF-8 drops its series: NewConstMetric
// panicked on it, and with it the control plane.
func TestCollectorSkipsLabelsNotUTF8(t *testing.T) {
	reg := registry.New("test", 0)
	pr := prometheus.NewRegistry()
	pr.MustRegister(NewCollector(reg))
	if _, err := reg.Update(func(tx *registry.Txn) error {
		tx.Insert(&registry.Worker{Registered: registry.Registered{ID: "a", Spec: &smgv1.WorkerSpec{Url: "http://a"}}, State: registry.State{Health: registry.HealthHealthy}, Shares: registry.Shares{Admission: &registry.Admission{Window: 8, Source: "spec"}, WindowShare: map[string]int64{"r\xff": 1, "r1": 2}}})
		tx.Insert(&registry.Worker{Registered: registry.Registered{ID: "b", Spec: &smgv1.WorkerSpec{Url: "http://\xff"}}, State: registry.State{Health: registry.HealthHealthy}, Shares: registry.Shares{Admission: &registry.Admission{Window: 8, Source: "spec"}, WindowShare: map[string]int64{"r1": 2}}})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int{"smg_worker_admission_window": 1, "smg_worker_admission_share": 1} {
		if n, err := testutil.GatherAndCount(pr, name); err != nil || n != want {
			t.Fatalf("%s: %d series (err %v), want %d", name, n, err, want)
		}
	}
}

// Scrapes run concurrently with each other and with changes.
func TestCollectorConcurrentScrapes(t *testing.T) {
	f := newWindowFleet(t, 99)
	f.step(20)
	err := smgtest.GatherWhile(f.got, 4, nil, func() {
		for range 200 {
			f.step(3)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	f.compare("after concurrent scrapes")
}

// BenchmarkGather is one Gather of the admission window families over n
// gated workers, each shared by four routers.
func BenchmarkGather(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) {
			reg := registry.New("bench", 0)
			if _, err := reg.Update(func(tx *registry.Txn) error {
				for i := range n {
					tx.Insert(&registry.Worker{Registered: registry.Registered{ID: fmt.Sprintf("w-%06d", i), Type: "decode", Spec: &smgv1.WorkerSpec{Url: fmt.Sprintf("http://10.%d.%d.%d:8000", i/65536, i/256%256, i%256)}}, State: registry.State{Health: registry.HealthHealthy}, Shares: registry.Shares{Admission: &registry.Admission{Window: 64, Source: "engine"}, WindowShare: map[string]int64{"router-a": 16, "router-b": 16, "router-c": 16, "router-d": 16}}})
				}
				return nil
			}); err != nil {
				b.Fatal(err)
			}
			pr := prometheus.NewRegistry()
			pr.MustRegister(NewCollector(reg))
			b.ReportAllocs()
			for b.Loop() {
				if mfs, err := pr.Gather(); err != nil || len(mfs) != 2 {
					b.Fatalf("%d families, err %v", len(mfs), err)
				}
			}
		})
	}
}

// A worker's token budget and its routers' shares are series of their own,
// beside its running window or without one.
func TestCollectorShowsTokenBudgets(t *testing.T) {
	reg := registry.New("test", 0)
	pr := prometheus.NewRegistry()
	pr.MustRegister(NewCollector(reg))
	if _, err := reg.Update(func(tx *registry.Txn) error {
		tx.Insert(&registry.Worker{Registered: registry.Registered{ID: "a", Spec: &smgv1.WorkerSpec{Url: "http://a"}}, State: registry.State{Health: registry.HealthHealthy},
			Shares: registry.Shares{Admission: &registry.Admission{Window: 8, Source: "spec"}, WindowShare: map[string]int64{"r1": 8},
				Budget: &registry.Budget{Tokens: 20000, Source: "engine"}, TokenShare: map[string]int64{"r1": 12000, "r2": 8000}}})
		tx.Insert(&registry.Worker{Registered: registry.Registered{ID: "b", Spec: &smgv1.WorkerSpec{Url: "http://b"}}, State: registry.State{Health: registry.HealthHealthy},
			Shares: registry.Shares{Budget: &registry.Budget{}}})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := `# HELP smg_worker_token_budget Token budget of the worker under --worker-token-budget (its KV capacity in tokens; 0: none known), by source (engine, learned).
# TYPE smg_worker_token_budget gauge
smg_worker_token_budget{source="",worker="http://b"} 0
smg_worker_token_budget{source="engine",worker="http://a"} 20000
# HELP smg_worker_token_budget_share Tokens of the worker's token budget granted to each router.
# TYPE smg_worker_token_budget_share gauge
smg_worker_token_budget_share{router="r1",worker="http://a"} 12000
smg_worker_token_budget_share{router="r2",worker="http://a"} 8000
`
	if err := testutil.GatherAndCompare(pr, strings.NewReader(want), "smg_worker_token_budget", "smg_worker_token_budget_share"); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(pr, "smg_worker_admission_window"); err != nil || n != 1 {
		t.Fatalf("admission windows: %d series, %v", n, err)
	}
}
