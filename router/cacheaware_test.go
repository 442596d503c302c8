package router

import (
	"fmt"
	"strings"
	"testing"
)

// cache_aware keeps a prompt (and its longer continuations) on the worker that
// served its prefix, drops that affinity when the worker's KV cache is hot or
// the load is out of balance, and never keeps it on a vetoed worker.
func TestCacheAwareAffinity(t *testing.T) {
	h := newHarness(t, nil)
	engines := []*engine{newEngine(t, "a", nil), newEngine(t, "b", nil), newEngine(t, "c", nil)}
	fleet := func(mutate func(*Worker)) []Worker {
		var ws []Worker
		for _, e := range engines {
			w := e.worker()
			mutate(&w)
			ws = append(ws, w)
		}
		return ws
	}
	h.apply(fleet(func(*Worker) {})...)
	system := strings.Repeat("You are a careful assistant. ", 20)
	home := h.post(testModel, "", system+"turn 1").servedBy()
	for turn := 2; turn < 8; turn++ {
		if got := h.post(testModel, "", system+fmt.Sprintf("turn %d", turn)).servedBy(); got != home {
			t.Fatalf("turn %d left the cached worker %s for %s", turn, home, got)
		}
	}

	// Hot KV cache on the cached worker: affinity is dropped for that decision.
	h.apply(fleet(func(w *Worker) {
		if w.ID == home {
			w.TokenUsage = 0.97
			w.Waiting = 1 // slightly busier, so least load does not pick it back by a tie
			w.LoadRevision = 1
		}
	})...)
	if got := h.post(testModel, "", system+"turn hot").servedBy(); got == home {
		t.Fatal("affinity kept on a worker whose KV cache is hot")
	}

	// Vetoed cached worker: the prompt goes elsewhere.
	h.apply(fleet(func(w *Worker) {
		w.LoadRevision = 2
		if w.ID == home {
			w.Veto = VetoOverload
		}
	})...)
	if got := h.post(testModel, "", system+"turn vetoed").servedBy(); got == home {
		t.Fatal("affinity kept on a vetoed worker")
	}

	// Out of balance: least load wins over affinity.
	h.apply(fleet(func(w *Worker) {
		w.LoadRevision = 3
		if w.ID == home {
			w.Waiting = 500
		}
	})...)
	if got := h.post(testModel, "", system+"turn busy").servedBy(); got == home {
		t.Fatal("affinity kept on a worker far busier than the rest")
	}
}
