package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// Two engines, each serving its own model with a running window of 2,
// behind `smg launch` with running windows and the priority scheduler: the
// scheduler's capacity is the sum of both windows, 4. A flood of long
// requests for model A must not take model B's rooms: B's short requests
// are admitted at once while A's backlog (several seconds deep) waits in
// the scheduler for A's own rooms, and A's requests still run two at a
// time on A's engine.
func TestOneModelsFloodTakesNoRoomOfAnother(t *testing.T) {
	t.Parallel()
	a := startSims(t, 1, "--flavor", "sglang", "--model", "model-a", "--max-running-requests", "2", "--itl-ms", "20")[0]
	b := startSims(t, 1, "--flavor", "sglang", "--model", "model-b", "--max-running-requests", "2", "--itl-ms", "5")[0]
	cfg := filepath.Join(t.TempDir(), "scheduler.yaml")
	if err := os.WriteFile(cfg, []byte("classes:\n  system: {reserved: 0}\n  interactive: {reserved: 0}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base, _ := startLaunch(t, "launch-models", []string{a, b}, "--worker-admission-window", "--worker-admission-queue", "0",
		"--priority-scheduler-enabled", "--priority-scheduler-config", cfg, "--disable-retries")
	adm := admin{base: base}
	adm.waitReady(t, a, b)
	waitFor(t, 20*time.Second, "both windows of 2 granted to the router", func() (bool, string) {
		ws, err := adm.workers()
		if err != nil {
			return false, err.Error()
		}
		for _, u := range []string{a, b} {
			if w := ws[u].Admission; w == nil || w.Window != 2 || len(w.Shares) != 1 {
				return false, fmt.Sprintf("%s: %+v", u, w)
			}
		}
		return true, ""
	})
	adm.waitRoutersApplied(t, 1)

	// A's flood: 10 requests of 150 tokens at 20 ms a token (3 s each) on
	// two rooms: about 15 s of backlog.
	var wg sync.WaitGroup
	floodErrs := make(chan error, 10)
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			floodErrs <- chatModel(base, "model-a", 150, true, 60*time.Second).completeStream()
		}()
	}
	waitFor(t, 10*time.Second, "model A's engine to run its window", func() (bool, string) {
		st := getSimStats(t, a, false)
		return st.Running == 2, "A not full yet"
	})
	time.Sleep(300 * time.Millisecond) // the rest of the flood reaches the router
	for i := range 3 {
		began := time.Now()
		if err := chatModel(base, "model-b", 8, true, 30*time.Second).completeStream(); err != nil {
			t.Fatalf("model B request %d: %v", i, err)
		}
		if d := time.Since(began); d > 2*time.Second {
			t.Errorf("model B request %d took %v behind model A's flood, want well under 2 s (B's engine is idle)", i, d)
		}
		if st := getSimStats(t, a, false); st.Running > 2 || st.Waiting > 0 {
			t.Errorf("model A's engine ran %d and queued %d: past its window of 2", st.Running, st.Waiting)
		}
	}
	wg.Wait()
	close(floodErrs)
	for err := range floodErrs {
		if err != nil {
			t.Errorf("model A request: %v", err)
		}
	}
}
