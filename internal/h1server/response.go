package h1server

import (
	"bufio"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/smg-project/smg/internal/h1wire"
)

// bufferBeforeCommit is how much of a body is held before the header is
// written: an answer that fits is sent with a Content-Length, in one write.
const bufferBeforeCommit = 4 << 10

var errAfterHandler = errors.New("h1server: response used after its handler returned")

// response is the http.ResponseWriter of one request. One per connection,
// reset for each request: a handler must not use it once it returns (the
// net/http contract).
type response struct {
	c    *conn
	req  *http.Request
	hdr  http.Header
	head *reqHead

	status      int
	wroteHeader bool  // the final status is set
	committed   bool  // the status line and header are in the write buffer
	chunked     bool  // the body goes out in chunks
	closeAfter  bool  // the connection ends after this answer
	length      int64 // the declared Content-Length; -1: none
	written     int64
	buf         []byte // body held before the commit
	err         error  // a write to the client failed
	done        bool
}

func (w *response) reset(c *conn, req *http.Request, head *reqHead) {
	hdr, buf := w.hdr, w.buf[:0]
	if hdr == nil {
		hdr = make(http.Header, 8)
	}
	clear(hdr)
	if cap(buf) > bufferBeforeCommit {
		buf = nil
	}
	*w = response{c: c, req: req, hdr: hdr, head: head, length: -1, buf: buf}
}

func (w *response) Header() http.Header { return w.hdr }

func (w *response) WriteHeader(code int) {
	if w.done || w.wroteHeader {
		return
	}
	if code < 100 || code > 999 {
		panic("invalid WriteHeader code " + strconv.Itoa(code))
	}
	if code < 200 && code != http.StatusSwitchingProtocols {
		w.writeInformational(code)
		return
	}
	w.wroteHeader, w.status = true, code
	if v := w.hdr["Content-Length"]; len(v) > 0 {
		if n, ok := h1wire.ParseLength(v[0]); ok && len(v) == 1 {
			w.length = n
		}
		delete(w.hdr, "Content-Length") // written from w.length
	}
}

// writeInformational sends a 1xx (103 Early Hints, say) at once.
func (w *response) writeInformational(code int) {
	if w.committed || w.err != nil {
		return
	}
	bw := w.c.bw
	writeStatusLine(bw, code)
	for k, vv := range w.hdr {
		writeField(bw, k, vv)
	}
	_, _ = bw.WriteString("\r\n")
	if err := bw.Flush(); err != nil {
		w.fail(err)
	}
}

func (w *response) bodyAllowed() bool {
	return w.status >= 200 && w.status != http.StatusNoContent && w.status != http.StatusNotModified
}

func (w *response) Write(p []byte) (int, error) {
	if w.done {
		return 0, errAfterHandler
	}
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if len(p) == 0 {
		return 0, nil
	}
	if !w.bodyAllowed() {
		return 0, http.ErrBodyNotAllowed
	}
	if w.length >= 0 && w.written+int64(len(p)) > w.length {
		return 0, http.ErrContentLength
	}
	w.written += int64(len(p))
	if w.req.Method == http.MethodHead {
		return len(p), nil
	}
	if !w.committed {
		if len(w.buf)+len(p) <= bufferBeforeCommit {
			w.buf = append(w.buf, p...)
			return len(p), nil
		}
		w.commit(false)
		if err := w.writeHeld(); err != nil {
			return 0, err
		}
	}
	return w.writeBody(p)
}

func (w *response) WriteString(s string) (int, error) {
	if !w.committed && len(w.buf)+len(s) <= bufferBeforeCommit && w.wroteHeader && !w.done &&
		w.bodyAllowed() && w.req.Method != http.MethodHead && (w.length < 0 || w.written+int64(len(s)) <= w.length) {
		w.buf = append(w.buf, s...)
		w.written += int64(len(s))
		return len(s), nil
	}
	return w.Write([]byte(s))
}

// writeHeld sends the body held before the commit.
func (w *response) writeHeld() error {
	if len(w.buf) == 0 {
		return w.err
	}
	_, err := w.writeBody(w.buf)
	w.buf = w.buf[:0]
	return err
}

func (w *response) writeBody(p []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	bw := w.c.bw
	if w.chunked {
		_, _ = bw.Write(append(strconv.AppendInt(bw.AvailableBuffer(), int64(len(p)), 16), "\r\n"...))
	}
	n, err := bw.Write(p)
	if w.chunked && err == nil {
		_, err = bw.WriteString("\r\n")
	}
	if err != nil {
		w.fail(err)
		return n, err
	}
	return len(p), nil
}

// Flush sends what is written so far (http.Flusher).
func (w *response) Flush() { _ = w.FlushError() }

// FlushError is Flush for http.ResponseController.
func (w *response) FlushError() error {
	if w.done {
		return errAfterHandler
	}
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.committed {
		w.commit(false)
		if err := w.writeHeld(); err != nil {
			return err
		}
	}
	if w.err != nil {
		return w.err
	}
	if err := w.c.bw.Flush(); err != nil {
		w.fail(err)
		return err
	}
	return nil
}

// SetReadDeadline and SetWriteDeadline serve http.ResponseController.
func (w *response) SetReadDeadline(t time.Time) error {
	if w.done {
		return errAfterHandler
	}
	return w.c.rwc.SetReadDeadline(t)
}

