package registry

import (
	"testing"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// The id index's key is made once per worker and shared by its clones; a
// clone given another ID is indexed under its own.
func TestIDKeyFollowsTheID(t *testing.T) {
	r := New("e", 0)
	if _, err := r.Update(func(tx *Txn) error {
		tx.Insert(&Worker{ID: "a", Spec: &smgv1.WorkerSpec{Url: "http://a"}})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Update(func(tx *Txn) error {
		c := tx.Get("a").Clone()
		c.ID, c.Spec = "b", &smgv1.WorkerSpec{Url: "http://b"}
		tx.Insert(c)
		c2 := tx.Get("a").Clone()
		c2.Load = nil
		tx.Insert(c2)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	s := r.Snapshot()
	if a, b := s.Get("a"), s.Get("b"); a == nil || b == nil || a.ID != "a" || b.ID != "b" {
		t.Fatalf("after a clone took another ID: a %v, b %v", a, b)
	}
	if n := len(s.Workers()); n != 2 {
		t.Fatalf("%d workers, want 2", n)
	}
	w := r.Get("a")
	if n := testing.AllocsPerRun(10, func() { workerIDIndexer{}.FromObject(w) }); n != 0 {
		t.Fatalf("the id key of a stored worker costs %v allocations, want 0", n)
	}
}
