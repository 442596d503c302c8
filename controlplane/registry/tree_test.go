package registry

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// checkTree asserts t's shape: leaves ordered and bounded, none empty, n
// their total, and the workers it holds exactly want (id -> record).
func checkTree(t *testing.T, tr *tree[*Worker], want map[string]*Worker, what string) {
	t.Helper()
	n, prev := 0, ""
	for li, l := range tr.leaves {
		if len(l.vs) == 0 || len(l.vs) > maxLeaf {
			t.Fatalf("%s: leaf %d holds %d workers, want 1 to %d", what, li, len(l.vs), maxLeaf)
		}
		for _, w := range l.vs {
			if n > 0 && w.ID <= prev {
				t.Fatalf("%s: %q after %q: out of order", what, w.ID, prev)
			}
			prev = w.ID
			n++
			if want[w.ID] != w {
				t.Fatalf("%s: holds %q as %p, want %p", what, w.ID, w, want[w.ID])
			}
		}
	}
	if n != len(want) || tr.n != n {
		t.Fatalf("%s: %d workers (counted %d), want %d", what, n, tr.n, len(want))
	}
	for id, w := range want {
		if tr.get(id) != w {
			t.Fatalf("%s: get(%q) is not its record", what, id)
		}
	}
	ids := slices.Sorted(maps.Keys(want))
	for i, w := range tr.list() {
		if w.ID != ids[i] {
			t.Fatalf("%s: list[%d] = %q, want %q", what, i, w.ID, ids[i])
		}
	}
}

// Random transactions (inserts, replacements, deletes; some aborted) keep
// the workers exact, and every snapshot taken on the way keeps what it
// held: a transaction writes only the leaves it copied. Get, read without
// a lock, returns each worker's current record throughout (its id maps
// fold their overlay into a new base many times on the way).
func TestTreeFollowsTransactionsAndSnapshotsStay(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	r := New("e", 0)
	model := map[string]*Worker{}
	type kept struct {
		snap *Snapshot
		want map[string]*Worker
	}
	var snaps []kept
	type commit struct {
		before  uint64          // the revision before it
		touched map[string]bool // id -> deleted
	}
	var commits []commit
	errAbort := errors.New("abort")
	for round := range 120 {
		next := maps.Clone(model)
		abort := rng.IntN(10) == 0
		touched := map[string]bool{} // id -> deleted at the end
		before := r.Revision()
		_, err := r.Update(func(tx *Txn) error {
			for range 1 + rng.IntN(200) {
				id := fmt.Sprintf("w-%04d", rng.IntN(1500))
				touched[id] = false // set below
				switch old := tx.Get(id); {
				case old != nil && rng.IntN(4) == 0:
					tx.Delete(id)
					delete(next, id)
				case old != nil:
					c := old.Clone()
					c.LoadRevision++
					tx.Insert(c)
					next[id] = c
				default:
					w := &Worker{Registered: Registered{ID: id, Spec: &smgv1.WorkerSpec{Url: "http://" + id}}}
					tx.Insert(w)
					next[id] = w
				}
			}
			checkTree(t, tx.workers, next, fmt.Sprintf("round %d, inside", round))
			for id := range touched {
				touched[id] = next[id] == nil
				if got := tx.Get(id); got != next[id] {
					t.Fatalf("round %d, inside: Get(%s) = %p, want this transaction's write %p", round, id, got, next[id])
				}
			}
			if abort {
				return errAbort
			}
			return nil
		})
		if abort != (err != nil) {
			t.Fatalf("round %d: abort %v, err %v", round, abort, err)
		}
		if !abort {
			model = next
		}
		// The changes committed are exactly this transaction's (none of
		// an aborted one's, nor of the one before: its bookkeeping is
		// reused).
		changes, _, ok := r.ChangesSince(before)
		if !ok {
			t.Fatalf("round %d: history lost revision %d", round, before)
		}
		if abort {
			touched = nil
		}
		if len(changes) != len(touched) {
			t.Fatalf("round %d: %d changes, want %d", round, len(changes), len(touched))
		}
		for _, c := range changes {
			if deleted, ok := touched[c.WorkerID]; !ok || c.Deleted != deleted || c.Revision != before+1 {
				t.Fatalf("round %d: change %+v, want one of the %d touched at revision %d", round, c, len(touched), before+1)
			}
		}
		// Since a few commits back: each id once, as its latest commit
		// left it (the merge, with the index it reuses).
		if !abort {
			commits = append(commits, commit{before, touched})
		}
		if len(commits) > 0 {
			from := max(0, len(commits)-1-rng.IntN(4))
			want := map[string]commit{}
			for _, c := range commits[from:] {
				for id, deleted := range c.touched {
					want[id] = commit{before: c.before + 1, touched: map[string]bool{id: deleted}}
				}
			}
			changes, _, ok := r.ChangesSince(commits[from].before)
			if ok && len(changes) != len(want) {
				t.Fatalf("round %d: %d changes since %d, want %d", round, len(changes), commits[from].before, len(want))
			}
			for _, c := range changes {
				if w, ok := want[c.WorkerID]; !ok || c.Revision != w.before || c.Deleted != w.touched[c.WorkerID] {
					t.Fatalf("round %d: change %+v since %d, want %+v", round, c, commits[from].before, w)
				}
			}
		}
		checkTree(t, r.Snapshot().workers, model, fmt.Sprintf("round %d", round))
		for i := range 1500 {
			id := fmt.Sprintf("w-%04d", i)
			if got, want := r.Get(id), model[id]; got != want {
				t.Fatalf("round %d: Get(%s) = %p, want the current record %p", round, id, got, want)
			}
		}
		if round%10 == 0 {
			snaps = append(snaps, kept{r.Snapshot(), model})
		}
	}
	for i, k := range snaps {
		checkTree(t, k.snap.workers, k.want, fmt.Sprintf("snapshot %d, later", i))
		for id, w := range k.want {
			if k.snap.GetByURL("http://"+id) != w {
				t.Fatalf("snapshot %d, later: GetByURL of %s is not its record", i, id)
			}
		}
	}
	if len(model) < 2*maxLeaf {
		t.Fatalf("only %d workers: the test never split leaves", len(model))
	}
}

