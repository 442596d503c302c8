package evidence

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// Many agent streams push records for their own workers while flushes,
// predictions against the stored records and the drop of cells run, and
// workers of another set come and go: each worker ends with the evidence, verdict and veto transitions
// of a tracker that committed its records one by one in order (a record
// lost, applied twice after a later one, or out of order would show), and
// no cell is left for a removed worker. Run with -race.
func TestConcurrentPushesApplyEachRecordOnceInOrder(t *testing.T) {
	const pushers, perPusher, messages = 8, 8, 150
	ids := make([]string, pushers*perPusher)
	for i := range ids {
		ids[i] = fmt.Sprint("w", i)
	}
	tr, reg := openHealthy(t, ids, true)
	replay, replayReg := openHealthy(t, ids, false)

	// Each worker's records: some flip a verdict (engine silence with a
	// per-step wire), the next may clear it.
	rng := rand.New(rand.NewPCG(1, 2))
	recs := make([][]judge.Record, len(ids))
	for w := range ids {
		recs[w] = make([]judge.Record, messages)
		for k := range recs[w] {
			recs[w][k] = judge.Record{Pushed: true, Waiting: int64(k), StepWire: rng.IntN(4) != 0, Idle: rng.IntN(2) == 0,
				Silence: time.Duration(rng.IntN(4)) * 1500 * time.Millisecond}
		}
	}
	at := func(k int) time.Time { return t0.Add(time.Duration(k) * 10 * time.Millisecond) }

	churn := []string{"gone1", "gone2"}
	var pushing sync.WaitGroup
	var done atomic.Bool
	var bg sync.WaitGroup
	loop := func(f func()) {
		bg.Go(func() {
			for !done.Load() {
				f()
				runtime.Gosched()
			}
		})
	}
	for g := range pushers {
		pushing.Go(func() {
			batch := make([]Observed, perPusher)
			for k := range messages {
				for i := range batch {
					w := g*perPusher + i
					batch[i] = Observed{WorkerID: ids[w], Rec: recs[w][k]}
				}
				tr.ObserveAll(batch, at(k), nil)
			}
		})
	}
	loop(tr.Flush)
	loop(tr.Flush)
	loop(func() { // what a flip's commit asks after it (a whole sweep would move verdicts)
		for _, w := range reg.Snapshot().Workers() {
			if c := tr.cell(w.ID); c != nil {
				c.stands(w, &tr.rules)
			}
		}
	})
	loop(func() { // workers that come and go, and push meanwhile
		for _, id := range churn {
			addWorker(t, reg, id)
			tr.Record(id, judge.Record{Pushed: true}, t0)
			removeWorker(t, reg, id)
			tr.Record(id, judge.Record{Pushed: true}, t0)
		}
	})
	pushing.Wait()
	done.Store(true)
	bg.Wait()
	tr.Flush()

	for w, id := range ids {
		for k, rec := range recs[w] {
			replay.Record(id, rec, at(k))
		}
	}
	transitions := 0
	for _, id := range ids {
		if err := sameWorker(reg.Get(id), replayReg.Get(id)); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		for _, reason := range []string{"unreachable", "wedged"} {
			got := testutil.ToFloat64(tr.transitions.WithLabelValues("http://"+id, reason))
			want := testutil.ToFloat64(replay.transitions.WithLabelValues("http://"+id, reason))
			if got != want {
				t.Fatalf("%s: %v %s transitions, want %v as the records committed one by one", id, got, reason, want)
			}
			transitions += int(want)
		}
	}
	if transitions == 0 {
		t.Fatal("no record vetoed a worker: the test does not cover records that commit at once")
	}
	tr.Sweep(t0) // drops what the churn left
	if pending := pendingIDs(tr); len(pending) != 0 {
		t.Fatalf("records still pending after the last flush: %v", pending)
	}
	for _, id := range churn {
		if tr.cell(id) != nil {
			t.Fatalf("a cell left for the removed worker %s", id)
		}
	}
	if n := Cells(tr); n != len(ids) {
		t.Fatalf("%d cells listed, want one per pushing worker (%d)", n, len(ids))
	}
}

