package supervise

import (
	"context"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/smg-project/smg/internal/backoff"
	"github.com/smg-project/smg/internal/testutil"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testutil.WaitFor(t, 20*time.Second, what, func() (bool, string) { return cond(), "" })
}

// alive reports whether pid is a live process (a zombie is not: a child
// reparented to a PID 1 that does not reap stays one).
func alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(stat), ") ")
	return !strings.HasPrefix(rest, "Z")
}

// A child that exits is started again, its output prefixed line by line; a
// stop ends Run.
func TestExitedChildIsRestartedWithPrefixedOutput(t *testing.T) {
	var out testutil.SyncBuffer
	var mu sync.Mutex
	var pids []int
	p := &Process{
		Name: "e0", Path: "/bin/sh", Args: []string{"-c", "echo started; echo oops >&2; exit 3"},
		Output: &out, StopGrace: time.Second,
		Restart: backoff.Policy{Initial: time.Millisecond, Max: 5 * time.Millisecond},
		Started: func(pid int) { mu.Lock(); pids = append(pids, pid); mu.Unlock() },
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx, quiet()) }()
	waitUntil(t, "three starts", func() bool { mu.Lock(); defer mu.Unlock(); return len(pids) >= 3 })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	text := out.String()
	if strings.Count(text, "[e0] started\n") < 2 || !strings.Contains(text, "[e0] oops\n") {
		t.Errorf("output not prefixed line by line:\n%s", text)
	}
	for _, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		if !strings.HasPrefix(line, "[e0] ") {
			t.Errorf("line without prefix: %q", line)
		}
	}
}

// A child that ignores SIGTERM is killed after its grace, with the process it
// forked (the whole process group).
func TestStopKillsTheProcessGroupAfterGrace(t *testing.T) {
	var out testutil.SyncBuffer
	pid := make(chan int, 1)
	p := &Process{
		Name: "e1", Path: "/bin/sh", Args: []string{"-c", "trap '' TERM; sleep 300 & echo child $!; wait"},
		Output: &out, StopGrace: 100 * time.Millisecond, Started: func(p int) { pid <- p },
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx, quiet()) }()
	parent := <-pid
	waitUntil(t, "the child's pid", func() bool { return strings.Contains(out.String(), "child ") })
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the grace")
	}
	if alive(parent) {
		t.Errorf("the engine (pid %d) is still alive", parent)
	}
	var child int
	for _, f := range strings.Fields(out.String()) {
		if n, err := strconv.Atoi(f); err == nil {
			child = n
		}
	}
	if child == 0 {
		t.Fatalf("no child pid in %q", out.String())
	}
	waitUntil(t, "the forked child to be gone", func() bool { return !alive(child) })
}

// A child that cannot be started at all is an error, not a restart loop.
func TestMissingExecutableIsAnError(t *testing.T) {
	p := &Process{Name: "e2", Path: "/nonexistent/engine", Output: io.Discard, StopGrace: time.Second}
	err := p.Run(context.Background(), quiet())
	if err == nil || !strings.Contains(err.Error(), "e2") || !strings.Contains(err.Error(), "/nonexistent/engine") {
		t.Fatalf("Run = %v, want an error naming the engine and its path", err)
	}
}
