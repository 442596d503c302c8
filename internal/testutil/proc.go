// Package testutil is the one harness for tests and benchmarks that run real
// processes: build the smg binary once, start a process and read what it
// prints, wait for it to be ready, find free ports, and stop it when the test
// ends (with its output in the log when the test failed, and a data race it
// reported failing the test). The e2e suite, the deploy checks and the
// benchmark suite all use it.
//
// It does not import package testing, so the benchmark suite (linked into
// nothing but its own command) may use the process part too; test helpers take
// the small T interface, which *testing.T satisfies.
package testutil

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// T is the part of testing.TB the helpers use.
type T interface {
	Helper()
	Fatalf(format string, args ...any)
	Errorf(format string, args ...any)
	Logf(format string, args ...any)
	Cleanup(func())
	Failed() bool
}

// Options configure Start.
type Options struct {
	// OnLine, when set, sees every line the process prints, stdout and
	// stderr, as it arrives.
	OnLine func(line string)
	// Group starts the process in its own process group and kills the whole
	// group (children included) when it must be killed.
	Group bool
	// Env is added to this process's environment (KEY=value entries).
	Env []string
}

// maxLog bounds the stderr kept for failure reports.
const maxLog = 1 << 20

// Proc is a running child process.
type Proc struct {
	Name string
	Args []string
	Cmd  *exec.Cmd
	// Grace is how long Stop-at-cleanup waits after SIGTERM before it kills
	// the process (0: it is killed at once). Set it before the test ends.
	Grace time.Duration

	lines  chan string // stdout lines, closed at EOF; the first ones wait for Lines
	stderr SyncBuffer
	stdout SyncBuffer
	done   chan struct{}
	once   sync.Once
	group  bool
}

// Start runs bin with args. Its stdout lines are offered to Lines (the first
// 64 are buffered) and kept with Stdout; its stderr is kept (bounded) for Log.
func Start(name, bin string, args []string, opts Options) (*Proc, error) {
	p := &Proc{Name: name, Args: args, Cmd: exec.Command(bin, args...), lines: make(chan string, 64),
		done: make(chan struct{}), group: opts.Group}
	if len(opts.Env) > 0 {
		p.Cmd.Env = append(os.Environ(), opts.Env...)
	}
	if opts.Group {
		p.Cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	}
	out := &lineWriter{keep: &p.stdout, onLine: opts.OnLine, lines: p.lines}
	errw := &lineWriter{keep: &p.stderr, onLine: opts.OnLine}
	p.Cmd.Stdout, p.Cmd.Stderr = out, errw
	// A grandchild holding the output open must not keep us waiting once the
	// process itself has exited.
	p.Cmd.WaitDelay = time.Second
	if err := p.Cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		_ = p.Cmd.Wait()
		out.flush()
		errw.flush()
		close(p.lines)
		close(p.done)
	}()
	return p, nil
}

// Lines returns the next n stdout lines, or an error when the process ends
// or timeout passes first.
func (p *Proc) Lines(n int, timeout time.Duration) ([]string, error) {
	var got []string
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for len(got) < n {
		select {
		case l, ok := <-p.lines:
			if !ok {
				return got, fmt.Errorf("%s exited after %d of %d stdout lines; stderr:\n%s", p.Name, len(got), n, Tail(p.Log(), 3000))
			}
			got = append(got, l)
		case <-deadline.C:
			return got, fmt.Errorf("%s printed %d of %d stdout lines in %s; stderr:\n%s", p.Name, len(got), n, timeout, Tail(p.Log(), 3000))
		}
	}
	return got, nil
}

// Log returns what the process wrote to stderr so far (the last MiB).
func (p *Proc) Log() string { return p.stderr.String() }

// Stdout returns what the process wrote to stdout so far (the last MiB).
func (p *Proc) Stdout() string { return p.stdout.String() }

