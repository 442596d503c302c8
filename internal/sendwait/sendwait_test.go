package sendwait

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// echo serves one connection: every read written back.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.Copy(c, c)
	}()
	return ln.Addr().String()
}

// Held bytes go out with the next Read, which returns the answer to them;
// without Hold, or once Released, a Write goes out at once.
func TestHeldBytesGoOutWithTheRead(t *testing.T) {
	c, err := net.Dial("tcp", echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sent := 0
	s := New(c, func() { sent++ })
	if !s.Socket() {
		t.Fatal("a TCP connection is a socket")
	}
	buf := make([]byte, 64)
	for i, msg := range []string{"one", "two", "three"} {
		if !s.Hold() {
			t.Fatal("Hold on a socket")
		}
		if n, err := s.Write([]byte(msg)); n != len(msg) || err != nil || !s.Held() {
			t.Fatalf("held write: %d %v held %v", n, err, s.Held())
		}
		n, err := io.ReadAtLeast(s, buf, len(msg))
		if err != nil || string(buf[:n]) != msg || s.Held() || sent != i+1 {
			t.Fatalf("read %q %v, want the echo of %q; held %v, sent %d", buf[:n], err, msg, s.Held(), sent)
		}
	}
	s.Hold()
	s.Release()
	if _, err := s.Write([]byte("four")); err != nil || s.Held() {
		t.Fatalf("a write after Release is held (%v) or failed: %v", s.Held(), err)
	}
	if n, err := io.ReadAtLeast(s, buf, 4); err != nil || string(buf[:n]) != "four" {
		t.Fatalf("read %q %v", buf[:n], err)
	}
	// SendHeld: for a connection that will not be read again.
	s.Hold()
	_, _ = s.Write([]byte("five"))
	if err := s.SendHeld(); err != nil || s.Held() {
		t.Fatal(err)
	}
	if n, err := io.ReadAtLeast(c, buf, 4); err != nil || !bytes.Equal(buf[:n], []byte("five")) {
		t.Fatalf("read %q %v", buf[:n], err)
	}
}

// A connection that is not a socket holds nothing.
func TestPipeHoldsNothing(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	s := New(a, nil)
	if s.Socket() || s.Hold() {
		t.Fatal("a pipe is no socket")
	}
	go func() { _, _ = s.Write([]byte("x")) }()
	buf := make([]byte, 1)
	if _, err := io.ReadFull(b, buf); err != nil || buf[0] != 'x' {
		t.Fatalf("%q %v", buf, err)
	}
}

// pair is a connected loopback TCP pair: a wrapped in a Conn, b plain.
func pair(t *testing.T) (*Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b, ok := <-accepted
	if !ok {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return New(a, nil), b
}

// A write larger than the socket buffers goes out whole: the write waits
// while the peer's reading lags, and the bytes come back intact through
// Read.
func TestLargeWriteAndReadComeThroughWhole(t *testing.T) {
	s, b := pair(t)
	payload := make([]byte, 8<<20)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	go func() { _, _ = io.Copy(b, b) }() // echo
	werr := make(chan error, 1)
	go func() {
		n, err := s.Write(payload)
		if err == nil && n != len(payload) {
			err = io.ErrShortWrite
		}
		if err != nil {
			s.c.Close() // the read below ends
		}
		werr <- err
	}()
	got := make([]byte, len(payload))
	_, rerr := io.ReadFull(s, got)
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	if rerr != nil {
		t.Fatal(rerr)
	}
	if !bytes.Equal(got, payload) {
		t.Fatal("the echo differs from what was written")
	}
}

// The peer's close is io.EOF; a reset is ECONNRESET (the upstream client
// tells a stale kept-alive connection by it); a read or write on the
// closed Conn is net.ErrClosed.
func TestEndsOfTheConnection(t *testing.T) {
	s, b := pair(t)
	if _, err := b.Write([]byte("last")); err != nil {
		t.Fatal(err)
	}
	b.Close()
	buf := make([]byte, 16)
	if n, err := io.ReadAtLeast(s, buf, 4); err != nil || string(buf[:n]) != "last" {
		t.Fatalf("read %q %v", buf[:n], err)
	}
	if n, err := s.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("after the peer's close: %d %v, want io.EOF", n, err)
	}

	s, b = pair(t)
	_ = b.(*net.TCPConn).SetLinger(0)
	b.Close() // RST
	if _, err := s.Read(buf); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("after the peer's reset: %v, want ECONNRESET", err)
	}

	s, _ = pair(t)
	s.c.Close()
	if _, err := s.Read(buf); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read on a closed connection: %v, want net.ErrClosed", err)
	}
	if _, err := s.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write on a closed connection: %v, want net.ErrClosed", err)
	}
}

// A deadline ends a read waiting for bytes that never come, and a read
// held bytes started (the upstream client cuts a cancelled request so), as
// a timeout.
func TestDeadlineEndsAWaitingRead(t *testing.T) {
	for _, held := range []bool{false, true} {
		s, b := pair(t)
		done := make(chan error, 1)
		go func() {
			if held {
				s.Hold()
				_, _ = s.Write([]byte("request"))
			}
			_, err := s.Read(make([]byte, 16))
			done <- err
		}()
		if held { // the held bytes went out before the wait
			if _, err := io.ReadFull(b, make([]byte, len("request"))); err != nil {
				t.Fatal(err)
			}
		}
		_ = s.c.SetReadDeadline(time.Unix(1, 0))
		err := <-done
		var ne net.Error
		if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("held %v: %v, want a timeout", held, err)
		}
	}
}
