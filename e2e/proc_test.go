package e2e

import (
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/smg-project/smg/internal/testutil"
)

// proc is one running smg process (internal/testutil's harness), with the
// names the e2e tests use.
type proc struct {
	*testutil.Proc
	t      *testing.T
	name   string
	args   []string
	cmd    *exec.Cmd
	stderr interface{ String() string }
	exited <-chan struct{}
}

// startSMG runs `smg args...` and kills it when the test ends. On failure the
// tail of its stderr is logged; a data race report in it fails the test.
func startSMG(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	p := testutil.StartT(t, name, smgBin, args...)
	return &proc{Proc: p, t: t, name: name, args: args, cmd: p.Cmd, stderr: logView{p}, exited: p.Done()}
}

// logView reads a process's stderr so far.
type logView struct{ p *testutil.Proc }

func (l logView) String() string { return l.p.Log() }

// kill ends the process with SIGKILL and waits for it; it is idempotent.
func (p *proc) kill() { p.Kill() }

// exitedEarly reports whether the process has already died.
func (p *proc) exitedEarly() bool { return p.Exited() }

// lines reads n lines of stdout within timeout.
func (p *proc) lines(n int, timeout time.Duration) []string {
	p.t.Helper()
	return p.LinesT(p.t, n, timeout)
}

// startSims serves count simulated engines on free ports and returns their URLs.
func startSims(t *testing.T, count int, extra ...string) []string {
	t.Helper()
	args := append([]string{"sim", "--count", strconv.Itoa(count), "--port", "0", "--log-level", "warn"}, extra...)
	p := startSMG(t, "sim", args...)
	urls := p.lines(count, 20*time.Second)
	for i, u := range urls {
		if !strings.HasPrefix(u, "http://") {
			t.Fatalf("sim line %d is not a URL: %q", i, u)
		}
	}
	return urls
}

// freePort, waitFor and tail are the harness's.
var (
	freePort = func(t *testing.T) int { t.Helper(); return testutil.FreePort(t) }
	waitFor  = func(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
		t.Helper()
		testutil.WaitFor(t, timeout, what, cond)
	}
	tail = testutil.Tail
)

// argsf splits a format into arguments after filling it in, for readable
// command lines in tests.
func argsf(format string, a ...any) []string {
	return strings.Fields(fmt.Sprintf(format, a...))
}
