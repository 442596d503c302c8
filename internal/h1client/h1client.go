// Package h1client is the wire side of an HTTP/1.1 client: it writes a
// request and parses its answer on a connection the caller owns (and pools),
// on the caller's goroutine. It does what net/http's Request.Write and
// ReadResponse do for a proxy's upstream leg at a few allocations per
// exchange instead of a few dozen: the answer's head becomes one string its
// header values are cut from, and its body is read straight off the
// connection's buffered reader. Every malformed or oversized answer is an
// error, never a guess.
package h1client

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"golang.org/x/net/http/httpguts"

	"github.com/smg-project/smg/internal/h1wire"
)

// Limits of an answer's head (status line and header fields together).
const (
	MaxHeadBytes = 64 << 10
	MaxFields    = 100
)

// Errors of a malformed answer. An answer cut short reads as
// io.ErrUnexpectedEOF, as net/http's does.
var (
	ErrHeadTooLarge   = fmt.Errorf("h1client: answer head larger than %d bytes or %d fields", MaxHeadBytes, MaxFields)
	ErrStatusLine     = errors.New("h1client: malformed HTTP status line")
	ErrHeader         = errors.New("h1client: malformed HTTP header field")
	ErrContentLength  = errors.New("h1client: invalid Content-Length")
	ErrTE             = errors.New("h1client: unsupported Transfer-Encoding")
	errInvalidRequest = errors.New("h1client: invalid request")
)

// WriteRequest writes req's head and body to bw (not flushed): the body as
// Content-Length bytes when req.ContentLength says how many (body, when not
// nil, stands for req.Body's bytes already in memory), chunked when it does
// not. Header names and values are checked as net/http checks them.
func WriteRequest(bw *bufio.Writer, req *http.Request, body []byte) error {
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	if !httpguts.ValidHostHeader(host) {
		return fmt.Errorf("%w: Host %q", errInvalidRequest, host)
	}
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	bw.WriteString(method)
	bw.WriteByte(' ')
	bw.WriteString(req.URL.RequestURI())
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(host)
	bw.WriteString("\r\n")
	ua := false
	for k, vv := range req.Header {
		switch k {
		case "Host", "Content-Length", "Transfer-Encoding", "Trailer":
			continue // framing is this writer's
		case "User-Agent":
			ua = true
		}
		if !httpguts.ValidHeaderFieldName(k) {
			return fmt.Errorf("%w: header field name %q", errInvalidRequest, k)
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				return fmt.Errorf("%w: header field value for %q", errInvalidRequest, k)
			}
			bw.WriteString(k)
			bw.WriteString(": ")
			bw.WriteString(h1wire.TrimOWSString(v))
			bw.WriteString("\r\n")
		}
	}
	if !ua {
		bw.WriteString("User-Agent: Go-http-client/1.1\r\n") // what net/http sends
	}
	if req.Close {
		bw.WriteString("Connection: close\r\n")
	}
	rb := req.Body
	if rb == http.NoBody {
		rb = nil
	}
	if body == nil && rb != nil {
		defer rb.Close()
	}
	switch {
	case body != nil || rb == nil || req.ContentLength > 0:
		n := req.ContentLength
		if body != nil {
			n = int64(len(body))
		}
		if n > 0 || method == http.MethodPost || method == http.MethodPut || method == http.MethodPatch {
			bw.WriteString("Content-Length: ")
			var num [20]byte
			bw.Write(strconv.AppendInt(num[:0], n, 10))
			bw.WriteString("\r\n")
		}
		bw.WriteString("\r\n")
		if body != nil {
			_, err := bw.Write(body)
			return err
		}
		if rb != nil {
			w, err := io.Copy(bw, io.LimitReader(rb, n))
			if err == nil && w != n {
				err = fmt.Errorf("h1client: request body of %d bytes, %d declared", w, n)
			}
			return err
		}
		return nil
	default: // a body of unknown length
		bw.WriteString("Transfer-Encoding: chunked\r\n\r\n")
		cw := chunkWriter{bw}
		if _, err := io.Copy(cw, rb); err != nil {
			return err
		}
		_, err := bw.WriteString("0\r\n\r\n")
		return err
	}
}

type chunkWriter struct{ bw *bufio.Writer }

func (c chunkWriter) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var num [16]byte
	c.bw.Write(strconv.AppendInt(num[:0], int64(len(p)), 16))
	c.bw.WriteString("\r\n")
	c.bw.Write(p)
	_, err := c.bw.WriteString("\r\n")
	return len(p), err
}

// Parser reads answers off one connection; its scratch space is reused
// from answer to answer.
type Parser struct {
	head   []byte  // the head's lines, CRLFs dropped, one after another
	fields []field // offsets into head
	minor  int     // of the status line read
	code   int
}

type field struct{ name, nameEnd, value, end int }

var chunkedTE = []string{"chunked"}

