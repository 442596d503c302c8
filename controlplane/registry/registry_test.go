package registry_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

func worker(id, url string) *registry.Worker {
	return &registry.Worker{Registered: registry.Registered{ID: id, Spec: &smgv1.WorkerSpec{Url: url}}, State: registry.State{Health: registry.HealthPending}}
}

func insert(t *testing.T, r *registry.Registry, ws ...*registry.Worker) uint64 {
	t.Helper()
	rev, err := r.Update(func(tx *registry.Txn) error {
		for _, w := range ws {
			tx.Insert(w)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestUpdateCommitsOneRevisionAndNotifies(t *testing.T) {
	r := registry.New("e1", 0)
	if r.Epoch() != "e1" || r.Revision() != 0 {
		t.Fatalf("fresh registry: epoch %q revision %d", r.Epoch(), r.Revision())
	}
	ch := r.Changed()
	rev := insert(t, r, worker("a", "http://a"), worker("b", "http://b"))
	if rev != 1 || r.Revision() != 1 {
		t.Fatalf("revision = %d, want 1 for one transaction", rev)
	}
	if !closed(ch) {
		t.Fatal("Changed was not closed by the commit")
	}
	if w := r.Snapshot().Get("a"); w == nil || w.Revision != 1 {
		t.Fatalf("record revision = %+v, want 1", w)
	}
	if closed(r.Changed()) {
		t.Fatal("a fresh Changed channel is open until the next commit")
	}
}

func TestAbortedOrEmptyTransactionsCommitNothing(t *testing.T) {
	r := registry.New("e", 0)
	insert(t, r, worker("a", "http://a"))
	ch := r.Changed()
	boom := errors.New("boom")
	rev, err := r.Update(func(tx *registry.Txn) error {
		tx.Insert(worker("b", "http://b"))
		return boom
	})
	if !errors.Is(err, boom) || rev != 1 {
		t.Fatalf("aborted txn: rev %d err %v", rev, err)
	}
	if r.Snapshot().Get("b") != nil {
		t.Fatal("an aborted transaction left a record")
	}
	rev, err = r.Update(func(tx *registry.Txn) error { tx.PutJob(&registry.Job{WorkerID: "c", State: "pending"}); return nil })
	if err != nil || rev != 1 {
		t.Fatalf("job-only txn: rev %d err %v; jobs are not watched state", rev, err)
	}
	if r.Snapshot().Job("c") == nil {
		t.Fatal("the job was committed")
	}
	if closed(ch) {
		t.Fatal("no worker change, no notification")
	}
}

func TestSnapshotIsolation(t *testing.T) {
	r := registry.New("e", 0)
	insert(t, r, worker("a", "http://a"))
	snap := r.Snapshot()
	c := snap.Get("a").Clone()
	c.Health = registry.HealthHealthy
	insert(t, r, c, worker("b", "http://b"))
	if snap.Get("a").Health != registry.HealthPending || snap.Get("b") != nil || snap.Revision != 1 {
		t.Fatal("a snapshot must not see later commits")
	}
	if got := r.Snapshot().Workers(); len(got) != 2 || got[0].ID != "a" || got[1].ID != "b" {
		t.Fatalf("Workers() = %v, want a, b ordered by id", got)
	}
}

func TestURLLookupFollowsInsertReplaceDelete(t *testing.T) {
	r := registry.New("e", 0)
	insert(t, r, worker("a", "http://a:1"))
	if w := r.Snapshot().GetByURL("http://a:1"); w == nil || w.ID != "a" {
		t.Fatalf("GetByURL = %v", w)
	}
	moved := r.Snapshot().Get("a").Clone()
	moved.Spec = &smgv1.WorkerSpec{Url: "http://a:2"}
	insert(t, r, moved)
	snap := r.Snapshot()
	if snap.GetByURL("http://a:1") != nil {
		t.Fatal("the old URL still resolves after the worker moved")
	}
	if w := snap.GetByURL("http://a:2"); w == nil || w.ID != "a" {
		t.Fatal("the new URL does not resolve")
	}
	if _, err := r.Update(func(tx *registry.Txn) error { tx.Delete("a"); return nil }); err != nil {
		t.Fatal(err)
	}
	if r.Snapshot().GetByURL("http://a:2") != nil || r.Snapshot().Get("a") != nil {
		t.Fatal("a deleted worker still resolves")
	}
}

func TestTxnReadsItsOwnWrites(t *testing.T) {
	r := registry.New("e", 0)
	insert(t, r, worker("a", "http://a"))
	_, err := r.Update(func(tx *registry.Txn) error {
		c := tx.Get("a").Clone()
		c.Health = registry.HealthHealthy
		tx.Insert(c)
		if tx.Get("a").Health != registry.HealthHealthy {
			return errors.New("Get after Insert does not see the insert")
		}
		tx.Delete("a")
		if tx.Get("a") != nil || tx.GetByURL("http://a") != nil {
			return errors.New("Get after Delete still sees the worker")
		}
		tx.Insert(worker("a", "http://a2"))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if w := r.Snapshot().GetByURL("http://a2"); w == nil || w.ID != "a" {
		t.Fatal("re-inserted worker not found by URL")
	}
}

func TestChangesSince(t *testing.T) {
	r := registry.New("e", 4)
	insert(t, r, worker("a", "http://a")) // rev 1
	insert(t, r, worker("b", "http://b")) // rev 2
	a := r.Snapshot().Get("a").Clone()
	a.AgentNode = "n1"
	insert(t, r, a)                                                                                  // rev 3
	if _, err := r.Update(func(tx *registry.Txn) error { tx.Delete("b"); return nil }); err != nil { // rev 4
		t.Fatal(err)
	}
	changes, cur, ok := r.ChangesSince(1)
	if !ok || cur != 4 {
		t.Fatalf("ok %v cur %d", ok, cur)
	}
	want := []registry.Change{{Revision: 4, WorkerID: "b", Deleted: true}, {Revision: 3, WorkerID: "a", LoadOnly: true}} // the agent node alone
	if fmt.Sprint(changes) != fmt.Sprint(want) && fmt.Sprint(changes) != fmt.Sprint([]registry.Change{want[1], want[0]}) {
		t.Fatalf("changes since 1 = %v, want each worker once with its latest change: %v", changes, want)
	}
	if changes, _, ok := r.ChangesSince(4); !ok || len(changes) != 0 {
		t.Fatalf("up to date: %v %v", changes, ok)
	}
	if _, _, ok := r.ChangesSince(5); ok {
		t.Fatal("a revision from the future (another epoch) must ask for a snapshot")
	}
	insert(t, r, worker("c", "http://c")) // rev 5 evicts rev 1
	if _, _, ok := r.ChangesSince(0); ok {
		t.Fatal("revision 0 predates the retained history")
	}
	if changes, _, ok := r.ChangesSince(1); !ok || len(changes) != 3 {
		t.Fatalf("since 1 after eviction of rev 1: %v %v", changes, ok)
	}
}

func TestChangesSinceMultiWorkerRevisionPartlyEvicted(t *testing.T) {
	r := registry.New("e", 2)
	insert(t, r, worker("a", "http://a"), worker("b", "http://b")) // rev 1, two changes
	insert(t, r, worker("c", "http://c"))                          // rev 2 evicts half of rev 1
	if _, _, ok := r.ChangesSince(0); ok {
		t.Fatal("half of revision 1 is gone: a resume from 0 must get a snapshot")
	}
	if changes, _, ok := r.ChangesSince(1); !ok || len(changes) != 1 || changes[0].WorkerID != "c" {
		t.Fatalf("since 1: %v %v", changes, ok)
	}
}

func TestVetoPrecedence(t *testing.T) {
	w := worker("a", "http://a")
	if v, _ := w.Veto(); v != smgv1.Veto_VETO_UNSPECIFIED {
		t.Fatalf("no veto: %v", v)
	}
	w.Overloaded, w.OverloadReason = true, "waiting_requests 9 >= 8"
	if v, why := w.Veto(); v != smgv1.Veto_VETO_OVERLOAD || why != w.OverloadReason {
		t.Fatalf("overload: %v %q", v, why)
	}
	w.Liveness, w.LivenessReason = smgv1.Veto_VETO_WEDGED, "no progress"
	if v, _ := w.Veto(); v != smgv1.Veto_VETO_WEDGED {
		t.Fatalf("liveness outranks overload: %v", v)
	}
}

func TestMembershipChangedIgnoresLoadAndVerdicts(t *testing.T) {
	reg := registry.New("e", 0)
	members := reg.MembershipChanged()
	if _, err := reg.Update(func(txn *registry.Txn) error {
		txn.Insert(&registry.Worker{Registered: registry.Registered{ID: "w1", Spec: &smgv1.WorkerSpec{Url: "http://w1"}}, State: registry.State{Health: registry.HealthPending}})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-members:
	default:
		t.Fatal("adding a worker did not signal membership")
	}
	members = reg.MembershipChanged()
	update := func(fn func(w *registry.Worker)) {
		t.Helper()
		if _, err := reg.Update(func(txn *registry.Txn) error {
			c := txn.Get("w1").Clone()
			fn(c)
			txn.Insert(c)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	update(func(w *registry.Worker) {
		w.Load = &smgv1.EngineLoad{WaitingRequests: 3}
		w.LoadRevision++
		w.Overloaded = true
	})
	select {
	case <-members:
		t.Fatal("a load report signalled membership")
	default:
	}
	update(func(w *registry.Worker) { w.Health = registry.HealthHealthy })
	select {
	case <-members:
	default:
		t.Fatal("a health change did not signal membership")
	}
	members = reg.MembershipChanged()
	if _, err := reg.Update(func(txn *registry.Txn) error { txn.Delete("w1"); return nil }); err != nil {
		t.Fatal(err)
	}
	select {
	case <-members:
	default:
		t.Fatal("removing a worker did not signal membership")
	}
}

// A change to the load report alone is LoadOnly; any other field is a
// routing change, and a worker's merged change is LoadOnly only if all were.
// Routing changes are retained apart, so a flood of load reports does not
// push them out of reach.
func TestRoutingChangesSince(t *testing.T) {
	r := registry.New("e", 4)
	insert(t, r, worker("a", "http://a"), worker("b", "http://b")) // rev 1
	load := func(id string, waiting int32) uint64 {
		t.Helper()
		c := r.Snapshot().Get(id).Clone()
		c.Load = &smgv1.EngineLoad{WaitingRequests: waiting}
		c.LoadRevision++
		return insert(t, r, c)
	}
	flip := func(id string) uint64 { // a routing change: contact after a failure
		t.Helper()
		c := r.Snapshot().Get(id).Clone()
		c.ContactSeq++
		return insert(t, r, c)
	}
	load("a", 1)       // rev 2
	fl := flip("b")    // rev 3
	load("b", 2)       // rev 4
	for i := range 6 { // revs 5-10: more load reports than history holds
		load("a", int32(i))
	}
	if _, _, ok := r.ChangesSince(2); ok {
		t.Fatal("ChangesSince(2) after 8 changes in a history of 4: want ok=false")
	}
	changes, cur, ok := r.RoutingChangesSince(2)
	if !ok || cur != 10 || len(changes) != 1 || changes[0] != (registry.Change{Revision: fl, WorkerID: "b"}) {
		t.Fatalf("RoutingChangesSince(2) = %v %d %v, want only b's flip at %d", changes, cur, ok, fl)
	}
	if changes, _, ok := r.RoutingChangesSince(fl); !ok || len(changes) != 0 {
		t.Fatalf("RoutingChangesSince(flip) = %v %v, want none: only loads since", changes, ok)
	}
	changes, _, _ = r.ChangesSince(8)
	if len(changes) != 1 || !changes[0].LoadOnly {
		t.Fatalf("ChangesSince(8) = %v, want a's load alone, LoadOnly", changes)
	}
	// A load and a flip of one worker merge into a routing change.
	load("b", 3)
	flip("b")
	changes, _, _ = r.ChangesSince(10)
	if len(changes) != 1 || changes[0].LoadOnly {
		t.Fatalf("ChangesSince(10) = %v, want b once, not LoadOnly", changes)
	}
}

// A transaction changing many workers (a flush) records each once, latest
// state wins, past the size at which changes are indexed.
func TestBulkTransactionMarksEachWorkerOnce(t *testing.T) {
	r := registry.New("e", 0)
	var ws []*registry.Worker
	for i := range 100 {
		ws = append(ws, worker(fmt.Sprintf("w%03d", i), fmt.Sprintf("http://w%03d", i)))
	}
	insert(t, r, ws...)
	rev, err := r.Update(func(tx *registry.Txn) error {
		for round := range 2 {
			for _, w := range ws {
				c := tx.Get(w.ID).Clone()
				c.LoadRevision++
				if round == 1 && w.ID == "w050" {
					c.ContactSeq++ // a routing change merged into load changes
				}
				tx.Insert(c)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	changes, _, _ := r.ChangesSince(rev - 1)
	if len(changes) != 100 {
		t.Fatalf("%d changes, want 100 (each worker once)", len(changes))
	}
	for _, c := range changes {
		if c.LoadOnly != (c.WorkerID != "w050") {
			t.Fatalf("%v: only w050 carries a routing change", c)
		}
	}
}

// A transaction's bookkeeping is reused by the next, and dropped after one
// larger than it keeps (a rebuild of the whole fleet): transactions of
// every size after it commit exactly their own changes and read their own
// writes.
func TestBookkeepingAfterAWholeFleetTransaction(t *testing.T) {
	r := registry.New("e", 10000)
	var ws []*registry.Worker
	for i := range 5000 {
		ws = append(ws, worker(fmt.Sprintf("w%04d", i), fmt.Sprintf("http://w%04d", i)))
	}
	for _, n := range []int{5000, 1, 20, 5000, 3} {
		rev, err := r.Update(func(tx *registry.Txn) error {
			for _, w := range ws[:n] {
				c := w // the first time
				if old := tx.Get(w.ID); old != nil {
					c = old.Clone()
				}
				c.LoadRevision++
				tx.Insert(c)
				if tx.Get(w.ID) != c {
					t.Fatalf("%d workers: the transaction does not read its write of %s", n, w.ID)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		changes, _, ok := r.ChangesSince(rev - 1)
		if !ok || len(changes) != n {
			t.Fatalf("%d workers written: %d changes (ok %v)", n, len(changes), ok)
		}
		for i, c := range changes {
			if c.WorkerID != ws[i].ID || c.Revision != rev {
				t.Fatalf("%d workers written: change %d is %+v, want %s at %d", n, i, c, ws[i].ID, rev)
			}
		}
	}
}

// RoutingChanged wakes on a routing change, not on a load report alone.
func TestRoutingChangedIgnoresLoads(t *testing.T) {
	r := registry.New("e", 0)
	insert(t, r, worker("a", "http://a"))
	ch := r.RoutingChanged()
	c := r.Snapshot().Get("a").Clone()
	c.Load = &smgv1.EngineLoad{WaitingRequests: 3}
	c.LoadRevision++
	insert(t, r, c)
	select {
	case <-ch:
		t.Fatal("RoutingChanged closed by a load report alone")
	default:
	}
	c = r.Snapshot().Get("a").Clone()
	c.ContactSeq++
	insert(t, r, c)
	select {
	case <-ch:
	default:
		t.Fatal("RoutingChanged not closed by a routing change")
	}
}

// Get reads a map kept beside the tables: after any mix of inserts,
// deletes and aborted transactions it returns exactly what a snapshot holds.
func TestGetIsTheCommittedRecord(t *testing.T) {
	r := registry.New("e", 0)
	ids := []string{"a", "b", "c", "d"}
	check := func(step int) {
		t.Helper()
		s := r.Snapshot()
		for _, id := range ids {
			if got, want := r.Get(id), s.Get(id); got != want {
				t.Fatalf("step %d: Get(%q) = %v, the snapshot holds %v", step, id, got, want)
			}
		}
	}
	boom := errors.New("abort")
	for step := range 200 {
		id := ids[step%len(ids)]
		var err error
		switch step % 5 {
		case 0, 1: // a write, visible or evidence only
			_, err = r.Update(func(tx *registry.Txn) error {
				w := tx.Get(id)
				if w == nil {
					w = worker(id, "http://"+id)
				}
				c := w.Clone()
				c.Evidence.ProbePasses++
				if step%3 == 0 {
					c.Health = registry.HealthHealthy
				}
				tx.Insert(c)
				return nil
			})
		case 2: // deleted, then back in the same transaction
			_, err = r.Update(func(tx *registry.Txn) error {
				tx.Delete(id)
				tx.Insert(worker(id, "http://"+id+"/again"))
				return nil
			})
		case 3:
			_, err = r.Update(func(tx *registry.Txn) error { tx.Delete(id); return nil })
		case 4: // aborted: nothing of it may show
			_, err = r.Update(func(tx *registry.Txn) error {
				tx.Insert(worker(id, "http://"+id+"/aborted"))
				return boom
			})
			if !errors.Is(err, boom) {
				t.Fatalf("aborted update returned %v", err)
			}
			err = nil
		}
		if err != nil {
			t.Fatal(err)
		}
		check(step)
	}
}

// TestReadersDoNotWaitForWriters: while a write transaction runs, every read
// (snapshot, revision, epoch, wake-up channels, change history) returns at
// once with the last commit's state; a thousand watch streams reading behind
// a long flush convoyed the whole control plane (make bench-scale). The
// commit then publishes its view before it wakes anyone.
func TestReadersDoNotWaitForWriters(t *testing.T) {
	r := registry.New("e", 0)
	rev := insert(t, r, worker("a", "http://a"))
	inside, release := make(chan struct{}), make(chan struct{})
	done := make(chan uint64)
	go func() {
		rev, err := r.Update(func(tx *registry.Txn) error {
			tx.Insert(worker("b", "http://b"))
			close(inside)
			<-release
			return nil
		})
		if err != nil {
			t.Error(err)
		}
		done <- rev
	}()
	<-inside // the writer holds its transaction open: none of these may block
	snap := r.Snapshot()
	if snap.Revision != rev || snap.Get("b") != nil || snap.Get("a") == nil || r.Revision() != rev || r.Epoch() != "e" {
		t.Fatalf("during the write: snapshot at %d with b %v, revision %d: want the last commit (%d) only", snap.Revision, snap.Get("b"), r.Revision(), rev)
	}
	if changes, cur, ok := r.ChangesSince(rev - 1); !ok || cur != rev || len(changes) != 1 {
		t.Fatalf("ChangesSince during the write: %v %d %v", changes, cur, ok)
	}
	changed, routed := r.Changed(), r.RoutingChanged()
	close(release)
	next := <-done
	<-changed // closed by the commit, after the view was published:
	<-routed
	if s := r.Snapshot(); s.Revision != next || s.Get("b") == nil {
		t.Fatalf("after the commit: snapshot at %d, b %v; want %d with b", s.Revision, s.Get("b"), next)
	}
}

// TestInvisibleChangePublished: a commit that changes only evidence (no new
// revision) still reaches readers.
func TestInvisibleChangePublished(t *testing.T) {
	r := registry.New("e", 0)
	rev := insert(t, r, worker("a", "http://a"))
	w := r.Snapshot().Get("a").Clone()
	w.Evidence.NoReport = true
	if got := insert(t, r, w); got != rev {
		t.Fatalf("revision %d after an evidence-only change, want %d", got, rev)
	}
	if s := r.Snapshot(); s.Revision != rev || !s.Get("a").Evidence.NoReport {
		t.Fatalf("snapshot at %d misses the evidence", s.Revision)
	}
}
