package evidence

import (
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// TestGRPCWorkerPileSummedOverRouters: the pile the spec builds from
// streaming gRPC generations is taken for a gRPC worker as routers report
// it, summed over routers (two routers with two silent streams each are
// four deep), while its servicer keeps pushing load records without a
// silence figure: those records are contact, not progress, so they neither
// hold the veto off nor lift it; a token on one router does.
func TestGRPCWorkerPileSummedOverRouters(t *testing.T) {
	reg := registry.New("e", 0)
	if _, err := reg.Update(func(txn *registry.Txn) error {
		txn.Insert(&registry.Worker{Registered: registry.Registered{ID: "w1", Spec: &smgv1.WorkerSpec{Url: "grpc://w1:1", ConnectionMode: "grpc"}, Model: "m", Type: "regular"}, State: registry.State{Health: registry.HealthHealthy}})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	tr := New(reg, Options{Rules: judge.DefaultLivenessConfig()}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	pile := func(router string, streams int32, progress time.Time, now time.Time) {
		o := &smgv1.WorkerObservation{WorkerId: "w1", StreamsInFlight: streams}
		if !progress.IsZero() {
			o.LastProgress = timestamppb.New(progress)
		}
		tr.RouterObservations(router, &smgv1.RouterReport{Workers: []*smgv1.WorkerObservation{o}}, now)
	}
	push := func(now time.Time) { tr.Record("w1", judge.Record{Waiting: 0, StepWire: true, Pushed: true}, now) }
	check := func(at time.Duration, want smgv1.Veto) {
		t.Helper()
		tr.Sweep(t0.Add(at))
		if got := reg.Snapshot().Get("w1").Liveness; got != want {
			t.Fatalf("at %s: liveness %v, want %v", at, got, want)
		}
	}
	push(t0)
	pile("r1", 2, time.Time{}, t0)
	pile("r2", 2, time.Time{}, t0)
	push(t0.Add(time.Second))
	push(t0.Add(2 * time.Second))
	check(2*time.Second, smgv1.Veto_VETO_UNSPECIFIED)
	push(t0.Add(3 * time.Second))
	check(3*time.Second, smgv1.Veto_VETO_WEDGED)
	push(t0.Add(3200 * time.Millisecond))
	check(3200*time.Millisecond, smgv1.Veto_VETO_WEDGED)
	pile("r1", 2, t0.Add(3500*time.Millisecond), t0.Add(3500*time.Millisecond))
	check(3500*time.Millisecond, smgv1.Veto_VETO_UNSPECIFIED)
}
