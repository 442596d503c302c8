package evidence_test

import (
	"errors"
	"log/slog"
	"strings"
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

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer = smgtest.SyncBuffer

type fixture struct {
	reg  *registry.Registry
	in   *evidence.Inbox
	logs *syncBuffer
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	logs := &syncBuffer{}
	reg := registry.New("test", 0)
	return &fixture{reg: reg, in: evidence.New(reg, evidence.Options{}, slog.New(slog.NewTextHandler(logs, nil)), prometheus.NewRegistry()), logs: logs}
}

// add registers a Ready worker with the given thresholds.
func (f *fixture) add(t *testing.T, id, url, model string, th judge.Thresholds) {
	t.Helper()
	_, err := f.reg.Update(func(tx *registry.Txn) error {
		tx.Insert(&registry.Worker{Registered: registry.Registered{ID: id, Spec: &smgv1.WorkerSpec{Url: url}, Model: model, Type: "regular", Thresholds: th}, State: registry.State{Health: registry.HealthHealthy}})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) worker(t *testing.T, id string) *registry.Worker {
	t.Helper()
	w := f.reg.Snapshot().Get(id)
	if w == nil {
		t.Fatalf("worker %s not found", id)
	}
	return w
}

func (f *fixture) setHealth(t *testing.T, id string, h registry.Health) {
	t.Helper()
	_, err := f.reg.Update(func(tx *registry.Txn) error {
		c := tx.Get(id).Clone()
		c.Health = h
		tx.Insert(c)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// ranks builds a report with only per-rank fields, as an agent that leaves the
// aggregates empty would send it.
func ranks(rs ...*smgv1.RankLoad) *smgv1.EngineLoad {
	for i, r := range rs {
		r.DpRank = int32(i)
	}
	return &smgv1.EngineLoad{Source: "test", Ranks: rs}
}

func rank(waiting int32, usage float64) *smgv1.RankLoad {
	return &smgv1.RankLoad{WaitingRequests: waiting, TokenUsage: usage}
}

var gateway = judge.DefaultGatewayThresholds().Resolve(nil) // 8 waiting, 0.8 usage

func TestReportVerdict(t *testing.T) {
	cases := []struct {
		name string
		th   judge.Thresholds
		load *smgv1.EngineLoad
		want bool
	}{
		{"idle", gateway, ranks(rank(0, 0.1)), false},
		{"waiting just under", gateway, ranks(rank(7, 0.1)), false},
		{"waiting at threshold trips (>=)", gateway, ranks(rank(8, 0)), true},
		{"waiting summed over ranks", gateway, ranks(rank(4, 0), rank(4, 0)), true},
		{"waiting summed just under", gateway, ranks(rank(4, 0), rank(3, 0)), false},
		{"token usage at threshold trips (>=)", gateway, ranks(rank(0, 0.8)), true},
		{"token usage averaged: one saturated rank of two", gateway, ranks(rank(0, 1.0), rank(0, 0.5)), false},
		{"token usage mean reaches threshold", gateway, ranks(rank(0, 0.9), rank(0, 0.7)), true},
		{"missing fields read 0", gateway, ranks(&smgv1.RankLoad{RunningRequests: 300}), false},
		{"per-worker waiting block", judge.Thresholds{WaitingRequests: 4, TokenUsage: 0.8}, ranks(rank(4, 0)), true},
		{"per-worker usage block", judge.Thresholds{WaitingRequests: 8, TokenUsage: 0.5}, ranks(rank(0, 0.5)), true},
		{"no thresholds never trips", judge.Thresholds{}, ranks(rank(1000, 1)), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.add(t, "w1", "http://e1:8000", "m", tc.th)
			if err := f.in.Report("w1", tc.load); err != nil {
				t.Fatal(err)
			}
			w := f.worker(t, "w1")
			if w.Overloaded != tc.want {
				t.Fatalf("overloaded = %v, want %v (reason %q)", w.Overloaded, tc.want, w.OverloadReason)
			}
			if tc.want && w.OverloadReason == "" {
				t.Fatal("an overloaded worker carries a reason")
			}
			if w.Load != tc.load {
				t.Fatal("the report is stored on the worker")
			}
		})
	}
}

func TestReportStoresSignalsComputedFromRanks(t *testing.T) {
	f := newFixture(t)
	f.add(t, "w1", "http://e1:8000", "m", gateway)
	load := ranks(rank(3, 0.2), rank(2, 0.6))
	load.WaitingRequests, load.TokenUsage = 99, 0.99 // a sender's wrong aggregates are not trusted
	if err := f.in.Report("w1", load); err != nil {
		t.Fatal(err)
	}
	w := f.worker(t, "w1")
	if w.Overloaded {
		t.Fatalf("5 waiting and mean usage 0.4 are under 8 and 0.8, got reason %q", w.OverloadReason)
	}
	if got := w.Load.GetWaitingRequests(); got != 5 {
		t.Fatalf("stored waiting = %d, want 5", got)
	}
	if got := w.Load.GetTokenUsage(); got < 0.3999 || got > 0.4001 {
		t.Fatalf("stored token usage = %v, want 0.4", got)
	}
}

func TestNoHysteresis(t *testing.T) {
	f := newFixture(t)
	f.add(t, "w1", "http://e1:8000", "m", gateway)
	steps := []struct {
		waiting int32
		want    bool
	}{{8, true}, {20, true}, {7, false}, {8, true}, {0, false}}
	for i, s := range steps {
		if err := f.in.Report("w1", ranks(rank(s.waiting, 0))); err != nil {
			t.Fatal(err)
		}
		if got := f.worker(t, "w1").Overloaded; got != s.want {
			t.Fatalf("step %d (waiting %d): overloaded = %v, want %v", i, s.waiting, got, s.want)
		}
	}
	if !strings.Contains(f.logs.String(), "Worker overloaded") || !strings.Contains(f.logs.String(), "back in routing") {
		t.Fatalf("verdict changes are logged:\n%s", f.logs)
	}
}

func TestReasonFollowsTheReport(t *testing.T) {
	f := newFixture(t)
	f.add(t, "w1", "http://e1:8000", "m", gateway)
	for _, n := range []int32{9, 12} {
		if err := f.in.Report("w1", ranks(rank(n, 0))); err != nil {
			t.Fatal(err)
		}
	}
	if got := f.worker(t, "w1").OverloadReason; got != "waiting_requests 12 >= 8" {
		t.Fatalf("reason = %q, want the latest report's", got)
	}
}

func TestFailOpen(t *testing.T) {
	noReports := map[string]func(in *evidence.Inbox) error{
		"nil report":    func(in *evidence.Inbox) error { return in.Report("w1", nil) },
		"empty report":  func(in *evidence.Inbox) error { return in.Report("w1", &smgv1.EngineLoad{Source: "vllm"}) },
		"no report":     func(in *evidence.Inbox) error { return in.NoReport("w1") },
		"state rebuilt": func(in *evidence.Inbox) error { in.Rebuild("test", nil); return nil },
	}
	for name, clear := range noReports {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			f.add(t, "w1", "http://e1:8000", "m", gateway)
			if err := f.in.Report("w1", ranks(rank(50, 0.95))); err != nil {
				t.Fatal(err)
			}
			last := f.worker(t, "w1").Load
			if !f.worker(t, "w1").Overloaded {
				t.Fatal("setup: worker should be overloaded")
			}
			if err := clear(f.in); err != nil {
				t.Fatal(err)
			}
			w := f.worker(t, "w1")
			if w.Overloaded || w.OverloadReason != "" {
				t.Fatalf("veto not cleared: %q", w.OverloadReason)
			}
			if name != "under in abatch" && w.Load != last {
				t.Fatal("no report keeps the last load visible")
			}
		})
	}
}

func TestRebuildClearsEveryWorkerWithAWarning(t *testing.T) {
	f := newFixture(t)
	for _, id := range []string{"a", "b", "c"} {
		f.add(t, id, "http://"+id+":8000", "m", gateway)
		if err := f.in.Report(id, ranks(rank(30, 0))); err != nil {
			t.Fatal(err)
		}
	}
	f.in.Rebuild("monitor restarted", nil)
	for _, id := range []string{"a", "b", "c"} {
		if f.worker(t, id).Overloaded {
			t.Fatalf("worker %s still vetoed after a rebuild", id)
		}
	}
	logs := f.logs.String()
	if !strings.Contains(logs, "level=WARN") || !strings.Contains(logs, "cleared=3") {
		t.Fatalf("a rebuild logs a warning with the count:\n%s", logs)
	}
}

func TestNotReadyWorkerGetsNoVeto(t *testing.T) {
	f := newFixture(t)
	f.add(t, "w1", "http://e1:8000", "m", gateway)
	f.setHealth(t, "w1", registry.HealthUnhealthy)
	if err := f.in.Report("w1", ranks(rank(30, 0))); err != nil {
		t.Fatal(err)
	}
	w := f.worker(t, "w1")
	if w.Overloaded {
		t.Fatal("a report for a worker out of Ready must not veto it")
	}
	if w.Load.GetWaitingRequests() != 30 {
		t.Fatal("the load is still stored")
	}
}

func TestUnknownWorker(t *testing.T) {
	f := newFixture(t)
	rev := f.reg.Revision()
	if err := f.in.Report("nope", ranks(rank(1, 0))); !errors.Is(err, evidence.ErrUnknownWorker) {
		t.Fatalf("Report: err = %v, want ErrUnknownWorker", err)
	}
	if err := f.in.NoReport("nope"); !errors.Is(err, evidence.ErrUnknownWorker) {
		t.Fatalf("NoReport: err = %v, want ErrUnknownWorker", err)
	}
	if f.reg.Revision() != rev {
		t.Fatalf("revision %d, want %d: a report about an unknown worker commits nothing", f.reg.Revision(), rev)
	}
}

func TestCollector(t *testing.T) {
	f := newFixture(t)
	f.add(t, "w1", "http://e1:8000", "llama", gateway)
	f.add(t, "w2", "http://e2:8000", "llama", gateway)
	f.add(t, "w3", "http://e3:8000", "qwen", gateway)
	c := evidence.NewCollector(f.reg)
	promReg := prometheus.NewRegistry()
	promReg.MustRegister(c)

	load := ranks(&smgv1.RankLoad{WaitingRequests: 4, RunningRequests: 30, TokenUsage: 0.5, GenThroughput: 1200, CacheHitRate: 0.25},
		&smgv1.RankLoad{WaitingRequests: 6, RunningRequests: 31, TokenUsage: 0.7, GenThroughput: 1300, CacheHitRate: 0.5})
	if err := f.in.Report("w1", load); err != nil {
		t.Fatal(err)
	}
	if err := f.in.Report("w2", ranks(rank(1, 0.1))); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP smg_engine_waiting_requests Requests waiting in the engine's scheduler queue, as last reported (-1: worker removed).
# TYPE smg_engine_waiting_requests gauge
smg_engine_waiting_requests{dp_rank="0",model="llama",worker="http://e1:8000"} 4
smg_engine_waiting_requests{dp_rank="0",model="llama",worker="http://e2:8000"} 1
smg_engine_waiting_requests{dp_rank="1",model="llama",worker="http://e1:8000"} 6
# HELP smg_engine_running_requests Requests in the engine's running batch, as last reported (-1: worker removed).
# TYPE smg_engine_running_requests gauge
smg_engine_running_requests{dp_rank="0",model="llama",worker="http://e1:8000"} 30
smg_engine_running_requests{dp_rank="0",model="llama",worker="http://e2:8000"} 0
smg_engine_running_requests{dp_rank="1",model="llama",worker="http://e1:8000"} 31
# HELP smg_engine_token_usage KV cache token usage (0-1) the engine last reported (-1: worker removed).
# TYPE smg_engine_token_usage gauge
smg_engine_token_usage{dp_rank="0",model="llama",worker="http://e1:8000"} 0.5
smg_engine_token_usage{dp_rank="0",model="llama",worker="http://e2:8000"} 0.1
smg_engine_token_usage{dp_rank="1",model="llama",worker="http://e1:8000"} 0.7
# HELP smg_workers_overloaded Workers currently excluded from routing by overload protection.
# TYPE smg_workers_overloaded gauge
smg_workers_overloaded{model="llama"} 1
smg_workers_overloaded{model="qwen"} 0
`
	names := []string{"smg_engine_waiting_requests", "smg_engine_running_requests", "smg_engine_token_usage", "smg_workers_overloaded"}
	if err := testutil.GatherAndCompare(promReg, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"smg_engine_gen_throughput", "smg_engine_cache_hit_rate"} {
		if n, err := testutil.GatherAndCount(promReg, name); err != nil || n != 3 {
			t.Fatalf("%s: %d series (err %v), want 3", name, n, err)
		}
	}

	// Removal: the worker's series read -1 from now on.
	old := f.worker(t, "w1")
	_, err := f.reg.Update(func(tx *registry.Txn) error { tx.Delete("w1"); return nil })
	if err != nil {
		t.Fatal(err)
	}
	c.Removed(old)
	wantRemoved := `
# HELP smg_engine_waiting_requests Requests waiting in the engine's scheduler queue, as last reported (-1: worker removed).
# TYPE smg_engine_waiting_requests gauge
smg_engine_waiting_requests{dp_rank="0",model="llama",worker="http://e1:8000"} -1
smg_engine_waiting_requests{dp_rank="0",model="llama",worker="http://e2:8000"} 1
smg_engine_waiting_requests{dp_rank="1",model="llama",worker="http://e1:8000"} -1
# HELP smg_workers_overloaded Workers currently excluded from routing by overload protection.
# TYPE smg_workers_overloaded gauge
smg_workers_overloaded{model="llama"} 0
smg_workers_overloaded{model="qwen"} 0
`
	if err := testutil.GatherAndCompare(promReg, strings.NewReader(wantRemoved), "smg_engine_waiting_requests", "smg_workers_overloaded"); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"smg_engine_token_usage", "smg_engine_running_requests", "smg_engine_gen_throughput", "smg_engine_cache_hit_rate"} {
		mfs, _ := promReg.Gather()
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				if labelValue(m.GetLabel(), "worker") == "http://e1:8000" && m.GetGauge().GetValue() != -1 {
					t.Fatalf("%s of the removed worker = %v, want -1", name, m.GetGauge().GetValue())
				}
			}
		}
	}

	// The same URL registered again reports live values, not -1.
	f.add(t, "w1", "http://e1:8000", "llama", gateway)
	if err := f.in.Report("w1", ranks(rank(2, 0.2))); err != nil {
		t.Fatal(err)
	}
	if got := gaugeValue(t, promReg, "smg_engine_waiting_requests", "http://e1:8000", "0"); got != 2 {
		t.Fatalf("re-registered worker reads %v, want 2", got)
	}
}

// gaugeValue reads one smg_engine_* series.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name, worker, dpRank string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if labelValue(m.GetLabel(), "worker") == worker && labelValue(m.GetLabel(), "dp_rank") == dpRank {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no %s{worker=%q,dp_rank=%q}", name, worker, dpRank)
	return 0
}

func labelValue(pairs []*dto.LabelPair, name string) string {
	for _, p := range pairs {
		if p.GetName() == name {
			return p.GetValue()
		}
	}
	return ""
}

func TestWorkersOverloadedReadsZeroAfterAModelsLastWorkerGoes(t *testing.T) {
	reg := registry.New("e", 0)
	promReg := prometheus.NewRegistry()
	promReg.MustRegister(evidence.NewCollector(reg))
	if _, err := reg.Update(func(tx *registry.Txn) error {
		tx.Insert(&registry.Worker{Registered: registry.Registered{ID: "w1", Spec: &smgv1.WorkerSpec{Url: "http://e1"}, Model: "solo", Thresholds: judge.Thresholds{WaitingRequests: 1}}, State: registry.State{Health: registry.HealthHealthy, Load: &smgv1.EngineLoad{WaitingRequests: 2}}}) // overloaded
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := func(v string) string {
		return "# HELP smg_workers_overloaded Workers currently excluded from routing by overload protection.\n" +
			"# TYPE smg_workers_overloaded gauge\nsmg_workers_overloaded{model=\"solo\"} " + v + "\n"
	}
	if err := testutil.GatherAndCompare(promReg, strings.NewReader(want("1")), "smg_workers_overloaded"); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Update(func(tx *registry.Txn) error { tx.Delete("w1"); return nil }); err != nil {
		t.Fatal(err)
	}
	if err := testutil.GatherAndCompare(promReg, strings.NewReader(want("0")), "smg_workers_overloaded"); err != nil {
		t.Fatal(err)
	}
}
