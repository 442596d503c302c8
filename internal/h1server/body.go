package h1server

import (
	"bufio"
	"errors"
	"io"
	"sync/atomic"

	"github.com/smg-project/smg/internal/h1wire"
)

var errBodyClosed = errors.New("h1server: read on a closed request body")

// body is a request body read off the connection's buffered reader:
// Content-Length bytes, or chunks up to the last one.
type body struct {
	c         *conn
	br        *bufio.Reader
	chunked   bool
	remaining int64 // of the body (Content-Length) or of the current chunk
	eof       bool  // read to its end: the connection may serve another request
	last      bool  // chunked: the last chunk was seen
	err       error // sticky
	closed    atomic.Bool
	expect    bool // 100 Continue still owed before the first read
}

// Read is the handler's: it holds no lock while it waits on the client.
func (b *body) Read(p []byte) (int, error) {
	if b.closed.Load() {
		return 0, errBodyClosed
	}
	if b.err != nil {
		return 0, b.err
	}
	if b.expect {
		b.expect = false
		if err := b.c.sendContinue(); err != nil {
			b.err = err
			return 0, err
		}
	}
	n, err := b.read(p)
	if err != nil {
		b.err = err
		if err == io.EOF {
			b.eof = true
			c := b.c
			c.mu.Lock()
			c.bodyDoneLocked()
			c.mu.Unlock()
		}
	}
	return n, err
}

func (b *body) read(p []byte) (int, error) {
	if !b.chunked {
		if b.remaining == 0 {
			return 0, io.EOF
		}
		if int64(len(p)) > b.remaining {
			p = p[:b.remaining]
		}
		n, err := b.br.Read(p)
		b.remaining -= int64(n)
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		if err == nil && b.remaining == 0 {
			err = io.EOF
		}
		return n, err
	}
	for b.remaining == 0 {
		if b.last {
			return 0, io.EOF
		}
		if err := b.nextChunk(); err != nil {
			return 0, err
		}
	}
	if int64(len(p)) > b.remaining {
		p = p[:b.remaining]
	}
	n, err := b.br.Read(p)
	b.remaining -= int64(n)
	if err == io.EOF {
		return n, io.ErrUnexpectedEOF
	}
	if err == nil && b.remaining == 0 {
		err = h1wire.ChunkEnd(b.br)
		if err == nil && b.peekLast() {
			err = io.EOF // the last chunk is already here: say so now
		}
	}
	return n, err
}

// nextChunk reads a chunk-size line (and, for the last chunk, the trailer
// section, which is discarded).
func (b *body) nextChunk() error {
	size, err := h1wire.NextChunk(b.br)
	if err != nil {
		return err
	}
	b.remaining, b.last = size, size == 0
	return nil
}

// peekLast reports, without blocking, whether the next chunk buffered is
// the last one (and consumes it and the trailer when it is fully there).
func (b *body) peekLast() bool {
	buf, _ := b.br.Peek(b.br.Buffered())
	if len(buf) < 5 || buf[0] != '0' || string(buf[:5]) != "0\r\n\r\n" {
		return false
	}
	_, _ = b.br.Discard(5)
	b.last = true
	return true
}

// Buffered is how many of the body's bytes are already read off the
// connection, so a handler can read them without a deadline: a reader can
// wait on them for nothing. A chunked body, or one whose 100 Continue is
// still owed, says 0.
func (b *body) Buffered() int64 {
	if b.closed.Load() || b.err != nil || b.expect || b.chunked {
		return 0
	}
	return min(b.remaining, int64(b.br.Buffered()))
}

func (b *body) Close() error {
	b.closed.Store(true)
	return nil
}

// discardBuffered skips the rest of a Content-Length body when it is
// already buffered, never waiting on the client: true when the body is
// behind us, so the connection can serve the next request.
func (b *body) discardBuffered() bool {
	if b.eof {
		return true
	}
	if b.err != nil || b.expect || b.chunked || int64(b.br.Buffered()) < b.remaining {
		return false
	}
	_, _ = b.br.Discard(int(b.remaining))
	b.remaining, b.eof = 0, true
	return true
}
