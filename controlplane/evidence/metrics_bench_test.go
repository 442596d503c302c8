package evidence_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/smg-project/smg/controlplane/evidence"
	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// scrapeFleet is a Prometheus registry holding the collector over n workers
// with one rank each (as the scale harness's agents report), a tenth of
// them overloaded, spread over four models.
func scrapeFleet(b *testing.B, n int) *prometheus.Registry {
	reg := registry.New("bench", 0)
	_, err := reg.Update(func(tx *registry.Txn) error {
		for i := range n {
			tx.Insert(&registry.Worker{Registered: registry.Registered{ID: fmt.Sprintf("w-%06d", i), Spec: &smgv1.WorkerSpec{Url: fmt.Sprintf("http://10.%d.%d.%d:8000", i/65536, i/256%256, i%256)}, Model: fmt.Sprintf("model-%d", i%4), Type: "regular", Thresholds: judge.Thresholds{WaitingRequests: 8, TokenUsage: 0.8}}, State: registry.State{Health: registry.HealthHealthy, Load: &smgv1.EngineLoad{Source: "bench", WaitingRequests: int32(9 - 8*min(1, i%10)), Ranks: []*smgv1.RankLoad{{WaitingRequests: int32(i % 7),
				RunningRequests: 32, TokenUsage: float64(i%10) / 10, GenThroughput: 1500, CacheHitRate: 0.4}}}}})
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	pr := prometheus.NewRegistry()
	pr.MustRegister(evidence.NewCollector(reg))
	return pr
}

// BenchmarkGather is one Gather of the smg_engine_* and
// smg_workers_overloaded families: what a scrape of the control plane costs
// before it is encoded.
func BenchmarkGather(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) {
			pr := scrapeFleet(b, n)
			b.ReportAllocs()
			for b.Loop() {
				mfs, err := pr.Gather()
				if err != nil || len(mfs) != 6 {
					b.Fatalf("%d families, err %v", len(mfs), err)
				}
			}
		})
	}
}

// BenchmarkScrape is a whole /metrics scrape of the same families through
// promhttp (Gather plus the text encoding).
func BenchmarkScrape(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) {
			h := promhttp.HandlerFor(scrapeFleet(b, n), promhttp.HandlerOpts{DisableCompression: true})
			b.ReportAllocs()
			req := httptest.NewRequest("GET", "/metrics", nil)
			for b.Loop() {
				w := &discardWriter{header: http.Header{}}
				h.ServeHTTP(w, req)
				if w.code != 0 && w.code != http.StatusOK || w.n == 0 {
					b.Fatalf("status %d, %d bytes", w.code, w.n)
				}
			}
		})
	}
}

// discardWriter is a connection's ResponseWriter that keeps nothing (a
// recorder's growing buffer would be most of what the scrape allocates).
type discardWriter struct {
	header http.Header
	code   int
	n      int
}

func (w *discardWriter) Header() http.Header  { return w.header }
func (w *discardWriter) WriteHeader(code int) { w.code = code }
func (w *discardWriter) Write(p []byte) (int, error) {
	w.n += len(p)
	return len(p), nil
}