// Done is closed once the process has exited and its output is read.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Kill ends the process (its group with Options.Group) with SIGKILL and
// waits for it. It is idempotent and safe after the process exited.
func (p *Proc) Kill() {
	p.once.Do(func() {
		if p.group {
			_ = syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGKILL)
		}
		_ = p.Cmd.Process.Kill()
		<-p.done
	})
}

// Stop asks the process to end with sig and kills it if it has not ended
// within grace.
func (p *Proc) Stop(sig syscall.Signal, grace time.Duration) {
	if p == nil {
		return
	}
	if grace > 0 {
		_ = p.Cmd.Process.Signal(sig)
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-p.done:
			return
		case <-t.C:
		}
	}
	p.Kill()
}

// StartT is Start for a test: a failure to start fails the test, and when the
// test ends the process is stopped (SIGTERM and Grace, or killed at once), a
// data race it reported or a handler's panic it logged fails the test, and on
// failure the tail of its stderr is logged.
// handlerPanic starts what net/http's and the lean server's recovery log of
// a handler's panic (http.ErrAbortHandler is not logged).
const handlerPanic = "http: panic serving"

func StartT(t T, name, bin string, args ...string) *Proc {
	t.Helper()
	p, err := Start(name, bin, args, Options{})
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		p.Stop(syscall.SIGTERM, p.Grace)
		log := p.Log()
		if strings.Contains(log, "WARNING: DATA RACE") {
			t.Errorf("%s reported a data race:\n%s", name, Tail(log, 8000))
		} else if i := strings.Index(log, handlerPanic); i >= 0 {
			// A server recovers a handler's panic, so the process goes on,
			// maybe with a lock left held: name it rather than what follows.
			t.Errorf("%s: a handler panicked:\n%s", name, log[i:min(len(log), i+8000)])
		} else if t.Failed() {
			t.Logf("%s (%s) stderr tail:\n%s", name, strings.Join(args, " "), Tail(log, 3000))
		}
	})
	return p
}

// LinesT is Lines failing the test on an error.
func (p *Proc) LinesT(t T, n int, timeout time.Duration) []string {
	t.Helper()
	got, err := p.Lines(n, timeout)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return got
}

// lineWriter splits what a process writes into lines: each is kept, offered
// to onLine and, when lines is set, to that channel (without blocking).
type lineWriter struct {
	mu      sync.Mutex
	partial []byte
	keep    *SyncBuffer
	onLine  func(string)
	lines   chan string
}

func (w *lineWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.partial = append(w.partial, b...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		w.emit(string(w.partial[:i]))
		w.partial = w.partial[i+1:]
	}
	if len(w.partial) > maxLine { // a line without end: cut it
		w.emit(string(w.partial))
		w.partial = nil
	}
	return len(b), nil
}

// flush emits a last line without its newline.
func (w *lineWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.partial) > 0 {
		w.emit(string(w.partial))
		w.partial = nil
	}
}

func (w *lineWriter) emit(line string) {
	w.keep.writeBounded(line+"\n", maxLog)
	if w.onLine != nil {
		w.onLine(line)
	}
	if w.lines != nil {
		select {
		case w.lines <- line:
		default: // nobody reads that far
		}
	}
}

// maxLine bounds a line kept in memory before its end arrives.
const maxLine = 1 << 20

// SyncBuffer is a buffer safe for concurrent writers and readers.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// writeBounded appends text, dropping the oldest half once over limit.
func (s *SyncBuffer) writeBounded(text string, limit int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.b.Len()+len(text) > limit {
		keep := s.b.Bytes()[s.b.Len()/2:]
		rest := append([]byte(nil), keep...)
		s.b.Reset()
		s.b.Write(rest)
	}
	s.b.WriteString(text)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Tail returns the last n bytes of s, marked as cut when cut.
func Tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

// errNotYet is what WaitFor's adapter reports for a condition with no detail.
var errNotYet = errors.New("not yet")
