package evidence_test

import (
	"log/slog"
	"runtime"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/smg-project/smg/controlplane/evidence"
	"github.com/smg-project/smg/controlplane/registry"
)

func withHook(t *testing.T, hook func(in *evidence.Inbox)) (*evidence.Inbox, *registry.Registry) {
	t.Helper()
	_, reg := coalescing(t)
	in := evidence.New(reg, evidence.Options{Coalesce: true}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	evidence.InFlush(in, func() { hook(in) })
	return in, reg
}

// A flush transaction runs without the lock of any worker's pending state:
// reports go on while it stores the fleet (they stopped behind each of its
// transactions).
func TestReportsGoOnDuringAFlushTransaction(t *testing.T) {
	inTxn := 0
	in, reg := withHook(t, func(in *evidence.Inbox) {
		inTxn++
		if !evidence.Unlocked(in, "w1") {
			t.Fatal("the flush transaction holds w1's lock")
		}
		if err := in.Report("w1", load(2)); err != nil { // stands: pends
			t.Fatal(err)
		}
	})
	if err := in.Report("w1", load(1)); err != nil {
		t.Fatal(err)
	}
	in.Flush()
	if inTxn != 1 {
		t.Fatalf("%d flush transactions, want 1", inTxn)
	}
	if got := reg.Get("w1").Load.GetWaitingRequests(); got != 1 {
		t.Fatalf("stored waiting %d after the first flush, want the flushed 1", got)
	}
	in.Flush()
	if got := reg.Get("w1").Load.GetWaitingRequests(); got != 2 {
		t.Fatalf("stored waiting %d, want the report made during the transaction (2), stored by the next flush", got)
	}
}

// A report that flips the verdict while a flush transaction holds an older
// load of its worker commits after it, and the older load is not stored.
func TestAFlipDuringAFlushTransactionWins(t *testing.T) {
	done := make(chan error, 1)
	in, reg := withHook(t, func(in *evidence.Inbox) {
		// The flip makes its load the pending one and waits for the
		// registry, which this transaction holds.
		go func() { done <- in.Report("w1", load(20)) }()
		for evidence.PendingLoad(in, "w1").GetWaitingRequests() != 20 {
			runtime.Gosched()
		}
	})
	if err := in.Report("w1", load(1)); err != nil {
		t.Fatal(err)
	}
	in.Flush()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	w := reg.Get("w1")
	if got := w.Load.GetWaitingRequests(); got != 20 || !w.Overloaded {
		t.Fatalf("stored waiting %d overloaded %v, want the flip's 20 and overloaded", got, w.Overloaded)
	}
}

// A flush that flips a verdict (the thresholds moved since its load was
// judged) commits at once a newer load that came during its transaction
// and flips it back: that report was judged against the record before the
// flush, and would have committed at once against the one after it.
func TestAFlushFlipIsJudgedAgainstNewerLoads(t *testing.T) {
	in, reg := withHook(t, func(in *evidence.Inbox) {
		if err := in.Report("w1", load(1)); err != nil { // under 3: stands against the record before the flush
			t.Fatal(err)
		}
	})
	if err := in.Report("w1", load(5)); err != nil { // under the default 8: pends
		t.Fatal(err)
	}
	if _, err := reg.Update(func(tx *registry.Txn) error {
		c := tx.Get("w1").Clone()
		c.Thresholds.WaitingRequests = 3
		tx.Insert(c)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if reg.Get("w1").Overloaded {
		t.Fatal("overloaded before the flush")
	}
	in.Flush() // stores 5 >= 3: overloaded; then the newer 1 clears it
	w := reg.Get("w1")
	if got := w.Load.GetWaitingRequests(); got != 1 || w.Overloaded {
		t.Fatalf("after the flush: stored waiting %d overloaded %v, want the newer 1, not overloaded", got, w.Overloaded)
	}
}
