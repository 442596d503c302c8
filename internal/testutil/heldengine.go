package testutil

import (
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
)

// HeldEngine is a real HTTP engine on loopback that holds every request
// until released (a slow engine: every request started before a release is
// open at once), and counts the connections open to it. Tests of how many
// probes or polls a schedule starts together read it.
type HeldEngine struct {
	*httptest.Server
	mu      sync.Mutex
	cond    *sync.Cond
	arrived int
	paths   map[string]bool
	open    int
	release chan struct{}
}

// NewHeldEngine starts one, closed when t ends; answer (nil: 200 and no
// body) answers each request once released.
func NewHeldEngine(t T, answer http.Handler) *HeldEngine {
	e := &HeldEngine{release: make(chan struct{}), paths: map[string]bool{}}
	e.cond = sync.NewCond(&e.mu)
	e.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		e.arrived++
		e.paths[r.URL.Path] = true
		rel := e.release
		e.cond.Broadcast()
		e.mu.Unlock()
		select {
		case <-rel:
			if answer != nil {
				answer.ServeHTTP(w, r)
			}
		case <-r.Context().Done():
		}
	}))
	e.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		e.mu.Lock()
		defer e.mu.Unlock()
		switch s {
		case http.StateNew:
			e.open++
		case http.StateClosed, http.StateHijacked:
			e.open--
		}
	}
	e.Start()
	t.Cleanup(e.Close)
	return e
}

// WaitArrived waits until n requests have arrived in all and returns the
// connections open then.
func (e *HeldEngine) WaitArrived(n int) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	for e.arrived < n {
		e.cond.Wait()
	}
	return e.open
}

// Paths is how many distinct paths were asked.
func (e *HeldEngine) Paths() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.paths)
}

// ReleaseAll answers every request held.
func (e *HeldEngine) ReleaseAll() {
	e.mu.Lock()
	defer e.mu.Unlock()
	close(e.release)
	e.release = make(chan struct{})
}

// PeakOpen runs steps (each starts requests to e and returns how many, and
// a wait for them to end), holds each step's requests until all have
// arrived, then releases them, and returns the most connections open at
// once.
func (e *HeldEngine) PeakOpen(steps int, step func(i int) (started int, wait func())) int {
	peak, total := 0, 0
	for i := range steps {
		n, wait := step(i)
		total += n
		peak = max(peak, e.WaitArrived(total))
		e.ReleaseAll()
		wait()
	}
	return peak
}

// CheckPeak asserts that all n workers were asked and that peak (from
// PeakOpen) is at most limit; allAtOnce (every worker started together, the
// behaviour spreading replaced) wants exactly n, so the measurement is seen
// to catch the burst it bounds.
func (e *HeldEngine) CheckPeak(t T, n, peak, limit int, allAtOnce bool) {
	t.Helper()
	if e.Paths() != n {
		t.Fatalf("%d workers asked in the first interval, want all %d", e.Paths(), n)
	}
	t.Logf("peak connections open at once: %d of %d workers", peak, n)
	if peak > limit || (allAtOnce && peak != n) {
		t.Fatalf("peak connections open at once %d, want at most %d", peak, limit)
	}
}
