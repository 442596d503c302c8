package e2e

import (
	"fmt"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestHABenchmark measures what replication costs and what a failover takes
// (make bench-ha; docs/benchmarks.md): admin write throughput and latency
// through Raft on 3 local replicas against 1 in-memory control plane, in the
// same run, then the time to a serving leader over 10 leader kills. It is a
// benchmark, not a test: it runs only with SMG_HA_BENCH=1 and writes its
// table to SMG_HA_BENCH_OUT when set.
func TestHABenchmark(t *testing.T) {
	if os.Getenv("SMG_HA_BENCH") == "" {
		t.Skip("a benchmark: set SMG_HA_BENCH=1 (make bench-ha)")
	}
	const writes, concurrency = 600, 8
	eng := fakeEngines(t)
	var out strings.Builder
	fmt.Fprintf(&out, "| control plane | admin writes | concurrency | writes/s | p50 | p99 | ratio (writes/s) |\n|---|---|---|---|---|---|---|\n")

	mem := newControlPlane(t, nil)
	base := writeLoad(t, mem.admin, eng.URL+"/mem", writes, concurrency)
	row := func(name string, r loadResult) {
		fmt.Fprintf(&out, "| %s | %d | %d | %.0f | %s | %s | %.2f |\n", name, r.n, concurrency, r.rate(),
			r.pct(0.50).Round(10*time.Microsecond), r.pct(0.99).Round(10*time.Microsecond), r.rate()/base.rate())
	}
	row("1 node, in memory (baseline)", base)

	one := startHACluster(t, 1)
	one.leader(15 * time.Second)
	row("1 node, --data-dir (Raft, fsync)", writeLoad(t, one.nodes[0].admin, eng.URL+"/one", writes, concurrency))

	c := startHACluster(t, 3)
	l := c.leader(15 * time.Second)
	row("3 nodes, to the leader", writeLoad(t, l.admin, eng.URL+"/lead", writes, concurrency))
	var f *haNode
	for _, nd := range c.nodes {
		if nd != l {
			f = nd
		}
	}
	row("3 nodes, to a follower (forwarded)", writeLoad(t, f.admin, eng.URL+"/fwd", writes, concurrency))

	// Failover: kill -9 the leader, time until another replica serves as
	// leader (every live replica agreeing), restart the killed one.
	var times []time.Duration
	for range 10 {
		l := c.leader(15 * time.Second)
		killed := time.Now()
		l.proc.kill()
		c.leader(15*time.Second, l)
		times = append(times, time.Since(killed))
		c.start(l)
		c.leader(15 * time.Second) // all three back before the next kill
	}
	sort.Slice(times, func(a, b int) bool { return times[a] < times[b] })
	var sum time.Duration
	var list []string
	for _, d := range times {
		sum += d
		list = append(list, d.Round(10*time.Millisecond).String())
	}
	fmt.Fprintf(&out, "\nFailover over %d kills (kill -9 of the leader until a new leader serves; heartbeat timeout %s, election timeout %s, leader lease %s): "+
		"min %s, median %s, mean %s, max %s.\nAll: %s.\n", len(times), "500ms", "500ms", "250ms",
		times[0].Round(10*time.Millisecond), times[len(times)/2].Round(10*time.Millisecond),
		(sum / time.Duration(len(times))).Round(10*time.Millisecond), times[len(times)-1].Round(10*time.Millisecond), strings.Join(list, ", "))
	t.Log("\n" + out.String())
	if p := os.Getenv("SMG_HA_BENCH_OUT"); p != "" {
		if err := os.WriteFile(p, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

type loadResult struct {
	n       int
	elapsed time.Duration
	lat     []time.Duration
}

func (r loadResult) rate() float64 { return float64(r.n) / r.elapsed.Seconds() }

func (r loadResult) pct(p float64) time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	return r.lat[min(len(r.lat)-1, int(p*float64(len(r.lat))))]
}

// writeLoad registers n workers (distinct URLs under prefix) through a, from
// concurrency clients; every answer must be 202.
func writeLoad(t *testing.T, a admin, prefix string, n, concurrency int) loadResult {
	t.Helper()
	var (
		mu   sync.Mutex
		lat  []time.Duration
		next int
		wg   sync.WaitGroup
	)
	start := time.Now()
	for range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= n {
					return
				}
				t0 := time.Now()
				code, b, err := a.do(http.MethodPost, "/workers", []byte(`{"url":"`+prefix+strconv.Itoa(i)+`"}`))
				d := time.Since(t0)
				if err != nil || code != http.StatusAccepted {
					t.Errorf("write %d: %d %s %v", i, code, b, err)
					return
				}
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	r := loadResult{n: len(lat), elapsed: time.Since(start), lat: lat}
	sort.Slice(r.lat, func(x, y int) bool { return r.lat[x] < r.lat[y] })
	return r
}
