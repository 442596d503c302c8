package controlplane_test

import (
	"bytes"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/smg-project/smg/controlplane"
	"github.com/smg-project/smg/controlplane/registry"
	"github.com/smg-project/smg/internal/cli"
	"github.com/smg-project/smg/sim"
)

// frozenEngine is an engine whose scheduler is stopped, holding n requests
// in its waiting queue.
func frozenEngine(t *testing.T, n int) *sim.Server {
	t.Helper()
	engine := startSim(t, func(o *sim.Options) { o.Fault.Freeze = true })
	queue(t, engine, n)
	return engine
}

// waitEngineWaiting waits until the engine itself shows n waiting requests
// (the queued requests reach it asynchronously).
func waitEngineWaiting(t *testing.T, engine *sim.Server, n int) {
	t.Helper()
	for range 200 {
		resp, err := http.Get(engine.URL() + "/metrics")
		if err == nil {
			var b bytes.Buffer
			_, _ = b.ReadFrom(resp.Body)
			resp.Body.Close()
			for _, line := range strings.Split(b.String(), "\n") {
				if strings.HasPrefix(line, "vllm:num_requests_waiting{") && strings.HasSuffix(line, fmt.Sprintf(" %d", n)) {
					return
				}
			}
		}
		<-timeAfter(25)
	}
	t.Fatalf("engine never showed %d waiting requests", n)
}

func TestOverloadVerdictFromEngineReports(t *testing.T) {
	h := startCP(t, fastOptions())
	engine := frozenEngine(t, 5)
	waitEngineWaiting(t, engine, 5)
	id := h.register(t, fmt.Sprintf(`{"url":%q,"overload":{"waiting_requests":4}}`, engine.URL()))

	h.waitFor(t, "overloaded at 5 waiting >= 4", overloaded(id, true))
	w := h.reg.Snapshot().Get(id)
	if w.Load.GetWaitingRequests() != 5 || !strings.Contains(w.OverloadReason, "waiting_requests 5 >= 4") {
		t.Fatalf("load %v reason %q", w.Load, w.OverloadReason)
	}
	labels := map[string]string{"worker": engine.URL(), "model": "sim-model", "dp_rank": "0"}
	if v, ok := h.gauge(t, "smg_engine_waiting_requests", labels); !ok || v != 5 {
		t.Fatalf("smg_engine_waiting_requests = %v %v", v, ok)
	}
	for _, name := range []string{"smg_engine_token_usage", "smg_engine_running_requests", "smg_engine_gen_throughput", "smg_engine_cache_hit_rate"} {
		if _, ok := h.gauge(t, name, labels); !ok {
			t.Fatalf("%s missing", name)
		}
	}
	if v, ok := h.gauge(t, "smg_workers_overloaded", map[string]string{"model": "sim-model"}); !ok || v != 1 {
		t.Fatalf("smg_workers_overloaded = %v %v", v, ok)
	}
	r := h.do(t, http.MethodGet, "/workers/"+id, "")
	if c := string(compact(r.body)); !strings.Contains(c, `"overloaded":true`) || !strings.Contains(c, `"veto":"overload"`) {
		t.Fatalf("GET shows the verdict: %s", r.body)
	}
	if c := string(compact(h.do(t, http.MethodGet, "/loads", "").body)); !strings.Contains(c, `"overloaded":true`) {
		t.Fatalf("/loads shows the verdict: %s", c)
	}

	// The engine drains: the first report under every threshold clears the veto.
	if err := engine.SetFault(sim.Fault{}); err != nil {
		t.Fatal(err)
	}
	h.waitFor(t, "veto cleared once the queue drained", overloaded(id, false))
	if v, _ := h.gauge(t, "smg_workers_overloaded", map[string]string{"model": "sim-model"}); v != 0 {
		t.Fatalf("smg_workers_overloaded = %v after the veto cleared", v)
	}
}

func TestGatewayThresholdsAndSwitch(t *testing.T) {
	t.Run("gateway threshold", func(t *testing.T) {
		opts := fastOptions()
		opts.Thresholds.WaitingRequests = 3
		h := startCP(t, opts)
		engine := frozenEngine(t, 3)
		waitEngineWaiting(t, engine, 3)
		id := h.register(t, fmt.Sprintf(`{"url":%q}`, engine.URL()))
		h.waitFor(t, "overloaded by the gateway threshold", overloaded(id, true))
	})
	t.Run("disabled: gateway off, block still applies", func(t *testing.T) {
		opts := fastOptions()
		opts.Thresholds.Disabled = true
		h := startCP(t, opts)
		plain := frozenEngine(t, 12)
		blocked := frozenEngine(t, 12)
		waitEngineWaiting(t, plain, 12)
		waitEngineWaiting(t, blocked, 12)
		plainID := h.register(t, fmt.Sprintf(`{"url":%q}`, plain.URL()))
		blockedID := h.register(t, fmt.Sprintf(`{"url":%q,"overload":{"waiting_requests":10}}`, blocked.URL()))
		h.waitFor(t, "the block vetoes its worker", overloaded(blockedID, true))
		w := h.reg.Snapshot().Get(plainID)
		if w.Load.GetWaitingRequests() != 12 || w.Overloaded {
			t.Fatalf("worker without a block under --disable-worker-overload-protection: load %v overloaded %v", w.Load, w.Overloaded)
		}
		if w.Thresholds.WaitingRequests != 0 || w.Thresholds.TokenUsage != 0 {
			t.Fatalf("gateway thresholds are off: %+v", w.Thresholds)
		}
	})
}

