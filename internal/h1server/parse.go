package h1server

import (
	"bufio"
	"bytes"
	"net/http"
	"net/url"

	"github.com/smg-project/smg/internal/h1wire"
)

// Limits bound what a client may send before its handler runs. Zero fields
// take the defaults, which are nginx's (large_client_header_buffers 4 8k)
// widened to 64 KiB of header.
type Limits struct {
	MaxLineBytes   int // the request line or one header field, CRLF excluded (414 / 431 past it)
	MaxHeaderBytes int // the request line and every header field together (431 past it)
	MaxHeaders     int // header fields (431 past it)
}

// Defaults of Limits.
const (
	DefaultMaxLineBytes   = 8 << 10
	DefaultMaxHeaderBytes = 64 << 10
	DefaultMaxHeaders     = 100
)

func (l Limits) withDefaults() Limits {
	if l.MaxLineBytes <= 0 {
		l.MaxLineBytes = DefaultMaxLineBytes
	}
	if l.MaxHeaderBytes <= 0 {
		l.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if l.MaxHeaders <= 0 {
		l.MaxHeaders = DefaultMaxHeaders
	}
	return l
}

// statusError is a request refused before its handler: the status answered
// before the connection closes.
type statusError struct {
	status int
	msg    string
}

func (e *statusError) Error() string { return e.msg }

func refuse(status int, msg string) error { return &statusError{status, msg} }

var (
	errURITooLong     = refuse(http.StatusRequestURITooLong, "request line too long")
	errHeaderTooLarge = refuse(http.StatusRequestHeaderFieldsTooLarge, "request header too large")
	errTooManyHeaders = refuse(http.StatusRequestHeaderFieldsTooLarge, "too many header fields")
	errBareLF         = refuse(http.StatusBadRequest, "line not ended by CRLF")
	errBadRequestLine = refuse(http.StatusBadRequest, "malformed request line")
	errBadMethod      = refuse(http.StatusBadRequest, "invalid method")
	errBadTarget      = refuse(http.StatusBadRequest, "invalid request target")
	errBadVersion     = refuse(http.StatusBadRequest, "malformed HTTP version")
	errVersion        = refuse(http.StatusHTTPVersionNotSupported, "unsupported HTTP version")
	errObsFold        = refuse(http.StatusBadRequest, "obsolete line folding")
	errBadHeader      = refuse(http.StatusBadRequest, "malformed header field")
	errBadHeaderValue = refuse(http.StatusBadRequest, "invalid header field value")
	errNoHost         = refuse(http.StatusBadRequest, "missing Host header")
	errTwoHosts       = refuse(http.StatusBadRequest, "more than one Host header")
	errBadHost        = refuse(http.StatusBadRequest, "invalid Host header")
	errBadLength      = refuse(http.StatusBadRequest, "invalid Content-Length")
	errTwoLengths     = refuse(http.StatusBadRequest, "more than one Content-Length")
	errLengthAndTE    = refuse(http.StatusBadRequest, "both Content-Length and Transfer-Encoding")
	errTEVersion      = refuse(http.StatusBadRequest, "Transfer-Encoding in an HTTP/1.0 request")
	errTE             = refuse(http.StatusNotImplemented, "unsupported Transfer-Encoding")
	errExpect         = refuse(http.StatusExpectationFailed, "unsupported Expect")
)

// reqHead is what the parser learned beyond the http.Request's own fields.
type reqHead struct {
	chunked  bool
	length   int64 // Content-Length; -1 chunked
	expect   bool  // Expect: 100-continue on HTTP/1.1
	close    bool  // the connection ends after this request
	hdrBytes int
}

// parser reads requests off one connection. Its scratch state is reused
// from request to request.
type parser struct {
	br     *bufio.Reader
	limits Limits
	long   []byte // a line longer than the bufio buffer
	// beforeWait runs before a read that would block for header bytes (the
	// header deadline); nil: none.
	beforeWait func()
	waited     bool

	url     url.URL
	lastURI string
	vals    []string          // backing store of the header values, one per field
	last    map[string]string // each field's previous value on this connection, to reuse its string
	te      []string
}

// readLine returns the next line without its CRLF.
func (p *parser) readLine(tooLong error) ([]byte, error) {
	if !p.waited && p.beforeWait != nil {
		if b, _ := p.br.Peek(p.br.Buffered()); bytes.IndexByte(b, '\n') < 0 {
			p.waited = true
			p.beforeWait()
		}
	}
	line, err := p.br.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		p.long = append(p.long[:0], line...)
		for err == bufio.ErrBufferFull {
			if len(p.long) > p.limits.MaxLineBytes+2 {
				return nil, tooLong
			}
			line, err = p.br.ReadSlice('\n')
			p.long = append(p.long, line...)
		}
		line = p.long
	}
	if err != nil {
		return nil, err
	}
	if len(line) > p.limits.MaxLineBytes+2 {
		return nil, tooLong
	}
	if len(line) < 2 || line[len(line)-2] != '\r' {
		return nil, errBareLF
	}
	return line[:len(line)-2], nil
}