// ReadResponse reads the answer to req (informational 1xx answers but 101
// are skipped) and sets body up to read its body off br. resp.Body is left
// nil: the caller wraps body. resp.ContentLength is -1 when the body's end
// is the chunked encoding's or the connection's close.
func (p *Parser) ReadResponse(br *bufio.Reader, req *http.Request, body *Body) (*http.Response, error) {
	for {
		resp, err := p.readHead(br, req)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode >= 200 || resp.StatusCode < 100 || resp.StatusCode == http.StatusSwitchingProtocols {
			return resp, p.frame(resp, req, br, body)
		}
	}
}

// readHead reads the status line and header fields into p.head, one line
// after another without their line ends.
func (p *Parser) readHead(br *bufio.Reader, req *http.Request) (*http.Response, error) {
	p.head, p.fields = p.head[:0], p.fields[:0]
	statusEnd := -1
	for {
		start := len(p.head)
		line, err := br.ReadSlice('\n')
		for err == bufio.ErrBufferFull { // a line past the reader's buffer
			if len(p.head)+len(line) > MaxHeadBytes {
				return nil, ErrHeadTooLarge
			}
			p.head = append(p.head, line...)
			line, err = br.ReadSlice('\n')
		}
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
		if len(p.head)+len(line) > MaxHeadBytes+2 {
			return nil, ErrHeadTooLarge
		}
		p.head = append(p.head, line...)
		end := len(p.head) - 1 // the LF; a bare LF ends a line too, as net/textproto reads answers
		if end > start && p.head[end-1] == '\r' {
			end--
		}
		p.head = p.head[:end]
		switch {
		case statusEnd < 0:
			if err := p.parseStatusLine(p.head[:end]); err != nil {
				return nil, err // before waiting for a head that may never end
			}
			statusEnd = end
		case end == start:
			return p.build(statusEnd, req)
		case len(p.fields) == MaxFields:
			return nil, ErrHeadTooLarge
		default:
			if err := p.addField(start, end); err != nil {
				return nil, err
			}
		}
	}
}

func (p *Parser) addField(start, end int) error {
	line := p.head[start:end]
	if line[0] == ' ' || line[0] == '\t' {
		return ErrHeader // obsolete line folding
	}
	colon := bytes.IndexByte(line, ':')
	if colon <= 0 || !h1wire.ValidToken(line[:colon]) {
		return ErrHeader
	}
	h1wire.Canonicalize(line[:colon])
	v, e := start+colon+1, end
	for v < e && (p.head[v] == ' ' || p.head[v] == '\t') {
		v++
	}
	for e > v && (p.head[e-1] == ' ' || p.head[e-1] == '\t') {
		e--
	}
	for _, c := range p.head[v:e] {
		if (c < ' ' && c != '\t') || c == 0x7f {
			return ErrHeader
		}
	}
	p.fields = append(p.fields, field{name: start, nameEnd: start + colon, value: v, end: e})
	return nil
}

// build makes the answer of the head read: one string for the whole head,
// the status and every header value cut from it.
func (p *Parser) build(statusEnd int, req *http.Request) (*http.Response, error) {
	s := string(p.head)
	resp := &http.Response{Proto: "HTTP/1.0", ProtoMajor: 1, ProtoMinor: p.minor, StatusCode: p.code, Status: s[9:statusEnd], Request: req}
	if p.minor == 1 {
		resp.Proto = "HTTP/1.1"
	}
	if len(resp.Status) == 4 { // "SSS " without a reason
		resp.Status = resp.Status[:3]
	}
	resp.Header = make(http.Header, len(p.fields))
	vals := make([]string, len(p.fields))
	for i, f := range p.fields {
		key, ok := h1wire.CommonKey(p.head[f.name:f.nameEnd])
		if !ok {
			key = s[f.name:f.nameEnd]
		}
		vals[i] = s[f.value:f.end]
		if old, dup := resp.Header[key]; dup {
			resp.Header[key] = append(old, vals[i])
		} else {
			resp.Header[key] = vals[i : i+1 : i+1]
		}
	}
	return resp, nil
}

