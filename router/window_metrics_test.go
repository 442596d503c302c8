package router

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	smgtest "github.com/smg-project/smg/internal/testutil"
)

// refWindowCollector is the gated workers' series as NewConstMetric made
// them before the pairs were kept: the reference.
type refWindowCollector struct{ m *windowMetrics }

func (c refWindowCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.m.rooms; ch <- c.m.inFlight }

func (c refWindowCollector) Collect(ch chan<- prometheus.Metric) {
	v := c.m.r.view.Load()
	if v == nil {
		return
	}
	for i := range v.size() {
		w := v.worker(i)
		if rooms, _ := c.m.r.windowRooms(w); rooms <= 0 {
			continue
		}
		g := &v.states[i].gate
		ch <- prometheus.MustNewConstMetric(c.m.rooms, prometheus.GaugeValue, float64(g.Limit()), w.URL)
		ch <- prometheus.MustNewConstMetric(c.m.inFlight, prometheus.GaugeValue, float64(g.InFlight()), w.URL)
	}
}

var gatedFamilies = []string{"smg_worker_admission_limit", "smg_worker_admission_in_flight"}

// randomGated applies a random fleet: regular, decode and prefill workers,
// some with rooms, some moved to another URL.
func randomGated(h *harness, rng *rand.Rand) {
	var ws []Worker
	for i := range rng.IntN(12) {
		w := Worker{ID: fmt.Sprintf("w%d", i), URL: fmt.Sprintf("http://w%d-%d", i, rng.IntN(2)), Model: testModel,
			Type: []string{TypeRegular, TypeRegular, TypeDecode, TypePrefill}[rng.IntN(4)], Healthy: true,
			AdmissionRooms: rng.Int64N(4), MaxRunning: rng.Int64N(4)}
		ws = append(ws, w)
	}
	h.apply(ws...)
}

func compareGated(t *testing.T, h *harness, ref *prometheus.Registry, what string) {
	t.Helper()
	got, err := smgtest.Exposition(h.reg, gatedFamilies...)
	if err != nil {
		t.Fatal(err)
	}
	want, err := smgtest.Exposition(ref, gatedFamilies...)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("%s: exposition differs\n--- got\n%s\n--- want (NewConstMetric)\n%s", what, got, want)
	}
}

// The gated workers' series are what NewConstMetric made, byte for byte,
// scrape after scrape while workers come, go, move and change rooms.
func TestWindowMetricsExposeAsNewConstMetricDid(t *testing.T) {
	h := newHarness(t, windowsOn(Policies[0]))
	ref := prometheus.NewRegistry()
	ref.MustRegister(refWindowCollector{h.r.wm})
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		randomGated(h, rng)
		compareGated(t, h, ref, fmt.Sprintf("round %d", round))
	}
}

// Scrapes run concurrently with each other and with snapshots applied.
func TestWindowMetricsConcurrentScrapes(t *testing.T) {
	h := newHarness(t, windowsOn(Policies[0]))
	rng := rand.New(rand.NewPCG(3, 4))
	err := smgtest.GatherWhile(h.reg, 4, nil, func() {
		for range 200 {
			randomGated(h, rng)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}

// BenchmarkWindowMetricsGather is one Gather of the router's registry with
// n gated workers (two series each).
func BenchmarkWindowMetricsGather(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) {
			h := newHarness(b, windowsOn(Policies[0]))
			ws := make([]Worker, n)
			for i := range ws {
				ws[i] = Worker{ID: fmt.Sprintf("w-%06d", i), URL: fmt.Sprintf("http://10.%d.%d.%d:8000", i/65536, i/256%256, i%256),
					Model: testModel, Type: TypeRegular, Healthy: true, AdmissionRooms: 16}
			}
			h.apply(ws...)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := h.reg.Gather(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
