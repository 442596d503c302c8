// Package netfail is smg's one classifier of failed calls to an engine:
// "the engine is gone" (a connection-level failure, evidence for the
// unreachable veto) against "the engine is slow" (a timeout, never such
// evidence) against everything else. The agent's polls, the control plane's
// polls and the routers' upstream requests all classify with it, so the same
// failure counts the same wherever it is seen.
//
// It classifies only; what a failure counts for is the judge's.
package netfail

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
)

// Kind is what a failure says about the engine.
type Kind int

const (
	// None: no error.
	None Kind = iota
	// Connection: refused, reset, aborted, a broken pipe, an answer cut
	// short (EOF), host or network unreachable or down, a name that did
	// not resolve, any other dial failure. The engine is gone or cut off.
	Connection
	// Timeout: a deadline passed. The engine is slow, not gone.
	Timeout
	// Canceled: the caller gave up; says nothing about the engine.
	Canceled
	// Other: anything else (a status, a malformed answer).
	Other
)

// String is the kind's label value ("connection", "timeout", "canceled",
// "other"; "" for None).
func (k Kind) String() string {
	switch k {
	case Connection:
		return "connection"
	case Timeout:
		return "timeout"
	case Canceled:
		return "canceled"
	case Other:
		return "other"
	}
	return ""
}

// connErrnos are the errnos of a connection that is gone or never came.
var connErrnos = [...]syscall.Errno{
	syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED, syscall.EPIPE,
	syscall.EHOSTUNREACH, syscall.ENETUNREACH, syscall.EHOSTDOWN, syscall.ENETDOWN,
}

// Classify says what err tells about the engine. A timeout anywhere in the
// chain wins over the rest (a DNS lookup that timed out is slow, not gone).
func Classify(err error) Kind {
	switch {
	case err == nil:
		return None
	case IsTimeout(err):
		return Timeout
	case errors.Is(err, context.Canceled):
		return Canceled
	}
	for _, errno := range connErrnos {
		if errors.Is(err, errno) {
			return Connection
		}
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return Connection
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return Connection
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "dial" {
		return Connection
	}
	return Other
}

// IsConnection reports a connection-level failure (Classify == Connection).
func IsConnection(err error) bool { return Classify(err) == Connection }

// IsTimeout reports a deadline or timeout anywhere in err.
func IsTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}
