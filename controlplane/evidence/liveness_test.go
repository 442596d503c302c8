package evidence

import (
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func setup(t *testing.T, health registry.Health) (*Inbox, *registry.Registry, *prometheus.Registry) {
	t.Helper()
	reg := registry.New("e", 0)
	if _, err := reg.Update(func(txn *registry.Txn) error {
		txn.Insert(&registry.Worker{Registered: registry.Registered{ID: "w1", Spec: &smgv1.WorkerSpec{Url: "http://w1"}, Model: "m", Type: "regular"}, State: registry.State{Health: health}})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	m := prometheus.NewRegistry()
	tr := New(reg, Options{Rules: judge.DefaultLivenessConfig()}, slog.New(slog.DiscardHandler), m)
	return tr, reg, m
}

func liveness(reg *registry.Registry) smgv1.Veto { return reg.Snapshot().Get("w1").Liveness }

func TestTransportFailureThenSilenceVetoesUnreachableAndContactReadmits(t *testing.T) {
	tr, reg, m := setup(t, registry.HealthHealthy)
	tr.Contact("w1", t0)
	tr.Failure("w1", judge.ConnectionFailure, t0.Add(time.Second)) // inside a recent contact: remembered
	tr.Sweep(t0.Add(1500 * time.Millisecond))
	if got := liveness(reg); got != smgv1.Veto_VETO_UNSPECIFIED {
		t.Fatalf("vetoed before the stall bound: %v", got)
	}
	tr.Sweep(t0.Add(2 * time.Second)) // 2 s of silence since the contact
	if got := liveness(reg); got != smgv1.Veto_VETO_UNREACHABLE {
		t.Fatalf("liveness = %v, want unreachable", got)
	}
	if v := testutil.ToFloat64(tr.stalled.WithLabelValues("http://w1", "unreachable")); v != 1 {
		t.Fatalf("smg_worker_stalled{reason=unreachable} = %v, want 1", v)
	}
	seq := reg.Snapshot().Get("w1").ContactSeq
	tr.Contact("w1", t0.Add(3*time.Second))
	w := reg.Snapshot().Get("w1")
	if w.Liveness != smgv1.Veto_VETO_UNSPECIFIED || w.ContactSeq != seq+1 {
		t.Fatalf("after contact: liveness %v contact_seq %d (was %d)", w.Liveness, w.ContactSeq, seq)
	}
	if w.Health != registry.HealthHealthy {
		t.Fatalf("a veto touched health: %v", w.Health)
	}
	if n := testutil.CollectAndCount(m, "smg_worker_stall_transitions_total"); n != 1 {
		t.Fatalf("stall transitions series = %d, want 1", n)
	}
	if v := testutil.ToFloat64(tr.stalled.WithLabelValues("http://w1", "unreachable")); v != 0 {
		t.Fatalf("smg_worker_stalled after re-admission = %v, want 0", v)
	}
}

func TestHTTPPollFailureNeverArmsUnreachable(t *testing.T) {
	tr, reg, _ := setup(t, registry.HealthHealthy)
	tr.PollTransportFailure("w1", nil, t0)
	tr.Sweep(t0.Add(time.Minute))
	if got := liveness(reg); got != smgv1.Veto_VETO_UNSPECIFIED {
		t.Fatalf("HTTP poll failure vetoed the worker: %v", got)
	}
}

func TestPilesAreSummedAcrossRouters(t *testing.T) {
	tr, reg, _ := setup(t, registry.HealthHealthy)
	tr.Contact("w1", t0)
	obs := func(streams int32) *smgv1.RouterReport {
		return &smgv1.RouterReport{Workers: []*smgv1.WorkerObservation{{WorkerId: "w1", StreamsInFlight: streams}}}
	}
	// Two routers with two silent streams each: four deep together.
	tr.RouterObservations("r1", obs(2), t0)
	tr.RouterObservations("r2", obs(2), t0)
	tr.Sweep(t0.Add(2 * time.Second))
	if got := liveness(reg); got != smgv1.Veto_VETO_UNSPECIFIED {
		t.Fatalf("vetoed inside the wedge bound: %v", got)
	}
	tr.Sweep(t0.Add(3 * time.Second))
	if got := liveness(reg); got != smgv1.Veto_VETO_WEDGED {
		t.Fatalf("a pile four deep summed over routers was not wedged: %v", got)
	}
	// A token on one router is progress for the worker.
	tr.RouterObservations("r1", &smgv1.RouterReport{Workers: []*smgv1.WorkerObservation{{
		WorkerId: "w1", StreamsInFlight: 2, LastProgress: timestamppb.New(t0.Add(3500 * time.Millisecond)),
	}}}, t0.Add(3500*time.Millisecond))
	if got := liveness(reg); got != smgv1.Veto_VETO_UNSPECIFIED {
		t.Fatalf("progress did not lift the wedge veto: %v", got)
	}
}

func TestRouterGoneDropsItsPile(t *testing.T) {
	tr, reg, _ := setup(t, registry.HealthHealthy)
	tr.Contact("w1", t0)
	tr.RouterObservations("r1", &smgv1.RouterReport{Workers: []*smgv1.WorkerObservation{{WorkerId: "w1", StreamsInFlight: 4}}}, t0)
	tr.Sweep(t0.Add(3 * time.Second))
	if got := liveness(reg); got != smgv1.Veto_VETO_WEDGED {
		t.Fatalf("liveness = %v, want wedged", got)
	}
	tr.RouterGone("r1")
	if got := liveness(reg); got != smgv1.Veto_VETO_UNSPECIFIED {
		t.Fatalf("the pile of a gone router still vetoes: %v", got)
	}
}

func TestOnlyReadyWorkersAreJudgedAndLeavingReadyDropsTheVeto(t *testing.T) {
	tr, reg, _ := setup(t, registry.HealthPending)
	tr.Failure("w1", judge.ConnectionFailure, t0)
	tr.Sweep(t0.Add(time.Minute))
	if got := liveness(reg); got != smgv1.Veto_VETO_UNSPECIFIED {
		t.Fatalf("a worker not Ready was judged: %v", got)
	}
	setHealth(t, reg, "w1", registry.HealthHealthy)
	tr.Failure("w1", judge.ConnectionFailure, t0.Add(time.Minute)) // nothing ever heard: vetoes at once
	if got := liveness(reg); got != smgv1.Veto_VETO_UNREACHABLE {
		t.Fatalf("liveness = %v, want unreachable", got)
	}
	setHealth(t, reg, "w1", registry.HealthUnhealthy)
	tr.Sweep(t0.Add(2 * time.Minute))
	if got := liveness(reg); got != smgv1.Veto_VETO_UNSPECIFIED {
		t.Fatalf("a worker that left Ready kept its liveness veto: %v", got)
	}
}

func TestPushedRecordsMakeAWorkerStaleAfterSilence(t *testing.T) {
	tr, reg, _ := setup(t, registry.HealthHealthy)
	tr.Record("w1", judge.Record{Pushed: true}, t0)
	if !tr.RecentlyPushed("w1", 10*time.Second, t0.Add(time.Second)) {
		t.Fatal("a record pushed 1 s ago does not skip a 10 s poll")
	}
	tr.Sweep(t0.Add(14 * time.Second))
	if got := liveness(reg); got != smgv1.Veto_VETO_UNSPECIFIED {
		t.Fatalf("stale before 15 s: %v", got)
	}
	tr.Sweep(t0.Add(15 * time.Second))
	if got := liveness(reg); got != smgv1.Veto_VETO_UNREACHABLE {
		t.Fatalf("liveness = %v, want unreachable (stale)", got)
	}
	tr.Contact("w1", t0.Add(16*time.Second))
	if got := liveness(reg); got != smgv1.Veto_VETO_UNSPECIFIED {
		t.Fatalf("a passing probe did not clear the stale veto: %v", got)
	}
}

// A router's failed request to an HTTP worker is neither of the worker's
// channels (the load poll, the KV event stream): the spec leaves HTTP workers
// to health checks and the circuit breaker, so it never arms unreachable.
func TestRouterFailureToHTTPWorkerNeverArmsUnreachable(t *testing.T) {
	tr, reg, _ := setup(t, registry.HealthHealthy)
	tr.Contact("w1", t0)
	failed := t0.Add(2500 * time.Millisecond) // past the 2 s stall bound
	tr.RouterObservations("r1", &smgv1.RouterReport{Workers: []*smgv1.WorkerObservation{{
		WorkerId: "w1", ConnectionFailures: 10, LastFailure: timestamppb.New(failed),
	}}}, failed)
	tr.Sweep(t0.Add(time.Minute))
	if got := liveness(reg); got != smgv1.Veto_VETO_UNSPECIFIED {
		t.Fatalf("a router's failed requests vetoed an HTTP worker: %v", got)
	}
}

// A router's report can itself carry the event that moves the verdict: a
// connection failure to a gRPC worker past the stall bound vetoes, its
// contact re-admits. The registry must get that change even though the pile
// part of the report changes nothing.
func TestRouterReportFailureAndContactReachTheRegistry(t *testing.T) {
	tr, reg, _ := setup(t, registry.HealthHealthy)
	if _, err := reg.Update(func(txn *registry.Txn) error {
		c := txn.Get("w1").Clone()
		c.Spec = &smgv1.WorkerSpec{Url: "grpc://w1", ConnectionMode: "grpc"}
		txn.Insert(c)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	tr.Contact("w1", t0)
	failed := t0.Add(2500 * time.Millisecond) // past the 2 s stall bound, before any sweep
	tr.RouterObservations("r1", &smgv1.RouterReport{Workers: []*smgv1.WorkerObservation{{
		WorkerId: "w1", ConnectionFailures: 3, LastFailure: timestamppb.New(failed),
	}}}, failed)
	if got := liveness(reg); got != smgv1.Veto_VETO_UNREACHABLE {
		t.Fatalf("a router's connection failure after %s of silence left liveness %v, want unreachable", failed.Sub(t0), got)
	}
	tr.Sweep(failed.Add(250 * time.Millisecond))
	if got := liveness(reg); got != smgv1.Veto_VETO_UNREACHABLE {
		t.Fatalf("after a sweep: liveness %v, want unreachable", got)
	}
	seq := reg.Snapshot().Get("w1").ContactSeq
	back := failed.Add(time.Second)
	tr.RouterObservations("r1", &smgv1.RouterReport{Workers: []*smgv1.WorkerObservation{{WorkerId: "w1", Contact: true}}}, back)
	if w := reg.Snapshot().Get("w1"); w.Liveness != smgv1.Veto_VETO_UNSPECIFIED || w.ContactSeq != seq+1 {
		t.Fatalf("a router's contact left liveness %v contact_seq %d (was %d), want re-admitted", w.Liveness, w.ContactSeq, seq)
	}
}

func setHealth(t *testing.T, reg *registry.Registry, id string, h registry.Health) {
	t.Helper()
	if _, err := reg.Update(func(txn *registry.Txn) error {
		c := txn.Get(id).Clone()
		c.Health = h
		txn.Insert(c)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
