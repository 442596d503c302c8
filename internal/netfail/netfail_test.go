package netfail

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"syscall"
	"testing"
	"time"
)

// The one table of failure kinds: what the agent, the control plane's poller
// and the routers each see when an engine fails.
func TestClassify(t *testing.T) {
	wrap := func(err error) error { return &url.Error{Op: "Get", URL: "http://e:1/metrics", Err: err} }
	opErr := func(op string, err error) error {
		return &net.OpError{Op: op, Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: err}}
	}
	for _, tc := range []struct {
		name string
		err  error
		want Kind
	}{
		{"nil", nil, None},
		{"refused", wrap(opErr("dial", syscall.ECONNREFUSED)), Connection},
		{"reset", wrap(opErr("read", syscall.ECONNRESET)), Connection},
		{"aborted", opErr("read", syscall.ECONNABORTED), Connection},
		{"broken pipe", opErr("write", syscall.EPIPE), Connection},
		{"host unreachable", opErr("dial", syscall.EHOSTUNREACH), Connection},
		{"network unreachable", opErr("dial", syscall.ENETUNREACH), Connection},
		{"host down", wrap(opErr("read", syscall.EHOSTDOWN)), Connection},
		{"network down", wrap(opErr("read", syscall.ENETDOWN)), Connection},
		{"EOF", wrap(io.EOF), Connection},
		{"unexpected EOF", fmt.Errorf("reading body: %w", io.ErrUnexpectedEOF), Connection},
		{"name not found", wrap(&net.OpError{Op: "dial", Err: &net.DNSError{Err: "no such host", Name: "engine.invalid", IsNotFound: true}}), Connection},
		{"bare DNS error", &net.DNSError{Err: "server misbehaving", Name: "engine"}, Connection},
		{"other dial failure", &net.OpError{Op: "dial", Err: errors.New("no route")}, Connection},
		{"deadline", context.DeadlineExceeded, Timeout},
		{"wrapped deadline", wrap(context.DeadlineExceeded), Timeout},
		{"socket deadline", opErr("read", os.ErrDeadlineExceeded), Timeout},
		{"DNS timeout", &net.DNSError{Err: "i/o timeout", Name: "engine", IsTimeout: true}, Timeout},
		{"canceled", wrap(context.Canceled), Canceled},
		{"a status", errors.New("status 503"), Other},
		{"read, not dial, without errno", &net.OpError{Op: "read", Err: errors.New("x")}, Other},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Classify(tc.err); got != tc.want {
				t.Fatalf("Classify(%v) = %v, want %v", tc.err, got, tc.want)
			}
			if IsConnection(tc.err) != (tc.want == Connection) || IsTimeout(tc.err) != (tc.want == Timeout) {
				t.Fatalf("IsConnection/IsTimeout disagree with Classify for %v", tc.err)
			}
		})
	}
}

// Real failures from a real HTTP client on loopback.
func TestClassifyRealFailures(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()
	_, err = http.Get(closed)
	if got := Classify(err); got != Connection {
		t.Errorf("refused: %v (%v), want connection", got, err)
	}

	hang := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-hang }))
	defer slow.Close()
	defer close(hang)
	c := &http.Client{Timeout: 50 * time.Millisecond}
	_, err = c.Get(slow.URL)
	if got := Classify(err); got != Timeout {
		t.Errorf("client timeout: %v (%v), want timeout", got, err)
	}

	cut := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
	}))
	defer cut.Close()
	_, err = http.Get(cut.URL)
	if got := Classify(err); got != Connection {
		t.Errorf("cut before the answer: %v (%v), want connection", got, err)
	}
}
