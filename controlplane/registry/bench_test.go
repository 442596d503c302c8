package registry

import (
	"fmt"
	"testing"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// BenchmarkFlushTxn is one transaction storing 1,000 of 10,000 workers'
// new loads, as a flush does.
func BenchmarkFlushTxn(b *testing.B) {
	r, ids := registryOf(10000)
	b.ReportAllocs()
	round := 0
	for b.Loop() {
		round++
		r.Update(func(tx *Txn) error {
			for i := round % 10; i < len(ids); i += 10 {
				c := tx.Get(ids[i]).Clone()
				c.LoadRevision++
				tx.Insert(c)
			}
			return nil
		})
	}
}

// BenchmarkSnapshotGet is a search of the workers' tree at 10,000 workers.
func BenchmarkSnapshotGet(b *testing.B) {
	r, ids := registryOf(10000)
	s := r.Snapshot()
	i := 0
	for b.Loop() {
		i = (i + 7919) % len(ids)
		if s.Get(ids[i]) == nil {
			b.Fatal("missing")
		}
	}
}

// registryOf is a registry of n workers and their ids.
func registryOf(n int) (*Registry, []string) {
	r := New("e", 0)
	ids := make([]string, n)
	r.Update(func(tx *Txn) error {
		for i := range ids {
			ids[i] = fmt.Sprintf("worker-%05d", i)
			tx.Insert(&Worker{Registered: Registered{ID: ids[i], Spec: &smgv1.WorkerSpec{Url: "http://" + ids[i]}}})
		}
		return nil
	})
	return r, ids
}
