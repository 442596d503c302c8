package evidence

import (
	"fmt"
	"log/slog"
	"runtime/metrics"
	"sync/atomic"
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
	tr, _, ids := benchFleet(1000, coalesce)
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

// BenchmarkRecordParallel is the agent streams' side at scale: 100
// goroutines (GOMAXPROCS × 50) push records for 100 workers each of a
// 10,000-worker fleet, while the flush runs every 5,000 records in the goroutine that reached
// it. mutex-wait-ns/op is how long goroutines waited for a lock per record:
// a lock every pusher takes shows there.
func BenchmarkRecordParallel(b *testing.B) {
	const workers, perPusher = 10000, 100
	tr, _, ids := benchFleet(workers, true)
	var pushers, records atomic.Int64
	var flushing atomic.Bool
	b.SetParallelism(50)
	b.ReportAllocs()
	waited := mutexWait()
	b.RunParallel(func(pb *testing.PB) {
		first := int(pushers.Add(1)-1) * perPusher % workers
		now := time.Unix(1700000000, 0)
		i := 0
		for pb.Next() {
			now = now.Add(time.Millisecond)
			tr.Record(ids[first+i%perPusher], judge.Record{Pushed: true, Waiting: int64(i % 3), StepWire: true}, now)
			i++
			// One flush at a time, as Run runs them.
			if records.Add(1)%5000 == 0 && flushing.CompareAndSwap(false, true) {
				tr.Flush()
				flushing.Store(false)
			}
		}
	})
	b.ReportMetric(float64(mutexWait()-waited)/float64(b.N), "mutex-wait-ns/op")
	tr.Flush()
}

// mutexWait is how long goroutines have waited for a sync.Mutex or
// RWMutex in this process, in ns: a lock all pushers share shows here.
func mutexWait() int64 {
	s := []metrics.Sample{{Name: "/sync/mutex/wait/total:seconds"}}
	metrics.Read(s)
	return int64(s[0].Value.Float64() * 1e9)
}

// benchFleet is an inbox over n Ready workers.
func benchFleet(n int, coalesce bool) (*Inbox, *registry.Registry, []string) {
	reg := registry.New("e", 0)
	ids := make([]string, n)
	reg.Update(func(tx *registry.Txn) error {
		for i := range ids {
			ids[i] = fmt.Sprint("w", i)
			tx.Insert(&registry.Worker{Registered: registry.Registered{ID: ids[i], Spec: &smgv1.WorkerSpec{Url: "http://" + ids[i]}}, State: registry.State{Health: registry.HealthHealthy}})
		}
		return nil
	})
	tr := New(reg, Options{Rules: judge.DefaultLivenessConfig(), Coalesce: coalesce}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	return tr, reg, ids
}
