// Package sendwait sends a message's last bytes and waits for the answer in
// one step on a socket. Go's reads try the socket first and wait for it only
// when that finds nothing, which right after a request (or an answer, on a
// kept-alive connection) it nearly always does: one read system call per
// exchange that finds nothing. Here the wait is armed first, then the held
// bytes are written and the answer read when the socket says it is there,
// so no answer can slip past the wait and no read finds nothing.
package sendwait

import (
	"io"
	"net"
	"os"
	"syscall"
)

// Conn reads and writes c. Hold makes its next Write keep the bytes it is
// given (a bufio.Writer's buffer, untouched until its next write) for the
// next Read to send. A connection that is not a socket, or bytes the socket
// does not take whole at once, go out through c's Write, the answer through
// c's Read.
type Conn struct {
	c         net.Conn
	raw       syscall.RawConn // nil: not a socket
	hold      bool
	tail      []byte
	afterSend func()
	st        state
	step      func(uintptr) bool // s.stepFD, bound once
}

// state is one Read's, kept in the Conn so the step RawConn.Read calls
// costs no allocation.
type state struct {
	tail, p []byte
	sent    bool
	n       int
	err     error
}

// New returns a Conn over c. afterSend (nil: none) runs once held bytes are
// out, before the wait for the answer.
func New(c net.Conn, afterSend func()) *Conn {
	s := &Conn{c: c, afterSend: afterSend}
	if sc, ok := c.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			s.raw, s.step = raw, s.stepFD
		}
	}
	return s
}

// Hold makes the next Write's bytes wait for the next Read, on a socket;
// false (nothing held) otherwise.
func (s *Conn) Hold() bool {
	s.hold = s.raw != nil
	return s.hold
}

// Socket reports whether c is a socket, whose bytes can be held.
func (s *Conn) Socket() bool { return s.raw != nil }

// Held reports whether bytes wait for the next Read.
func (s *Conn) Held() bool { return s.tail != nil }

// Release stops holding: a Hold not used by a Write ends.
func (s *Conn) Release() { s.hold = false }

// SendHeld writes held bytes now, for a connection that will not be read
// again.
func (s *Conn) SendHeld() error {
	tail := s.tail
	s.tail = nil
	if len(tail) == 0 {
		return nil
	}
	_, err := s.c.Write(tail)
	return err
}

// Write holds p after Hold. Held bytes alias the caller's buffer: they must
// go out (Read, SendHeld) before the caller writes to that buffer again.
func (s *Conn) Write(p []byte) (int, error) {
	if s.hold {
		s.hold, s.tail = false, p
		return len(p), nil
	}
	return s.c.Write(p)
}

// Read sends held bytes, then reads the answer's first bytes into p.
func (s *Conn) Read(p []byte) (int, error) {
	if s.tail == nil {
		return s.c.Read(p)
	}
	st := &s.st
	*st = state{tail: s.tail, p: p}
	s.tail = nil
	err := s.raw.Read(s.step)
	n, rerr, tail := st.n, st.err, st.tail
	*st = state{}
	switch {
	case err != nil:
		return 0, err
	case len(tail) > 0:
		if _, err := s.c.Write(tail); err != nil {
			return 0, err
		}
		if s.afterSend != nil {
			s.afterSend()
		}
		return s.c.Read(p)
	case rerr != nil:
		return 0, &net.OpError{Op: "read", Net: "tcp", Source: s.c.LocalAddr(), Addr: s.c.RemoteAddr(), Err: os.NewSyscallError("read", rerr)}
	case n <= 0:
		return 0, io.EOF
	}
	return n, nil
}

// stepFD is RawConn.Read's callback: first the held bytes' write (false:
// wait for the answer), then the read (false: nothing yet, wait again).
func (s *Conn) stepFD(fd uintptr) bool {
	st := &s.st
	if !st.sent {
		st.sent = true
		for len(st.tail) > 0 {
			m, err := syscall.Write(int(fd), st.tail)
			if err == syscall.EINTR {
				continue
			}
			if err != nil || m <= 0 {
				return true // Read finishes it through the connection's Write, or says why not
			}
			st.tail = st.tail[m:]
		}
		if s.afterSend != nil {
			s.afterSend()
		}
		return false
	}
	for {
		st.n, st.err = syscall.Read(int(fd), st.p)
		if st.err != syscall.EINTR {
			break
		}
	}
	return st.err != syscall.EAGAIN
}
