package validate

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// requireTools turns a missing promtool or prometheus into a failure; CI
// (scripts/check-deploy.sh) sets it, a developer without them gets a skip.
var requireTools = os.Getenv("SMG_REQUIRE_TOOLS") == "1"

func tool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if requireTools {
			t.Fatalf("%s not found (Debian package 'prometheus'): %v", name, err)
		}
		t.Skipf("%s not found; install Debian's 'prometheus' package or set SMG_REQUIRE_TOOLS=1 to fail", name)
	}
	return p
}

var build struct {
	once sync.Once
	path string
	err  error
}

// smgBinary builds the smg binary from this repository once per test run
// (SMG_BIN names a prebuilt one instead).
func smgBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("SMG_BIN"); p != "" {
		return p
	}
	build.once.Do(func() {
		dir, err := os.MkdirTemp("", "smg-validate-")
		if err != nil {
			build.err = err
			return
		}
		build.path = filepath.Join(dir, "smg")
		cmd := exec.Command("go", "build", "-o", build.path, "./cmd/smg")
		cmd.Dir = repoRoot
		if out, err := cmd.CombinedOutput(); err != nil {
			build.err = fmt.Errorf("go build ./cmd/smg: %v\n%s", err, out)
		}
	})
	if build.err != nil {
		t.Fatal(build.err)
	}
	return build.path
}

// proc is a child process whose output is kept for failure messages.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start runs bin with args until the test ends (SIGTERM, then kill after 5 s).
// On failure the test log shows the process's output.
func start(t *testing.T, name, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, cmd: exec.Command(bin, args...), out: &syncBuffer{}}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = p.cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("--- output of %s %q:\n%s", name, args, tail(p.out.String(), 4000))
		}
	})
	return p
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// freePort asks the kernel for a free loopback port.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// eventually polls check until it returns nil or the deadline passes. It waits
// on real processes, so it polls real time, with a bound.
func eventually(t *testing.T, within time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, within, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// probeClient fetches like kubelet: https probes do not verify the certificate.
var probeClient = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}

// get fetches url and returns the status and body.
func get(ctx context.Context, url string) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := probeClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

func wantOK(ctx context.Context, url string) error {
	code, body, err := get(ctx, url)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("GET %s: %d %s", url, code, tail(string(body), 200))
	}
	return nil
}

func itoa(i int) string { return strconv.Itoa(i) }
