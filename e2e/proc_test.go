package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// proc is one running smg process.
type proc struct {
	t      *testing.T
	name   string
	args   []string
	cmd    *exec.Cmd
	stderr *lockedBuffer
	stdout chan string // stdout lines, closed at EOF
	exited chan struct{}
	once   sync.Once
}

// startSMG runs `smg args...` and kills it when the test ends. On failure the
// tail of its stderr is logged; a data race report in it fails the test.
func startSMG(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, name: name, args: args, stderr: &lockedBuffer{}, stdout: make(chan string, 64), exited: make(chan struct{})}
	p.cmd = exec.Command(smgBin, args...)
	p.cmd.Stderr = p.stderr
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		defer close(p.stdout)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case p.stdout <- sc.Text():
			default: // nobody reads more than the first lines
			}
		}
	}()
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		p.kill()
		log := p.stderr.String()
		if strings.Contains(log, "WARNING: DATA RACE") {
			t.Errorf("%s reported a data race:\n%s", name, tail(log, 8000))
		} else if t.Failed() {
			t.Logf("%s (smg %s) stderr tail:\n%s", name, strings.Join(args, " "), tail(log, 3000))
		}
	})
	return p
}

// kill ends the process with SIGKILL and waits for it; it is idempotent.
func (p *proc) kill() {
	p.once.Do(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
	})
}

// exitedEarly reports whether the process has already died.
func (p *proc) exitedEarly() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// lines reads n lines of stdout within timeout.
func (p *proc) lines(n int, timeout time.Duration) []string {
	p.t.Helper()
	var got []string
	deadline := time.After(timeout)
	for len(got) < n {
		select {
		case l, ok := <-p.stdout:
			if !ok {
				p.t.Fatalf("%s exited after %d of %d stdout lines; stderr:\n%s", p.name, len(got), n, tail(p.stderr.String(), 3000))
			}
			got = append(got, l)
		case <-deadline:
			p.t.Fatalf("%s printed %d of %d stdout lines in %s; stderr:\n%s", p.name, len(got), n, timeout, tail(p.stderr.String(), 3000))
		}
	}
	return got
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

// freePort returns a port that was free a moment ago. Another process may
// take it before ours binds: a small race the tests accept.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// waitFor polls cond every 50 ms until it holds or timeout passes; the last
// detail it returned explains a timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var detail string
	for {
		var ok bool
		ok, detail = cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s: %s", timeout, what, detail)
		}
		time.Sleep(50 * time.Millisecond) // polling interval, not an assertion
	}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

var _ io.Writer = (*lockedBuffer)(nil)

// argsf splits a format into arguments after filling it in, for readable
// command lines in tests.
func argsf(format string, a ...any) []string {
	return strings.Fields(fmt.Sprintf(format, a...))
}