func TestFailOpen(t *testing.T) {
	cases := map[string]sim.Fault{
		"metrics go silent (no report)": {Freeze: true, SilentMetrics: true},
		"malformed metrics (error)":     {Freeze: true, GarbageMetrics: true},
		"connection reset (error)":      {Freeze: true, Reset: true},
	}
	for name, fault := range cases {
		t.Run(name, func(t *testing.T) {
			opts := fastOptions()
			opts.Health.FailureThreshold = 100 // keep the worker Ready: the poll outcome alone clears the veto
			h := startCP(t, opts)
			engine := frozenEngine(t, 9)
			waitEngineWaiting(t, engine, 9)
			id := h.register(t, fmt.Sprintf(`{"url":%q}`, engine.URL()))
			h.waitFor(t, "overloaded", overloaded(id, true))
			if err := engine.SetFault(fault); err != nil {
				t.Fatal(err)
			}
			h.waitFor(t, "veto cleared by a poll without a report", overloaded(id, false))
			if w := h.reg.Snapshot().Get(id); !w.Ready() {
				t.Fatal("the worker should still be Ready: the veto cleared on the poll, not on health")
			}
		})
	}
}

// healthGate proxies to an engine and answers its /health as told.
type healthGate struct {
	srv     *httptest.Server
	healthy atomic.Bool
}

func newHealthGate(t *testing.T, engine *sim.Server) *healthGate {
	t.Helper()
	target, _ := url.Parse(engine.URL())
	proxy := httputil.NewSingleHostReverseProxy(target)
	g := &healthGate{}
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" && !g.healthy.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(g.srv.Close)
	return g
}

