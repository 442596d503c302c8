package h1server

import (
	"bufio"
	"errors"
	"io"
	"sync/atomic"
)

var (
	errBodyClosed    = errors.New("h1server: read on a closed request body")
	errChunkTooLarge = errors.New("h1server: chunk size too large")
)

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
		err = b.chunkEnd()
		if err == nil && b.peekLast() {
			err = io.EOF // the last chunk is already here: say so now
		}
	}
	return n, err
}

// maxChunkLine bounds a chunk-size line with its extensions.
const maxChunkLine = 4096

// nextChunk reads a chunk-size line (and, for the last chunk, the trailer
// section, which is discarded).
func (b *body) nextChunk() error {
	line, err := readChunkLine(b.br)
	if err != nil {
		return err
	}
	size, err := parseChunkSize(line)
	if err != nil {
		return err
	}
	if size == 0 {
		b.last = true
		return b.skipTrailer()
	}
	b.remaining = size
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

func (b *body) chunkEnd() error {
	var crlf [2]byte
	if _, err := io.ReadFull(b.br, crlf[:]); err != nil {
		return unexpected(err)
	}
	if crlf != [2]byte{'\r', '\n'} {
		return errChunkLine
	}
	return nil
}

// maxTrailerBytes bounds a chunked body's trailer section.
const maxTrailerBytes = 8 << 10

func (b *body) skipTrailer() error {
	total := 0
	for {
		line, err := readChunkLine(b.br)
		if err != nil {
			return err
		}
		if len(line) == 0 {
			return nil
		}
		if total += len(line) + 2; total > maxTrailerBytes {
			return errChunkLine
		}
		if !validField(line) {
			return errChunkLine
		}
	}
}

func readChunkLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err == bufio.ErrBufferFull || len(line) > maxChunkLine {
		return nil, errChunkLine
	}
	if err != nil {
		return nil, unexpected(err)
	}
	if len(line) < 2 || line[len(line)-2] != '\r' {
		return nil, errChunkLine
	}
	return line[:len(line)-2], nil
}

// parseChunkSize parses "HEX[;ext...]": hex digits only, at most 15 of
// them, extensions without control bytes (and ignored).
func parseChunkSize(line []byte) (int64, error) {
	var n int64
	i := 0
	for ; i < len(line); i++ {
		c := line[i]
		var d byte
		switch {
		case '0' <= c && c <= '9':
			d = c - '0'
		case 'a' <= c && c <= 'f':
			d = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			d = c - 'A' + 10
		default:
			goto ext
		}
		if i == 15 {
			return 0, errChunkTooLarge
		}
		n = n<<4 | int64(d)
	}
ext:
	if i == 0 {
		return 0, errChunkLine
	}
	rest := line[i:]
	for len(rest) > 0 && (rest[0] == ' ' || rest[0] == '\t') {
		rest = rest[1:]
	}
	if len(rest) > 0 && rest[0] != ';' {
		return 0, errChunkLine
	}
	for _, c := range rest {
		if (c < ' ' && c != '\t') || c == 0x7f {
			return 0, errChunkLine
		}
	}
	return n, nil
}

func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
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