// parseStatusLine reads "HTTP/1.x SSS[ reason]".
func (p *Parser) parseStatusLine(line []byte) error {
	if len(line) < 12 || string(line[:7]) != "HTTP/1." || (line[7] != '0' && line[7] != '1') || line[8] != ' ' ||
		(len(line) > 12 && line[12] != ' ') {
		return fmt.Errorf("%w %q", ErrStatusLine, truncate(string(line)))
	}
	code := 0
	for _, c := range line[9:12] {
		if c < '0' || c > '9' {
			return fmt.Errorf("%w %q", ErrStatusLine, truncate(string(line)))
		}
		code = code*10 + int(c-'0')
	}
	if code < 100 {
		return fmt.Errorf("%w %q", ErrStatusLine, truncate(string(line)))
	}
	p.minor, p.code = int(line[7]-'0'), code
	return nil
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// frame applies the fields that frame the body (RFC 9112 6.3) and sets body
// up to read it.
func (p *Parser) frame(resp *http.Response, req *http.Request, br *bufio.Reader, body *Body) error {
	*body = Body{br: br}
	h := resp.Header
	keepAlive := false
	for _, v := range h["Connection"] {
		for tok := range h1wire.Tokens(v) {
			switch {
			case h1wire.EqualFold(tok, "close"):
				resp.Close = true
			case h1wire.EqualFold(tok, "keep-alive") && resp.ProtoMinor == 0:
				keepAlive = true
			}
		}
	}
	if resp.ProtoMinor == 0 && !keepAlive {
		resp.Close = true
	}
	te, hasTE := h["Transfer-Encoding"]
	delete(h, "Transfer-Encoding")
	noBody := req != nil && req.Method == http.MethodHead ||
		resp.StatusCode < 200 || resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified
	if noBody {
		body.done = true
		return nil
	}
	if hasTE {
		if len(te) != 1 || !h1wire.EqualFold(h1wire.TrimOWSString(te[0]), "chunked") {
			return fmt.Errorf("%w %q", ErrTE, te)
		}
		delete(h, "Content-Length") // the chunks frame the body (RFC 9112 6.3)
		resp.ContentLength, resp.TransferEncoding = -1, chunkedTE
		body.chunked = true
		return nil
	}
	if cl, ok := h["Content-Length"]; ok {
		n, ok := h1wire.ParseLength(cl[0])
		for _, v := range cl[1:] {
			if v != cl[0] {
				ok = false
			}
		}
		if !ok {
			return fmt.Errorf("%w %q", ErrContentLength, cl)
		}
		resp.ContentLength, body.remaining = n, n
		body.done = n == 0
		return nil
	}
	resp.ContentLength, body.toClose = -1, true // to the connection's close
	resp.Close = true
	return nil
}

// Body reads an answer's body off the connection's buffered reader. A body
// cut short fails with io.ErrUnexpectedEOF; its last bytes come with io.EOF
// when the end is already buffered, so the connection is free at once.
type Body struct {
	br        *bufio.Reader
	chunked   bool
	toClose   bool  // delimited by the connection's close
	remaining int64 // of the body (Content-Length) or of the current chunk
	chunkOpen bool  // chunked: within a chunk's data (its CRLF still due)
	done      bool
	err       error // sticky
}

func (b *Body) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if b.done {
		b.err = io.EOF
		return 0, io.EOF
	}
	n, err := b.read(p)
	if err != nil {
		b.err = err
	}
	return n, err
}

func (b *Body) read(p []byte) (int, error) {
	switch {
	case b.toClose:
		n, err := b.br.Read(p)
		if err == io.EOF {
			b.done = true
		}
		return n, err
	case !b.chunked:
		if int64(len(p)) > b.remaining {
			p = p[:b.remaining]
		}
		n, err := b.br.Read(p)
		b.remaining -= int64(n)
		if b.remaining == 0 {
			b.done = true
			return n, io.EOF
		}
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return n, err
	}
	// Chunks already buffered are read together, as net/http's reader
	// does: one write to the client for the events that came at once.
	// Nothing is waited for once bytes are in hand.
	total := 0
	for {
		if !b.chunkOpen || b.remaining == 0 {
			if total > 0 && !b.sizeBuffered() {
				return total, nil
			}
			if err := b.nextChunk(); err != nil {
				return total, err
			}
			if b.done {
				return total, io.EOF
			}
		}
		if total > 0 && b.br.Buffered() == 0 {
			return total, nil
		}
		q := p[total:]
		if int64(len(q)) > b.remaining {
			q = q[:b.remaining]
		}
		n, err := b.br.Read(q)
		total += n
		b.remaining -= int64(n)
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return total, err
		}
		if b.remaining > 0 || total == len(p) {
			return total, nil
		}
		// The chunk's CRLF, and the last chunk, when already here.
		buf, _ := b.br.Peek(b.br.Buffered())
		if len(buf) < 2 {
			return total, nil
		}
		if buf[0] != '\r' || buf[1] != '\n' {
			return total, h1wire.ErrChunk
		}
		_, _ = b.br.Discard(2)
		b.chunkOpen = false
		if bytes.HasPrefix(buf[2:], []byte("0\r\n\r\n")) {
			_, _ = b.br.Discard(5)
			b.done = true
			return total, io.EOF
		}
	}
}

// sizeBuffered reports whether the next chunk's size line is buffered
// whole and names a chunk with data (the last chunk may be followed by a
// trailer still to come).
func (b *Body) sizeBuffered() bool {
	if b.chunkOpen {
		return false // the chunk's CRLF is not here yet
	}
	buf, _ := b.br.Peek(b.br.Buffered())
	return len(buf) > 0 && buf[0] != '0' && bytes.IndexByte(buf, '\n') >= 0
}

// nextChunk ends the chunk read (its CRLF) and reads the next chunk-size
// line; the last chunk's trailer section is read and discarded.
func (b *Body) nextChunk() error {
	if b.chunkOpen {
		b.chunkOpen = false
		if err := h1wire.ChunkEnd(b.br); err != nil {
			return err
		}
	}
	size, err := h1wire.NextChunk(b.br)
	if err != nil {
		return err
	}
	b.remaining, b.chunkOpen, b.done = size, size > 0, size == 0
	return nil
}