func (w *response) SetWriteDeadline(t time.Time) error {
	if w.done {
		return errAfterHandler
	}
	return w.c.rwc.SetWriteDeadline(t)
}

// fail records a failed write: the client is gone, its request's context
// is canceled, and the connection ends.
func (w *response) fail(err error) {
	if w.err == nil {
		w.err = err
		w.closeAfter = true
		w.c.clientGone()
	}
}

// finish completes the answer once the handler returned.
func (w *response) finish() {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	switch {
	case !w.committed:
		w.commit(true)
		_ = w.writeHeld()
	case w.chunked && w.err == nil:
		if _, err := w.c.bw.WriteString("0\r\n\r\n"); err != nil {
			w.fail(err)
		}
	}
	if w.length >= 0 && w.written < w.length && w.bodyAllowed() && w.req.Method != http.MethodHead {
		w.closeAfter = true // a short body: the client cannot tell where it ends
	}
	if w.err == nil {
		// A connection that goes on sends the answer's last bytes with its
		// wait for the next request: no read that finds nothing between.
		c := w.c
		if !w.closeAfter && !w.head.close && c.s.Config.WriteTimeout <= 0 && !c.s.shuttingDown() {
			c.cw.Hold()
		}
		err := c.bw.Flush()
		c.cw.Release()
		if err != nil {
			w.fail(err)
		}
	}
	w.done = true
}

// commit writes the status line and header: with a Content-Length when
// the handler set one or finished within bufferBeforeCommit, else chunked
// (HTTP/1.1) or delimited by the connection's end (HTTP/1.0).
func (w *response) commit(final bool) {
	w.committed = true
	c, hdr := w.c, w.hdr
	allowed := w.bodyAllowed()
	if w.length < 0 && allowed {
		switch {
		case final && w.req.Method != http.MethodHead:
			w.length = int64(len(w.buf))
		case final:
		case w.req.ProtoMinor >= 1:
			w.chunked = true
		default:
			w.closeAfter = true
		}
	}
	if !allowed {
		w.length = -1
	}
	for tok := range h1wire.Tokens(strings.Join(hdr["Connection"], ",")) {
		if h1wire.EqualFold(tok, "close") {
			w.closeAfter = true
		}
	}
	if w.head.close || c.s.shuttingDown() || !c.requestBodyDone() {
		w.closeAfter = true
	}
	bw := c.bw
	writeStatusLine(bw, w.status)
	for k, vv := range hdr {
		switch k {
		case "Connection", "Transfer-Encoding", "Content-Length":
			continue
		}
		writeField(bw, k, vv)
	}
	if _, ok := hdr["Date"]; !ok {
		_, _ = bw.WriteString("Date: ")
		_, _ = bw.WriteString(c.s.date())
		_, _ = bw.WriteString("\r\n")
	}
	if _, ok := hdr["Content-Type"]; !ok && allowed && len(w.buf) > 0 {
		_, _ = bw.WriteString("Content-Type: ")
		_, _ = bw.WriteString(http.DetectContentType(w.buf))
		_, _ = bw.WriteString("\r\n")
	}
	switch {
	case w.chunked:
		_, _ = bw.WriteString("Transfer-Encoding: chunked\r\n")
	case w.length >= 0:
		_, _ = bw.WriteString("Content-Length: ")
		_, _ = bw.Write(append(strconv.AppendInt(bw.AvailableBuffer(), w.length, 10), "\r\n"...))
	}
	switch {
	case w.closeAfter:
		_, _ = bw.WriteString("Connection: close\r\n")
	case w.req.ProtoMinor == 0:
		_, _ = bw.WriteString("Connection: keep-alive\r\n")
	}
	if _, err := bw.WriteString("\r\n"); err != nil {
		w.fail(err)
	}
}

func writeStatusLine(bw *bufio.Writer, code int) {
	if code == http.StatusOK {
		_, _ = bw.WriteString("HTTP/1.1 200 OK\r\n")
		return
	}
	line := append(bw.AvailableBuffer(), "HTTP/1.1 "...)
	line = strconv.AppendInt(line, int64(code), 10)
	line = append(line, ' ')
	if text := http.StatusText(code); text != "" {
		line = append(line, text...)
	} else {
		line = append(line, "status code "...)
		line = strconv.AppendInt(line, int64(code), 10)
	}
	_, _ = bw.Write(append(line, "\r\n"...))
}

// writeField writes a header field, dropping an invalid name and turning
// CR and LF in a value into spaces, so no handler can split the answer.
func writeField(bw *bufio.Writer, k string, vv []string) {
	if !validTokenString(k) {
		return
	}
	for _, v := range vv {
		_, _ = bw.WriteString(k)
		_, _ = bw.WriteString(": ")
		if strings.ContainsAny(v, "\r\n\x00") {
			for i := 0; i < len(v); i++ {
				c := v[i]
				if c == '\r' || c == '\n' || c == 0 {
					c = ' '
				}
				_ = bw.WriteByte(c)
			}
		} else {
			_, _ = bw.WriteString(v)
		}
		_, _ = bw.WriteString("\r\n")
	}
}

func validTokenString(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !h1wire.IsTchar[s[i]] {
			return false
		}
	}
	return true
}
