package router

import (
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// selectionFixture is a router holding a 1,000-worker snapshot in which every
// tenth worker is vetoed (a mix of overload and liveness).
func selectionFixture(tb testing.TB, policy string) (*Router, *view, *pool) {
	tb.Helper()
	opts := DefaultOptions()
	opts.Policy = policy
	r, err := New(opts, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		tb.Fatal(err)
	}
	workers := make([]Worker, 1000)
	for i := range workers {
		workers[i] = Worker{ID: fmt.Sprintf("w%04d", i), URL: fmt.Sprintf("http://10.0.%d.%d:8000", i/250, i%250),
			Model: testModel, Healthy: true, Waiting: int64(i % 7), Running: int64(i % 5), LoadRevision: 1}
		switch i % 10 {
		case 3:
			workers[i].Veto = VetoOverload
		case 7:
			workers[i].Veto = VetoUnreachable
		}
	}
	r.Apply(&Snapshot{Epoch: "bench", Revision: 1, Workers: workers})
	v := r.view.Load()
	return r, v, v.pools[testModel]
}

var benchPrompt = []byte(`[{"role":"system","content":"You are a helpful assistant that answers briefly."},` +
	`{"role":"user","content":"` + strings.Repeat("Tell me about load balancing. ", 20) + `"}]`)

// Selection reads the snapshot only: no allocation for any policy.
func TestSelectionDoesNotAllocate(t *testing.T) {
	for _, policy := range Policies {
		r, v, p := selectionFixture(t, policy)
		q := request{model: testModel, key: "user-42", prompt: benchPrompt}
		allocs := testing.AllocsPerRun(200, func() {
			q.now = r.now()
			if i, _ := r.sel.choose(v, p, &q, false); i < 0 {
				t.Fatal("no worker chosen")
			}
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocs per selection, want 0", policy, allocs)
		}
	}
}

// BenchmarkSelection: one selection among 1,000 workers, per policy.
func BenchmarkSelection(b *testing.B) {
	for _, policy := range Policies {
		b.Run(policy, func(b *testing.B) {
			r, v, p := selectionFixture(b, policy)
			q := request{model: testModel, key: "user-42", prompt: benchPrompt}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				q.now = int64(i)
				if policy == PolicyManual || policy == PolicyConsistentHashing {
					q.key = keys[i%len(keys)]
				}
				r.sel.choose(v, p, &q, false)
			}
		})
	}
}

var keys = func() []string {
	k := make([]string, 1024)
	for i := range k {
		k[i] = fmt.Sprintf("conversation-%d", i)
	}
	return k
}()

// BenchmarkSelectionAllVetoed: the steer path, which scans the whole pool.
func BenchmarkSelectionAllVetoed(b *testing.B) {
	r, _, _ := selectionFixture(b, PolicyCacheAware)
	v := r.view.Load()
	ws := v.workers.flat()
	for i := range ws {
		ws[i].Veto = VetoOverload
	}
	r.Apply(&Snapshot{Revision: 2, Workers: ws})
	v = r.view.Load()
	p := v.pools[testModel]
	q := request{model: testModel, prompt: benchPrompt}
	b.ReportAllocs()
	for b.Loop() {
		if _, out := r.sel.choose(v, p, &q, false); out != overloadFallback {
			b.Fatal(out)
		}
	}
}

// streamEngine answers every request with an SSE stream of `events` events.
func streamEngine(events, size int) http.HandlerFunc {
	payload := "data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("x", size) + "\"}}]}\n\n"
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		for range events {
			_, _ = io.WriteString(w, payload)
			f.Flush()
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}
}

// streamTargets starts an engine streaming `events` SSE events, this router
// in front of it, and a plain httputil.ReverseProxy in front of it.
// With windows, the router gates the engine on a running window (a share of
// 1024 rooms: every request takes and gives back a room, none waits).
func streamTargets(b *testing.B, events int, windows bool) (direct, router, plain string) {
	engineSrv := httptest.NewServer(streamEngine(events, 48))
	b.Cleanup(engineSrv.Close)
	opts := DefaultOptions()
	opts.WorkerAdmissionWindow = windows
	r, err := New(opts, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	w := Worker{ID: "e", URL: engineSrv.URL, Model: testModel, Healthy: true}
	if windows {
		w.AdmissionRooms, w.WindowShare = 1024, 1024
	}
	r.Apply(&Snapshot{Revision: 1, Workers: []Worker{w}})
	routerSrv := httptest.NewServer(r.Handler())
	b.Cleanup(routerSrv.Close)
	target, _ := url.Parse(engineSrv.URL)
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.FlushInterval = -1
	rp.ErrorLog = log.New(io.Discard, "", 0)
	plainSrv := httptest.NewServer(rp)
	b.Cleanup(plainSrv.Close)
	return engineSrv.URL, routerSrv.URL, plainSrv.URL
}

const streamBody = `{"model":"` + testModel + `","stream":true,"messages":[{"role":"user","content":"hello there"}]}`

func streamOnce(b *testing.B, client *http.Client, base string) int64 {
	resp, err := client.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(streamBody))
	if err != nil {
		b.Fatal(err)
	}
	n, _ := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("status %d", resp.StatusCode)
	}
	return n
}

// BenchmarkStreamingInterleaved times one streaming request to each target in
// turn, so machine noise hits all three alike, and reports throughput ratios
// (router/plain >= 1.0 is the bar), with running windows off and on.
func BenchmarkStreamingInterleaved(b *testing.B) {
	for _, windows := range []bool{false, true} {
		b.Run(fmt.Sprintf("windows=%v", windows), func(b *testing.B) { streamingInterleaved(b, windows) })
	}
}

func streamingInterleaved(b *testing.B, windows bool) {
	const events = 64
	direct, router, plain := streamTargets(b, events, windows)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8, DisableCompression: true}}
	var spent [3]time.Duration
	for b.Loop() {
		for k, base := range [3]string{direct, router, plain} {
			t0 := time.Now()
			streamOnce(b, client, base)
			spent[k] += time.Since(t0)
		}
	}
	b.ReportMetric(float64(spent[2])/float64(spent[1]), "router/plain")
	b.ReportMetric(float64(spent[0])/float64(spent[1]), "router/direct")
	b.ReportMetric(float64(b.N*events)/spent[1].Seconds(), "router_events/s")
	b.ReportMetric(float64(b.N*events)/spent[2].Seconds(), "plain_events/s")
	b.ReportMetric(float64(b.N*events)/spent[0].Seconds(), "direct_events/s")
}

// BenchmarkStreaming compares one streaming chat completion (64 events)
// straight to the engine, through this router, and through a plain
// httputil.ReverseProxy, all on loopback in the same run.
func BenchmarkStreaming(b *testing.B) {
	const events = 64
	direct, router, plain := streamTargets(b, events, false)
	body := streamBody
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}}
	for _, c := range []struct{ name, url string }{
		{"direct", direct}, {"router", router}, {"reverseproxy", plain},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			var n atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					resp, err := client.Post(c.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
					if err != nil {
						b.Error(err)
						return
					}
					m, _ := io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						b.Errorf("status %d", resp.StatusCode)
						return
					}
					n.Store(m)
				}
			})
			b.SetBytes(n.Load())
			b.ReportMetric(float64(b.N*events)/b.Elapsed().Seconds(), "events/s")
		})
	}
}
