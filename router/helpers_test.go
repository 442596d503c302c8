package router

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

const testModel = "meta-llama/Llama-3.1-8B-Instruct"

// engine is a loopback HTTP worker that names itself in every answer.
type engine struct {
	name string
	srv  *httptest.Server
	hits atomic.Int64
}

func newEngine(t testing.TB, name string, h http.HandlerFunc) *engine {
	t.Helper()
	e := &engine{name: name}
	if h == nil {
		h = func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"worker":%q}`, name)
		}
	}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.hits.Add(1)
		w.Header().Set("X-Worker", name)
		h(w, r)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *engine) worker(opts ...func(*Worker)) Worker {
	w := Worker{ID: e.name, URL: e.srv.URL, Model: testModel, Type: TypeRegular, Healthy: true}
	for _, o := range opts {
		o(&w)
	}
	return w
}

func vetoed(v Veto) func(*Worker)   { return func(w *Worker) { w.Veto = v } }
func waiting(n int64) func(*Worker) { return func(w *Worker) { w.Waiting = n } }
func unhealthy(w *Worker)           { w.Healthy = false }

// harness is a router served on loopback with its own registry.
type harness struct {
	t   testing.TB
	r   *Router
	reg *prometheus.Registry
	srv *httptest.Server
	rev uint64
}

func newHarness(t testing.TB, mutate func(*Options)) *harness {
	t.Helper()
	opts := DefaultOptions()
	opts.RetryInitialBackoffMs = 1
	opts.RetryMaxBackoffMs = 2
	if mutate != nil {
		mutate(&opts)
	}
	reg := prometheus.NewRegistry()
	r, err := New(opts, slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(r.Handler())
	t.Cleanup(srv.Close)
	return &harness{t: t, r: r, reg: reg, srv: srv}
}

func (h *harness) apply(workers ...Worker) {
	h.rev++
	h.r.Apply(&Snapshot{Epoch: "e1", Revision: h.rev, Workers: workers})
}

type answer struct {
	status int
	header http.Header
	body   string
}

// post sends a chat completion for model with an optional routing key.
func (h *harness) post(model, key, prompt string) answer {
	h.t.Helper()
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}]}`, model, prompt)
	return h.send("/v1/chat/completions", body, key)
}

func (h *harness) send(path, body, key string) answer {
	h.t.Helper()
	req, err := http.NewRequest(http.MethodPost, h.srv.URL+path, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("x-smg-routing-key", key)
	}
	return do(h.t, req)
}

func (h *harness) get(path string) answer {
	h.t.Helper()
	req, err := http.NewRequest(http.MethodGet, h.srv.URL+path, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	return do(h.t, req)
}

func do(t testing.TB, req *http.Request) answer {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// servedBy returns the worker that answered, or "" for a router answer.
func (a answer) servedBy() string { return a.header.Get("X-Worker") }

func (a answer) errorCode() string {
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	_ = json.Unmarshal([]byte(a.body), &e)
	return e.Error.Code
}

func (h *harness) counter(name, stage string) float64 {
	h.t.Helper()
	var c prometheus.Collector
	switch name {
	case "smg_worker_overload_fallback_total":
		c = h.r.metrics.overloadFallback.WithLabelValues(stage)
	case "smg_worker_liveness_fallback_total":
		c = h.r.metrics.livenessFallback.WithLabelValues(stage)
	case "smg_worker_overload_shed_total":
		c = h.r.metrics.shed.WithLabelValues(stage)
	default:
		h.t.Fatalf("unknown counter %s", name)
	}
	return testutil.ToFloat64(c)
}

// index is the position of the worker with id in v, or -1.
func (v *view) index(id string) int32 {
	for i := range v.size() {
		if v.worker(i).ID == id {
			return i
		}
	}
	return -1
}