func TestStaticWorkersAndHealth(t *testing.T) {
	engine := startSim(t, func(o *sim.Options) { o.Model = "discovered/model-7b" })
	gate := newHealthGate(t, engine)
	opts := fastOptions()
	opts.WorkerURLs = cli.List{gate.srv.URL}
	h := startCP(t, opts)
	if err := h.cp.SubmitStatic(); err != nil {
		t.Fatal(err)
	}
	id := ""
	h.waitFor(t, "static worker registered", func(s *registry.Snapshot) bool {
		if w := s.GetByURL(gate.srv.URL); w != nil {
			id = w.ID
			return true
		}
		return false
	})
	w := h.reg.Snapshot().Get(id)
	if w.Model != "discovered/model-7b" {
		t.Fatalf("model = %q, want the one the engine lists at /v1/models", w.Model)
	}
	if w.Ready() || w.Load != nil {
		t.Fatal("a worker starts not Ready and is not polled before it is Ready")
	}
	if w.Thresholds.WaitingRequests != 8 || w.Thresholds.TokenUsage != 0.8 {
		t.Fatalf("a --worker-urls worker uses the gateway thresholds: %+v", w.Thresholds)
	}

	gate.healthy.Store(true)
	h.waitFor(t, "Ready and polled", func(s *registry.Snapshot) bool { w := s.Get(id); return w.Ready() && w.Load != nil })

	// Leaving Ready clears the overload veto. Set one directly: the point is
	// the health checker's transition, not how the veto came.
	if _, err := h.reg.Update(func(tx *registry.Txn) error {
		c := tx.Get(id).Clone()
		c.Overloaded, c.OverloadReason = true, "test"
		tx.Insert(c)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	gate.healthy.Store(false)
	h.waitFor(t, "out of Ready", func(s *registry.Snapshot) bool { return s.Get(id).Health == registry.HealthUnhealthy })
	if h.reg.Snapshot().Get(id).Overloaded {
		t.Fatal("leaving Ready must clear the veto")
	}
	for i := 0; !strings.Contains(h.logs.String(), "Worker left Ready"); i++ { // logged just after the commit
		if i == 200 {
			t.Fatal("the transition is logged")
		}
		<-timeAfter(10)
	}
	gate.healthy.Store(true)
	h.waitFor(t, "Ready again", ready(id))

	if err := h.cp.SubmitStatic(); err == nil || !strings.Contains(err.Error(), "--worker-urls") {
		t.Fatalf("a duplicate static URL is a startup error naming the flag, got %v", err)
	}
}

// TestReplaceAndPatchClearTheVeto uses an hour-long poll interval: after the
// first poll (a new Ready worker is polled at once) no report can re-set the
// veto, so what clears it is the change itself.
func TestReplaceAndPatchClearTheVeto(t *testing.T) {
	opts := fastOptions()
	opts.LoadMonitorInterval = 3600
	opts.Health.IntervalSecs = 3600
	h := startCP(t, opts)
	engine := frozenEngine(t, 9)
	waitEngineWaiting(t, engine, 9)
	id := h.register(t, fmt.Sprintf(`{"url":%q}`, engine.URL()))
	h.waitFor(t, "overloaded", overloaded(id, true))

	if r := h.do(t, http.MethodPatch, "/workers/"+id, `{"labels":{"a":"b"}}`); r.status != http.StatusAccepted {
		t.Fatalf("PATCH = %d %s", r.status, r.body)
	}
	if h.reg.Snapshot().Get(id).Overloaded {
		t.Fatal("PATCH replaces the worker and clears its veto")
	}

	// Veto again (as a report would), then PUT.
	if _, err := h.reg.Update(func(tx *registry.Txn) error {
		c := tx.Get(id).Clone()
		c.Evidence.NoReport = false // the last load (waiting 9) counts again
		tx.Insert(c)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !h.reg.Snapshot().Get(id).Overloaded {
		t.Fatal("the stored load (waiting 9 >= 8) does not veto once it counts again")
	}
	if r := h.do(t, http.MethodPut, "/workers/"+id, fmt.Sprintf(`{"url":%q,"priority":1}`, engine.URL())); r.status != http.StatusAccepted {
		t.Fatalf("PUT = %d %s", r.status, r.body)
	}
	h.waitFor(t, "replaced", func(s *registry.Snapshot) bool { return s.Get(id).Spec.GetPriority() == 1 })
	if h.reg.Snapshot().Get(id).Overloaded {
		t.Fatal("PUT re-registers the worker and clears its veto")
	}
}

func TestLoadMonitorIntervalOverride(t *testing.T) {
	opts := fastOptions()
	opts.LoadMonitorInterval = 3600
	h := startCP(t, opts)
	engine := startSim(t, nil)
	id := h.register(t, fmt.Sprintf(`{"url":%q,"load_monitor_interval_secs":1}`, engine.URL()))
	// With the gateway interval at an hour, a second report within seconds
	// proves the spec's override (1 s) drives this worker's group.
	first := h.reg.Snapshot().Get(id).LoadRevision
	h.waitFor(t, "a second poll", func(s *registry.Snapshot) bool { return s.Get(id).LoadRevision > first })
}

func TestOptionsValidation(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--load-monitor-interval", "0"}, "--load-monitor-interval must be greater than zero"},
		{[]string{"--load-monitor-interval", "-5"}, "--load-monitor-interval must be greater than zero"},
		{[]string{"--worker-overload-waiting-requests", "0"}, "--worker-overload-waiting-requests must be an integer >= 1"},
		{[]string{"--worker-overload-token-usage", "0"}, "--worker-overload-token-usage must be a number in (0, 1]"},
		{[]string{"--worker-overload-token-usage", "1.01"}, "--worker-overload-token-usage must be a number in (0, 1]"},
		{[]string{"--worker-overload-token-usage", "NaN"}, "--worker-overload-token-usage must be a number in (0, 1]"},
		{[]string{"--health-success-threshold", "0"}, "--health-success-threshold"},
	}
	for _, tc := range cases {
		opts := controlplane.DefaultOptions()
		fs := cli.NewFlagSet("controlplane", "test", &bytes.Buffer{})
		opts.AddFlags(fs)
		if err := cli.Parse(fs, tc.args); err != nil {
			t.Fatalf("%v: parse: %v", tc.args, err)
		}
		err := opts.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%v: err = %v, want %q", tc.args, err, tc.want)
		}
		if _, err := controlplane.New(opts, nil, nil); err == nil {
			t.Fatalf("%v: New accepted invalid options", tc.args)
		}
	}

	opts := controlplane.DefaultOptions()
	fs := cli.NewFlagSet("controlplane", "test", &bytes.Buffer{})
	opts.AddFlags(fs)
	err := cli.Parse(fs, []string{"--worker-urls", "http://w1:8000", "http://w2:8000", "--worker-overload-waiting-requests", "16",
		"--worker-overload-token-usage", "0.9", "--disable-worker-overload-protection"})
	if err != nil {
		t.Fatal(err)
	}
	if err := opts.Validate(); err != nil {
		t.Fatal(err)
	}
	if len(opts.WorkerURLs) != 2 || opts.Thresholds.WaitingRequests != 16 || opts.Thresholds.TokenUsage != 0.9 || !opts.Thresholds.Disabled {
		t.Fatalf("the spec's command line parsed to %+v", opts)
	}
	d := controlplane.DefaultOptions()
	if d.LoadMonitorInterval != 10 || d.Thresholds.WaitingRequests != 8 || d.Thresholds.TokenUsage != 0.8 || d.Thresholds.Disabled ||
		d.Health.FailureThreshold != 3 || d.Health.SuccessThreshold != 2 || d.Health.IntervalSecs != 60 ||
		d.Health.TimeoutSecs != 5 || d.Health.Endpoint != "/health" || math.IsNaN(d.Thresholds.TokenUsage) {
		t.Fatalf("defaults differ from facts.md: %+v", d)
	}
}
