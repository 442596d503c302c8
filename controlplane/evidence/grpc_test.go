package evidence

import (
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// TestGRPCWorkerRules: the spec's rules as a gRPC worker's channels feed
// them (the control plane's load poll and KV event stream), on an injected
// clock: a connection failure on the poll or the stream arms unreachable
// with the stall rule (an HTTP worker's does not); pushed records hold the
// worker to the stale cadence; the servicer's silence figure wedges a step
// wire past --worker-wedge-secs, and a record without the figure keeps the
// signal quiet.
func TestGRPCWorkerRules(t *testing.T) {
	type step struct {
		at   time.Duration
		do   func(tr *Inbox, now time.Time)
		want smgv1.Veto // after a sweep at the same instant
	}
	failure := func(tr *Inbox, now time.Time) { tr.PollTransportFailure("w1", nil, now) }
	contact := func(tr *Inbox, now time.Time) { tr.Contact("w1", now) }
	pushed := func(silence time.Duration) func(*Inbox, time.Time) {
		return func(tr *Inbox, now time.Time) {
			tr.Record("w1", judge.Record{Waiting: 0, Silence: silence, StepWire: true, Pushed: true}, now)
		}
	}
	sweep := func(*Inbox, time.Time) {}
	none, unreachable, wedged := smgv1.Veto_VETO_UNSPECIFIED, smgv1.Veto_VETO_UNREACHABLE, smgv1.Veto_VETO_WEDGED
	for _, tc := range []struct {
		name  string
		url   string
		steps []step
	}{
		{"gRPC poll failure after silence arms unreachable", "grpc://w1:1", []step{
			{0, contact, none}, {time.Second, failure, none}, {1900 * time.Millisecond, sweep, none},
			{2 * time.Second, sweep, unreachable}, {3 * time.Second, contact, none}}},
		{"HTTP poll failure never arms", "http://w1:1", []step{
			{0, contact, none}, {time.Second, failure, none}, {time.Minute, sweep, none}}},
		{"pushed records go silent: stale at 15 s", "grpc://w1:1", []step{
			{0, pushed(0), none}, {14 * time.Second, sweep, none}, {15 * time.Second, sweep, unreachable},
			{16 * time.Second, contact, none}}},
		{"no pushed record: never stale", "grpc://w1:1", []step{
			{0, contact, none}, {time.Hour, sweep, none}}},
		{"silence figure past the wedge bound on a step wire", "grpcs://w1:1", []step{
			{0, pushed(time.Second), none}, {time.Second, pushed(2 * time.Second), none},
			{2 * time.Second, pushed(3 * time.Second), wedged}, {2500 * time.Millisecond, pushed(0), none}}},
		{"no silence figure: quiet", "grpc://w1:1", []step{
			{0, pushed(0), none}, {5 * time.Second, pushed(0), none}, {10 * time.Second, pushed(0), none}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := registry.New("e", 0)
			if _, err := reg.Update(func(txn *registry.Txn) error {
				txn.Insert(&registry.Worker{Registered: registry.Registered{ID: "w1", Spec: &smgv1.WorkerSpec{Url: tc.url}, Model: "m", Type: "regular"}, State: registry.State{Health: registry.HealthHealthy}})
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			tr := New(reg, Options{Rules: judge.DefaultLivenessConfig()}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
			for i, s := range tc.steps {
				now := t0.Add(s.at)
				s.do(tr, now)
				tr.Sweep(now)
				if got := reg.Snapshot().Get("w1").Liveness; got != s.want {
					t.Fatalf("step %d at %s: liveness %v, want %v", i, s.at, got, s.want)
				}
			}
		})
	}
}
