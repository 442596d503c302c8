package sendwait

import (
	"bytes"
	"io"
	"net"
	"testing"
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