// A worker's pusher never waits for another worker's pending records: while
// w2's are held (its pusher or a flush taking them, delayed), records of w1
// pend, commit a verdict change, and are taken by a commit.
func TestAPushDoesNotWaitForAnotherWorkersRecords(t *testing.T) {
	tr, reg := openHealthy(t, []string{"w1", "w2"}, true)
	tr.Record("w2", judge.Record{Pushed: true}, t0)
	held := tr.cell("w2")
	held.lock.Lock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		tr.Record("w1", judge.Record{Pushed: true}, t0) // makes w1's cell
		tr.Record("w1", judge.Record{Pushed: true, Waiting: 1}, t0.Add(time.Millisecond))
		if !tr.cell("w1").pending() {
			t.Error("w1's records are not pending while w2's are held")
		}
		if err := tr.commit([]string{"w1"}, nil); err != nil {
			t.Error(err)
		}
		// A record that vetoes commits at once.
		tr.Record("w1", judge.Record{Pushed: true, StepWire: true, Silence: time.Hour}, t0.Add(2*time.Millisecond))
	}()
	select {
	case <-done:
	case <-time.After(time.Minute): // a watchdog, not a measure: done comes at once
		t.Fatal("w1's records waited for w2's")
	}
	held.lock.Unlock()
	w := reg.Get("w1")
	if !w.Evidence.PushedAt.Equal(t0.Add(2 * time.Millisecond)) {
		t.Fatalf("w1's PushedAt %v, want its last record's", w.Evidence.PushedAt)
	}
	if w.Liveness != smgv1.Veto_VETO_WEDGED {
		t.Fatalf("w1's veto %v, want wedged by its last record", w.Liveness)
	}
	if ids := pendingIDs(tr); !reflect.DeepEqual(ids, []string{"w2"}) {
		t.Fatalf("pending %v, want w2's record still", ids)
	}
}

// An unknown or unready worker gets no cell (a hostile agent may name any
// id), and a worker's cell goes at the sweep after it leaves the registry
// or Ready, with its records.
func TestCellsOnlyForReadyWorkers(t *testing.T) {
	tr, reg := openHealthy(t, []string{"w1", "w2", "w3"}, true)
	setHealth(t, reg, "w2", registry.HealthUnhealthy)
	for _, id := range []string{"nobody", "w1", "w2", "w3"} {
		tr.Record(id, judge.Record{Pushed: true}, t0)
	}
	if tr.cell("nobody") != nil || tr.cell("w2") != nil || Cells(tr) != 2 {
		t.Fatalf("%d cells: one made for an unknown or unready worker", Cells(tr))
	}
	removeWorker(t, reg, "w1")
	setHealth(t, reg, "w3", registry.HealthUnhealthy)
	tr.Sweep(t0)
	if tr.cell("w1") != nil || tr.cell("w3") != nil || Cells(tr) != 0 {
		t.Fatal("the cell of a worker removed or out of Ready is kept")
	}
	if ids := pendingIDs(tr); len(ids) != 0 {
		t.Fatalf("pending %v after the sweep", ids)
	}
	// Back in Ready: a new cell, without the old records.
	setHealth(t, reg, "w3", registry.HealthHealthy)
	tr.Record("w3", judge.Record{Pushed: true}, t0.Add(time.Second))
	if c := tr.cell("w3"); c == nil || !c.recorded || !c.rec.at.Equal(t0.Add(time.Second)) {
		t.Fatal("no new cell with the one new record for a worker back in Ready")
	}
}

// A flush walks every cell in id order, the ones made since the last flush
// too, and forgets the ones it drops: a worker back in Ready has its new
// cell's evidence stored by the next flush.
func TestFlushWalksEveryCellInIDOrder(t *testing.T) {
	tr, reg := openHealthy(t, []string{"w3", "w1", "w2"}, true)
	for _, id := range []string{"w3", "w1", "w2"} {
		tr.Record(id, judge.Record{Pushed: true}, t0)
	}
	tr.Flush()
	setHealth(t, reg, "w2", registry.HealthUnhealthy)
	tr.Flush() // drops w2's cell
	setHealth(t, reg, "w2", registry.HealthHealthy)
	at := t0.Add(time.Second)
	tr.Record("w2", judge.Record{Pushed: true}, at)
	if c := tr.cell("w2"); c == nil || !c.pending() {
		t.Fatal("w2's record back in Ready does not wait in a new cell")
	}
	tr.Flush()
	if got := reg.Get("w2").Evidence.PushedAt; !got.Equal(at) {
		t.Fatalf("w2 pushed at %v after the flush, want %v", got, at)
	}
	var ids []string
	for _, e := range tr.order {
		ids = append(ids, e.id)
	}
	if !reflect.DeepEqual(ids, []string{"w1", "w2", "w3"}) {
		t.Fatalf("the flush's cells %v, want w1, w2, w3", ids)
	}
}

func addWorker(t *testing.T, reg *registry.Registry, id string) {
	if _, err := reg.Update(func(txn *registry.Txn) error {
		txn.Insert(&registry.Worker{Registered: registry.Registered{ID: id, Spec: &smgv1.WorkerSpec{Url: "http://" + id}, Model: "m", Type: "regular"}, State: registry.State{Health: registry.HealthHealthy}})
		return nil
	}); err != nil {
		t.Error(err)
	}
}

func removeWorker(t *testing.T, reg *registry.Registry, id string) {
	if _, err := reg.Update(func(txn *registry.Txn) error {
		txn.Delete(id)
		return nil
	}); err != nil {
		t.Error(err)
	}
}

// pendingIDs lists the workers with evidence pending, sorted.
func pendingIDs(in *Inbox) []string {
	var ids []string
	in.cells.Range(func(id string, c *Slot) bool {
		if c.pending() {
			ids = append(ids, id)
		}
		return true
	})
	slices.Sort(ids)
	return ids
}
