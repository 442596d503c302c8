// Package h1wire holds the HTTP/1.1 grammar the lean server and the lean
// client share: tokens, field values, lists, Content-Length, chunk lines
// and canonical field names.
package h1wire

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strconv"
)

var (
	// ErrChunk is a malformed chunk-size line, chunk end or trailer.
	ErrChunk = errors.New("malformed chunked encoding")
	// ErrChunkTooLarge is a chunk size of more than 15 hex digits.
	ErrChunkTooLarge = errors.New("chunk size too large")
)

// MaxChunkLine bounds a chunk-size line with its extensions.
const MaxChunkLine = 4096

// ValidValue: field-content bytes (VCHAR, obs-text, SP, HTAB).
func ValidValue(v []byte) bool {
	for _, b := range v {
		if (b < ' ' && b != '\t') || b == 0x7f {
			return false
		}
	}
	return true
}

// ParseLength parses a Content-Length: decimal digits only, no sign, no
// list, no overflow.
func ParseLength(s string) (int64, bool) {
	if s == "" || len(s) > 18 {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// Tokens yields the comma-separated elements of a list field, trimmed.
func Tokens(v string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for v != "" {
			i := 0
			for i < len(v) && v[i] != ',' {
				i++
			}
			tok := TrimOWSString(v[:i])
			if i < len(v) {
				i++
			}
			v = v[i:]
			if tok != "" && !yield(tok) {
				return
			}
		}
	}
}

// TrimOWS drops the optional whitespace (SP, HTAB) around b.
func TrimOWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// TrimOWSString is TrimOWS of a string.
func TrimOWSString(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

// EqualFold compares ASCII strings case-insensitively.
func EqualFold(s, t string) bool {
	if len(s) != len(t) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if lower(s[i]) != lower(t[i]) {
			return false
		}
	}
	return true
}

func lower(b byte) byte {
	if 'A' <= b && b <= 'Z' {
		return b + 'a' - 'A'
	}
	return b
}

// IsTchar: tchar (RFC 9110 5.6.2).
var IsTchar = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

// ValidToken: one or more tchars.
func ValidToken(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if !IsTchar[c] {
			return false
		}
	}
	return true
}

// CanonicalKey is name in canonical form (textproto.CanonicalMIMEHeaderKey
// for a valid token, name rewritten in place), from a table for common
// fields so they cost nothing.
func CanonicalKey(name []byte) string {
	Canonicalize(name)
	if k, ok := CommonKey(name); ok {
		return k
	}
	return string(name)
}

// Canonicalize rewrites a valid token in canonical form, in place.
func Canonicalize(name []byte) {
	upper := true
	for i, c := range name {
		if upper {
			if 'a' <= c && c <= 'z' {
				name[i] = c - 'a' + 'A'
			}
		} else if 'A' <= c && c <= 'Z' {
			name[i] = c + 'a' - 'A'
		}
		upper = c == '-'
	}
}

// CommonKey returns the interned string of a common canonical field name.
func CommonKey(name []byte) (string, bool) {
	k, ok := commonKeys[string(name)]
	return k, ok
}

var commonKeys = func() map[string]string {
	m := map[string]string{}
	for _, k := range []string{
		"Accept", "Accept-Encoding", "Accept-Language", "Authorization", "Cache-Control", "Connection",
		"Content-Length", "Content-Type", "Cookie", "Expect", "Host", "Keep-Alive", "Origin", "Pragma",
		"Referer", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "User-Agent", "Via",
		"X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host", "X-Request-Id", "Traceparent",
		"Tracestate", "Openai-Organization", "Openai-Project", "X-Api-Key",
		// answers
		"Date", "Server", "Content-Encoding", "Retry-After", "Vary", "X-Smg-Error-Code",
	} {
		m[k] = k
	}
	return m
}()

// ReadChunkLine reads a chunk-size (or trailer) line without its CRLF.
func ReadChunkLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err == bufio.ErrBufferFull || len(line) > MaxChunkLine {
		return nil, ErrChunk
	}
	if err != nil {
		return nil, Unexpected(err)
	}
	if len(line) < 2 || line[len(line)-2] != '\r' {
		return nil, ErrChunk
	}
	return line[:len(line)-2], nil
}

// ParseChunkSize parses "HEX[;ext...]": hex digits only, at most 15 of
// them, extensions without control bytes (and ignored).
func ParseChunkSize(line []byte) (int64, error) {
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
			return 0, ErrChunkTooLarge
		}
		n = n<<4 | int64(d)
	}
ext:
	if i == 0 {
		return 0, ErrChunk
	}
	rest := line[i:]
	for len(rest) > 0 && (rest[0] == ' ' || rest[0] == '\t') {
		rest = rest[1:]
	}
	if len(rest) > 0 && rest[0] != ';' {
		return 0, ErrChunk
	}
	for _, c := range rest {
		if (c < ' ' && c != '\t') || c == 0x7f {
			return 0, ErrChunk
		}
	}
	return n, nil
}

// MaxTrailerBytes bounds a chunked body's trailer section.
const MaxTrailerBytes = 8 << 10

// NextChunk reads a chunk-size line; for the last chunk (size 0) it also
// reads the trailer section, which is checked and discarded.
func NextChunk(br *bufio.Reader) (int64, error) {
	line, err := ReadChunkLine(br)
	if err != nil {
		return 0, err
	}
	size, err := ParseChunkSize(line)
	if err != nil || size > 0 {
		return size, err
	}
	total := 0
	for {
		line, err := ReadChunkLine(br)
		if err != nil {
			return 0, err
		}
		if len(line) == 0 {
			return 0, nil
		}
		if total += len(line) + 2; total > MaxTrailerBytes {
			return 0, ErrChunk
		}
		if !ValidField(line) {
			return 0, ErrChunk
		}
	}
}

// ChunkEnd reads the CRLF that ends a chunk's data.
func ChunkEnd(br *bufio.Reader) error {
	var crlf [2]byte
	if _, err := io.ReadFull(br, crlf[:]); err != nil {
		return Unexpected(err)
	}
	if crlf != [2]byte{'\r', '\n'} {
		return ErrChunk
	}
	return nil
}

// ValidField: a header field line, "name: value" (trailers are checked so).
func ValidField(line []byte) bool {
	colon := bytes.IndexByte(line, ':')
	return colon > 0 && ValidToken(line[:colon]) && ValidValue(line[colon+1:])
}

// Unexpected turns io.EOF into io.ErrUnexpectedEOF: a body cut short.
func Unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}
