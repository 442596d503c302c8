// Package sendwait sends a message's last bytes and waits for the answer in
// one step on a socket. Go's reads try the socket first and wait for it only
// when that finds nothing, which right after a request (or an answer, on a
// kept-alive connection) it nearly always does: one read system call per
// exchange that finds nothing. Here the wait is armed first, then the held
// bytes are written and the answer read when the socket says it is there,
// so no answer can slip past the wait and no read finds nothing.
//
// On a socket every read and write is a raw system call (sysio): a
// non-blocking socket's read or write never blocks, so the runtime need not
// be told of it. Told (net.Conn's Read and Write), each call wakes the
// runtime's monitor thread when it sleeps, and a write the kernel preempts
// to run its receiver (on loopback it delivers the bytes) has its processor
// handed to another thread: on a proxy's short exchanges those thread
// switches cost more than the calls themselves.
package sendwait

import (
	"io"
	"net"
	"os"
	"syscall"
)

// Conn reads and writes c. Hold makes its next Write keep the bytes it is
// given (a bufio.Writer's buffer, untouched until its next write) for the
// next Read to send. A connection that is not a socket goes through c's
// Read and Write.
type Conn struct {
	c         net.Conn
	raw       syscall.RawConn // nil: not a socket
	hold      bool
	tail      []byte
	afterSend func()
	st        state
	wst       wstate
	step      func(uintptr) bool // s.stepFD, bound once
	wstep     func(uintptr) bool // s.writeFD, bound once
}

// state is one Read's, kept in the Conn so the step RawConn.Read calls
// costs no allocation.
type state struct {
	tail, p []byte
	sent    bool
	n       int
	err     error
}

// wstate is one Write's: a Read may run beside it.
type wstate struct {
	p   []byte
	n   int
	err error
}

// New returns a Conn over c. afterSend (nil: none) runs once held bytes are
// out, before the wait for the answer.
func New(c net.Conn, afterSend func()) *Conn {
	s := &Conn{c: c, afterSend: afterSend}
	if sc, ok := c.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			s.raw, s.step, s.wstep = raw, s.stepFD, s.writeFD
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
	_, err := s.write(tail)
	return err
}

// Write holds p after Hold. Held bytes alias the caller's buffer: they must
// go out (Read, SendHeld) before the caller writes to that buffer again.
func (s *Conn) Write(p []byte) (int, error) {
	if s.hold {
		s.hold, s.tail = false, p
		return len(p), nil
	}
	return s.write(p)
}

func (s *Conn) write(p []byte) (int, error) {
	if s.raw == nil {
		return s.c.Write(p)
	}
	w := &s.wst
	*w = wstate{p: p}
	err := s.raw.Write(s.wstep)
	n, werr := w.n, w.err
	*w = wstate{}
	switch {
	case err != nil:
		return n, err
	case werr != nil:
		return n, s.opError("write", werr)
	}
	return n, nil
}

// writeFD is RawConn.Write's callback: false when the socket takes no more
// now (wait until it does).
func (s *Conn) writeFD(fd uintptr) bool {
	w := &s.wst
	for w.n < len(w.p) {
		m, err := sysWrite(fd, w.p[w.n:])
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			return false
		case err != nil:
			w.err = err
			return true
		case m <= 0:
			w.err = syscall.EIO
			return true
		}
		w.n += m
	}
	return true
}

func (s *Conn) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: "tcp", Source: s.c.LocalAddr(), Addr: s.c.RemoteAddr(), Err: os.NewSyscallError(op, err)}
}

// Read sends held bytes, then reads the answer's first bytes into p.
func (s *Conn) Read(p []byte) (int, error) {
	if s.raw == nil {
		return s.c.Read(p)
	}
	if len(p) == 0 && s.tail == nil {
		return 0, nil
	}
	st := &s.st
	*st = state{tail: s.tail, p: p, sent: s.tail == nil}
	s.tail = nil
	err := s.raw.Read(s.step)
	n, rerr, tail := st.n, st.err, st.tail
	*st = state{}
	switch {
	case err != nil:
		return 0, err
	case len(tail) > 0:
		if _, err := s.write(tail); err != nil {
			return 0, err
		}
		if s.afterSend != nil {
			s.afterSend()
		}
		return s.Read(p)
	case rerr != nil:
		return 0, s.opError("read", rerr)
	case n <= 0 && len(p) > 0:
		return 0, io.EOF
	}
	return n, nil
}

// stepFD is RawConn.Read's callback: first any held bytes' write (false:
// wait for the answer), then the read (false: nothing yet, wait again).
func (s *Conn) stepFD(fd uintptr) bool {
	st := &s.st
	if !st.sent {
		st.sent = true
		for len(st.tail) > 0 {
			m, err := sysWrite(fd, st.tail)
			if err == syscall.EINTR {
				continue
			}
			if err != nil || m <= 0 {
				return true // Read finishes it through write, or says why not
			}
			st.tail = st.tail[m:]
		}
		if s.afterSend != nil {
			s.afterSend()
		}
		return false
	}
	if len(st.p) == 0 {
		return true
	}
	for {
		st.n, st.err = sysRead(fd, st.p)
		if st.err != syscall.EINTR {
			break
		}
	}
	return st.err != syscall.EAGAIN
}
