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

// --balance-token-usage-threshold sets the KV usage at which cache_aware
// drops a prompt's affinity: a cached worker at 0.6 keeps the prompt under
// the default (0.95) and loses it under 0.5.
func TestBalanceTokenUsageThreshold(t *testing.T) {
	for _, tc := range []struct {
		threshold float64 // 0: the default
		keep      bool
	}{{0, true}, {0.5, false}, {0.6, false}, {0.61, true}} {
		t.Run(fmt.Sprint(tc.threshold), func(t *testing.T) {
			h := newHarness(t, func(o *Options) {
				if tc.threshold > 0 {
					o.BalanceTokenUsageThreshold = tc.threshold
				}
			})
			engines := []*engine{newEngine(t, "a", nil), newEngine(t, "b", nil)}
			system := strings.Repeat("You are a careful assistant. ", 20)
			h.apply(engines[0].worker(), engines[1].worker())
			home := h.post(testModel, "", system+"turn 1").servedBy()
			var ws []Worker
			for _, e := range engines {
				w := e.worker(func(w *Worker) { w.LoadRevision = 1 })
				if w.ID == home {
					w.TokenUsage, w.Waiting = 0.6, 1 // busier, so least load alone would not pick it
				}
				ws = append(ws, w)
			}
			h.apply(ws...)
			if kept := h.post(testModel, "", system+"turn 2").servedBy() == home; kept != tc.keep {
				t.Fatalf("affinity kept = %v at KV usage 0.6, want %v", kept, tc.keep)
			}
		})
	}
}