// Get reads without a lock while a writer commits (go test -race checks
// the reads against the writes): a reader sees a record that was current
// at some point, never a torn or foreign one, and once the writer is done,
// the last.
func TestGetWhileCommitting(t *testing.T) {
	r := New("e", 0)
	const workers = 300
	id := func(i int) string { return fmt.Sprintf("w-%03d", i) }
	done := make(chan struct{})
	go func() {
		defer close(done)
		for round := range 60 {
			r.Update(func(tx *Txn) error {
				for i := range workers {
					switch old := tx.Get(id(i)); {
					case old == nil:
						tx.Insert(&Worker{Registered: Registered{ID: id(i), Spec: &smgv1.WorkerSpec{Url: "http://" + id(i)}}})
					case (i+round)%7 == 0:
						tx.Delete(id(i))
					default:
						c := old.Clone()
						c.LoadRevision = uint64(round)
						tx.Insert(c)
					}
				}
				return nil
			})
		}
	}()
	for reading := true; reading; {
		select {
		case <-done:
			reading = false
		default:
		}
		for i := range workers {
			if w := r.Get(id(i)); w != nil && w.ID != id(i) {
				t.Fatalf("Get(%s) returned %s", id(i), w.ID)
			}
		}
	}
	snap := r.Snapshot()
	for i := range workers {
		if got, want := r.Get(id(i)), snap.Get(id(i)); got != want {
			t.Fatalf("after the writer: Get(%s) = %p, the snapshot holds %p", id(i), got, want)
		}
	}
	key, seen := id(1), 0
	if n := testing.AllocsPerRun(100, func() {
		if r.Get(key) != nil {
			seen++
		}
	}); n != 0 {
		t.Fatalf("Get costs %v allocations, want 0", n)
	}
}

// Jobs live in a table of their own, copied on write as the workers are:
// a snapshot keeps the jobs it held, an aborted transaction writes none,
// and a transaction reads its own writes.
func TestJobsFollowTransactionsAndSnapshotsStay(t *testing.T) {
	r := New("e", 0)
	put := func(ids ...string) {
		r.Update(func(tx *Txn) error {
			for _, id := range ids {
				tx.PutJob(&Job{WorkerID: id})
			}
			return nil
		})
	}
	put("b", "a", "c")
	before := r.Snapshot()
	r.Update(func(tx *Txn) error {
		tx.DeleteJob("a")
		tx.PutJob(&Job{WorkerID: "d"})
		if tx.Job("a") != nil || tx.Job("d") == nil {
			t.Fatal("a transaction does not read its own job writes")
		}
		return errors.New("abort")
	})
	if got := r.Snapshot().Jobs(); len(got) != 3 || r.Snapshot().Job("d") != nil {
		t.Fatalf("after an aborted transaction: %d jobs", len(got))
	}
	r.Update(func(tx *Txn) error { tx.DeleteJob("a"); tx.DeleteJob("none"); return nil })
	var ids []string
	for _, j := range before.Jobs() {
		ids = append(ids, j.WorkerID)
	}
	if !slices.Equal(ids, []string{"a", "b", "c"}) || before.Job("a") == nil {
		t.Fatalf("an older snapshot's jobs = %v, want a, b, c (ordered by worker id)", ids)
	}
	if got := r.Snapshot().Jobs(); len(got) != 2 || r.Snapshot().Job("a") != nil {
		t.Fatalf("after deleting a: %d jobs", len(got))
	}
}
