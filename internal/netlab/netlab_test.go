package netlab

import (
	"context"
	"errors"
	"io"
	"net"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

func newLab(t *testing.T) (*Lab, *Host, *Host) {
	t.Helper()
	if err := Check(); err != nil {
		t.Skip(err)
	}
	Sweep("nltest")
	l, err := New("nltest")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Error(err)
		}
	})
	a, err := l.AddHost("a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.AddHost("b")
	if err != nil {
		t.Fatal(err)
	}
	return l, a, b
}

// echo serves one byte back per connection until the listener closes.
func echo(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
	}
}

func roundTrip(ctx context.Context, from *Host, addr string) error {
	c, err := from.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if d, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(d)
	}
	if _, err := c.Write([]byte("x")); err != nil {
		return err
	}
	buf := make([]byte, 1)
	_, err = io.ReadFull(c, buf)
	return err
}

func TestHostsTalkOverTheBridgeAndFaultsCutThem(t *testing.T) {
	_, a, b := newLab(t)
	ln, err := a.Listen(a.Addr(7000))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go echo(ln)
	ctx := func() context.Context {
		c, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		t.Cleanup(cancel)
		return c
	}
	if err := roundTrip(ctx(), b, a.Addr(7000)); err != nil {
		t.Fatalf("b -> a before any fault: %v", err)
	}

	// Reject answers at once with a reset: the dial fails fast, not by timeout.
	f, err := b.Cut(a, 7000, Reject, Outbound)
	if err != nil {
		t.Fatal(err)
	}
	if err := roundTrip(ctx(), b, a.Addr(7000)); !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("b -> a with a reject: %v, want refused or reset", err)
	}
	if err := f.Heal(); err != nil {
		t.Fatal(err)
	}
	if err := roundTrip(ctx(), b, a.Addr(7000)); err != nil {
		t.Fatalf("b -> a after healing: %v", err)
	}

	// Drop of replies only (inbound on a): the request leaves, nothing comes back.
	f, err = a.Cut(b, 0, Drop, Outbound)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if err := roundTrip(short, b, a.Addr(7000)); err == nil {
		t.Fatal("b -> a completed although a's replies are dropped")
	}
	if err := f.Heal(); err != nil {
		t.Fatal(err)
	}
	if err := roundTrip(ctx(), b, a.Addr(7000)); err != nil {
		t.Fatalf("b -> a after healing the drop: %v", err)
	}
}

func TestCloseLeavesNothingBehind(t *testing.T) {
	l, a, _ := newLab(t)
	if _, err := a.Cut(a, 0, Drop, Both); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), Prefix+"-nltest") {
		t.Fatalf("namespaces left after Close:\n%s", out)
	}
}