// readRequest parses one request head into req, reusing req's Header map.
// Its body is not set up here. The caller sets p.waited (false: call
// beforeWait before the first read that would block). An empty line before
// the request line is refused, as net/http does.
func (p *parser) readRequest(req *http.Request, h *reqHead) error {
	*h = reqHead{}
	line, err := p.readLine(errURITooLong)
	if err != nil {
		return err
	}
	if len(line) == 0 {
		return errBadRequestLine
	}
	h.hdrBytes = len(line) + 2
	method, target, minor, err := parseRequestLine(line)
	if err != nil {
		return err
	}
	hdr := req.Header
	clear(hdr)
	*req = http.Request{
		Method:     internMethod(method),
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: minor,
		Header:     hdr,
	}
	if minor == 0 {
		req.Proto = "HTTP/1.0"
	}
	if err := p.parseTarget(req, target); err != nil {
		return err
	}
	if err := p.readHeader(req, h); err != nil {
		return err
	}
	return p.interpret(req, h)
}

func parseRequestLine(line []byte) (method, target []byte, minor int, err error) {
	sp := bytes.IndexByte(line, ' ')
	if sp <= 0 {
		return nil, nil, 0, errBadRequestLine
	}
	method, rest := line[:sp], line[sp+1:]
	if sp = bytes.IndexByte(rest, ' '); sp <= 0 {
		return nil, nil, 0, errBadRequestLine
	}
	target, version := rest[:sp], rest[sp+1:]
	if !h1wire.ValidToken(method) {
		return nil, nil, 0, errBadMethod
	}
	for _, b := range target {
		if b <= ' ' || b >= 0x7f || b == '#' {
			return nil, nil, 0, errBadTarget
		}
	}
	switch string(version) {
	case "HTTP/1.1":
		return method, target, 1, nil
	case "HTTP/1.0":
		return method, target, 0, nil
	}
	if len(version) == 8 && string(version[:5]) == "HTTP/" && isDigit(version[5]) && version[6] == '.' && isDigit(version[7]) {
		return nil, nil, 0, errVersion
	}
	return nil, nil, 0, errBadVersion
}

func isDigit(b byte) bool { return '0' <= b && b <= '9' }

// parseTarget sets RequestURI and URL. An origin-form target without
// escapes (the usual one) is split in place; anything else goes through
// url.ParseRequestURI, as net/http does.
func (p *parser) parseTarget(req *http.Request, target []byte) error {
	if p.lastURI != string(target) {
		p.lastURI = string(target) // a kept-alive client asks for the same one again and again
	}
	req.RequestURI = p.lastURI
	if q := plainPath(target); q > 0 {
		p.url = url.URL{Path: req.RequestURI[:q]}
		if q < len(target) {
			p.url.RawQuery = req.RequestURI[q+1:]
			p.url.ForceQuery = q == len(target)-1
		}
		req.URL = &p.url
		return nil
	}
	if req.RequestURI == "*" && req.Method == http.MethodOptions {
		p.url = url.URL{Path: "*"}
		req.URL = &p.url
		return nil
	}
	u, err := url.ParseRequestURI(req.RequestURI)
	if err != nil || (u.Scheme == "" && target[0] != '/') {
		return errBadTarget
	}
	req.URL = u
	return nil
}

// plainPath returns the length of target's path when it starts with a slash
// and holds only bytes url.URL keeps as they are (so Path is the bytes
// themselves and RawPath is empty), else 0.
func plainPath(target []byte) int {
	if target[0] != '/' {
		return 0
	}
	for i, c := range target {
		if c == '?' {
			return i
		}
		if !pathPlain[c] {
			return 0
		}
	}
	return len(target)
}

var pathPlain = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for _, c := range "-_.~$&+,/:;=@" {
		t[c] = true
	}
	return t
}()

