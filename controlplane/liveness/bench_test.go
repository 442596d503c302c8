package liveness

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// BenchmarkRecord: one pushed record's liveness side over 1,000 Ready
// workers, a registry transaction per record.
func BenchmarkRecord(b *testing.B) { benchRecord(b, false) }

// BenchmarkRecordCoalesced is the control plane's configuration: a record
// that leaves the verdict as it is waits for the next flush, run every
// 5,000 records as in the ingest benchmark.
func BenchmarkRecordCoalesced(b *testing.B) { benchRecord(b, true) }

func benchRecord(b *testing.B, coalesce bool) {
	reg := registry.New("e", 0)
	ids := make([]string, 1000)
	reg.Update(func(tx *registry.Txn) error {
		for i := range ids {
			ids[i] = fmt.Sprint("w", i)
			tx.Insert(&registry.Worker{ID: ids[i], Spec: &smgv1.WorkerSpec{Url: "http://" + ids[i]}, Health: registry.HealthHealthy})
		}
		return nil
	})
	tr := New(reg, Options{Rules: judge.DefaultLivenessConfig(), Coalesce: coalesce}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	now := time.Unix(1700000000, 0)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		now = now.Add(time.Millisecond)
		tr.Record(ids[i%len(ids)], judge.Record{Pushed: true, Waiting: int64(i % 3), StepWire: true}, now)
		i++
		if coalesce && i%5000 == 0 {
			tr.Flush()
		}
	}
	tr.Flush()
}
