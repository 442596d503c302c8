package testutil

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// sh runs a shell script as the child process.
func sh(t *testing.T, script string, opts Options) *Proc {
	t.Helper()
	p, err := Start("sh", "/bin/sh", []string{"-c", script}, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return p
}

func TestLinesLogAndOnLine(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	p := sh(t, `echo http://a; echo oops >&2; echo http://b; sleep 30`, Options{OnLine: func(l string) {
		mu.Lock()
		seen = append(seen, l)
		mu.Unlock()
	}})
	got, err := p.Lines(2, 10*time.Second)
	if err != nil || strings.Join(got, ",") != "http://a,http://b" {
		t.Fatalf("Lines = %v, %v", got, err)
	}
	WaitFor(t, 10*time.Second, "stderr kept", func() (bool, string) { return p.Log() == "oops\n", p.Log() })
	if p.Stdout() != "http://a\nhttp://b\n" {
		t.Fatalf("Stdout = %q", p.Stdout())
	}
	mu.Lock()
	n := len(seen)
	mu.Unlock()
	if n != 3 {
		t.Fatalf("OnLine saw %d lines, want 3", n)
	}
	if p.Exited() {
		t.Fatal("exited while sleeping")
	}
}

func TestLinesEndsWithTheProcess(t *testing.T) {
	p := sh(t, `echo one; echo bye >&2`, Options{})
	if got, err := p.Lines(2, 10*time.Second); err == nil || len(got) != 1 || !strings.Contains(err.Error(), "exited after 1 of 2") {
		t.Fatalf("Lines = %v, %v; want the exit reported", got, err)
	}
	<-p.Done()
	if !p.Exited() {
		t.Fatal("Exited false after Done")
	}
}

func TestStopSignalsThenKills(t *testing.T) {
	polite := sh(t, `trap 'exit 0' TERM; echo ready; while :; do sleep 0.05; done`, Options{})
	if _, err := polite.Lines(1, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	polite.Stop(syscall.SIGTERM, 10*time.Second)
	if code := polite.Cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("polite exit code %d, want 0 (it handled SIGTERM)", code)
	}
	stubborn := sh(t, `trap '' TERM; echo ready; while :; do sleep 0.05; done`, Options{Group: true})
	if _, err := stubborn.Lines(1, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	stubborn.Stop(syscall.SIGTERM, 100*time.Millisecond)
	if !stubborn.Exited() {
		t.Fatal("a process ignoring SIGTERM was not killed after the grace")
	}
	stubborn.Kill() // idempotent
}

// fakeT records what the helpers report.
type fakeT struct {
	mu       sync.Mutex
	cleanups []func()
	errors   []string
	logs     []string
	failed   bool
}

func (f *fakeT) Helper() {}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.Errorf(format, args...)
	panic("fatal")
}
func (f *fakeT) Errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errors, f.failed = append(f.errors, fmt.Sprintf(format, args...)), true
}
func (f *fakeT) Logf(format string, args ...any) {
	f.logs = append(f.logs, fmt.Sprintf(format, args...))
}
func (f *fakeT) Cleanup(fn func()) { f.cleanups = append(f.cleanups, fn) }
func (f *fakeT) Failed() bool      { return f.failed }
func (f *fakeT) end() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
}

// A child that reports a data race, or logs a handler's panic its server
// recovered, fails the test that started it.
func TestStartTFailsOnADataRaceOrAHandlerPanic(t *testing.T) {
	for _, c := range []struct{ line, want string }{
		{`WARNING: DATA RACE`, "reported a data race"},
		{`level=WARN msg=\"http: panic serving 127.0.0.1:1: boom\"`, "a handler panicked:\nhttp: panic serving 127.0.0.1:1: boom"},
	} {
		ft := &fakeT{}
		p := StartT(ft, "child", "/bin/sh", "-c", `echo "`+c.line+`" >&2; sleep 30`)
		WaitFor(t, 10*time.Second, "its report", func() (bool, string) { return p.Log() != "", p.Log() })
		ft.end()
		if !ft.failed || !strings.Contains(strings.Join(ft.errors, ""), c.want) {
			t.Fatalf("%s: errors %v: want %q", c.line, ft.errors, c.want)
		}
		if !p.Exited() {
			t.Fatal("cleanup did not stop the process")
		}
	}
}

func TestEventuallyTimesOutWithTheLastReason(t *testing.T) {
	ft := &fakeT{}
	func() {
		defer func() { _ = recover() }()
		WaitFor(ft, 120*time.Millisecond, "the impossible", func() (bool, string) { return false, "still no" })
	}()
	if len(ft.errors) != 1 || !strings.Contains(ft.errors[0], "the impossible: still no") {
		t.Fatalf("errors %v", ft.errors)
	}
	if port := FreePort(t); port <= 0 {
		t.Fatalf("FreePort = %d", port)
	}
}

func TestFreePortIsBelowTheEphemeralRangeAndNeverRepeated(t *testing.T) {
	first := ephemeralFirst()
	seen := map[int]bool{}
	for range 50 {
		p := FreePort(t)
		if p < portFloor || p >= first {
			t.Fatalf("port %d outside [%d, %d)", p, portFloor, first)
		}
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			t.Fatalf("port %d not bindable: %v", p, err)
		}
		ln.Close()
	}
}