// readHeader reads header fields up to the empty line.
func (p *parser) readHeader(req *http.Request, h *reqHead) error {
	p.vals = p.vals[:0]
	if len(p.last) > 2*p.limits.MaxHeaders {
		clear(p.last)
	}
	n := 0
	for {
		line, err := p.readLine(errHeaderTooLarge)
		if err != nil {
			return err
		}
		if h.hdrBytes += len(line) + 2; h.hdrBytes > p.limits.MaxHeaderBytes {
			return errHeaderTooLarge
		}
		if len(line) == 0 {
			return nil
		}
		if n++; n > p.limits.MaxHeaders {
			return errTooManyHeaders
		}
		if line[0] == ' ' || line[0] == '\t' {
			return errObsFold
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 || !h1wire.ValidToken(line[:colon]) {
			return errBadHeader // whitespace before the colon among them
		}
		name, value := line[:colon], h1wire.TrimOWS(line[colon+1:])
		if !h1wire.ValidValue(value) {
			return errBadHeaderValue
		}
		key := h1wire.CanonicalKey(name)
		v, ok := p.last[key]
		if !ok || v != string(value) {
			v = string(value)
			if p.last == nil {
				p.last = map[string]string{}
			}
			p.last[key] = v
		}
		if old, dup := req.Header[key]; dup {
			req.Header[key] = append(old, v)
			continue
		}
		p.vals = append(p.vals, v)
		req.Header[key] = p.vals[len(p.vals)-1 : len(p.vals) : len(p.vals)]
	}
}

// interpret applies the fields that frame the request: Host, the body's
// length, Connection and Expect. Whatever could let two parsers see two
// different requests in the same bytes is refused.
func (p *parser) interpret(req *http.Request, h *reqHead) error {
	hosts := req.Header["Host"]
	switch {
	case len(hosts) > 1:
		return errTwoHosts
	case len(hosts) == 1:
		if !validHost(hosts[0]) {
			return errBadHost
		}
		req.Host = hosts[0]
	case req.ProtoMinor == 1:
		return errNoHost
	}
	delete(req.Header, "Host")
	if req.URL.Host != "" {
		req.Host = req.URL.Host // absolute form wins (RFC 9112 3.2.2)
	}

	cl, te := req.Header["Content-Length"], req.Header["Transfer-Encoding"]
	switch {
	case len(cl) > 0 && len(te) > 0:
		return errLengthAndTE
	case len(te) > 0:
		if req.ProtoMinor == 0 {
			return errTEVersion
		}
		if len(te) != 1 || !h1wire.EqualFold(te[0], "chunked") {
			return errTE
		}
		delete(req.Header, "Transfer-Encoding")
		h.chunked, h.length = true, -1
		if p.te == nil {
			p.te = []string{"chunked"}
		}
		req.TransferEncoding = p.te[:1:1]
	case len(cl) > 1:
		return errTwoLengths
	case len(cl) == 1:
		n, ok := h1wire.ParseLength(cl[0])
		if !ok {
			return errBadLength
		}
		h.length = n
	}
	req.ContentLength = h.length

	keepAlive := false
	for _, v := range req.Header["Connection"] {
		for tok := range h1wire.Tokens(v) {
			switch {
			case h1wire.EqualFold(tok, "close"):
				h.close = true
			case h1wire.EqualFold(tok, "keep-alive"):
				keepAlive = true
			}
		}
	}
	if req.ProtoMinor == 0 && !keepAlive {
		h.close = true
	}
	req.Close = h.close

	if ex := req.Header["Expect"]; len(ex) > 0 {
		if len(ex) != 1 || !h1wire.EqualFold(ex[0], "100-continue") {
			return errExpect
		}
		h.expect = req.ProtoMinor == 1 && h.length != 0
	}
	return nil
}

// validHost accepts a uri-host with an optional port: reg-name and IP
// literal characters, no whitespace, slash, at sign or control byte.
func validHost(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', isDigit(c):
		case bytes.IndexByte([]byte("-._~!$&'()*+,;=:[]%"), c) >= 0:
		default:
			return false
		}
	}
	return true
}

func internMethod(b []byte) string {
	switch string(b) {
	case http.MethodGet:
		return http.MethodGet
	case http.MethodPost:
		return http.MethodPost
	case http.MethodHead:
		return http.MethodHead
	case http.MethodPut:
		return http.MethodPut
	case http.MethodDelete:
		return http.MethodDelete
	case http.MethodOptions:
		return http.MethodOptions
	case http.MethodPatch:
		return http.MethodPatch
	}
	return string(b)
}
