package engine

import (
	"bytes"
	"fmt"
	"strconv"
	"unsafe"
)

// jsonScanner is a single-pass, allocation-free JSON reader for the one hot
// answer a poller decodes at fleet scale, SGLang's /v1/loads. It validates
// the whole document as encoding/json would, but only materialises the few
// numbers a Rank needs and skips everything else in place.
type jsonScanner struct {
	b []byte
	i int
}

// maxJSONDepth matches encoding/json's nesting limit.
const maxJSONDepth = 10000

func (s *jsonScanner) fail() error { return fmt.Errorf("invalid JSON near offset %d", s.i) }

func (s *jsonScanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// peek skips whitespace and returns the next byte (0 at the end).
func (s *jsonScanner) peek() byte {
	s.ws()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *jsonScanner) lit(word string) bool {
	if bytes.HasPrefix(s.b[s.i:], []byte(word)) {
		s.i += len(word)
		return true
	}
	return false
}

// str consumes a string and returns its raw contents, escapes left in place.
func (s *jsonScanner) str() ([]byte, bool) {
	if s.peek() != '"' {
		return nil, false
	}
	s.i++
	start := s.i
	// Fast path: most strings have no escape; find the closing quote and
	// check the span once.
	if n := bytes.IndexByte(s.b[start:], '"'); n >= 0 {
		plain := true
		for _, c := range s.b[start : start+n] {
			if c < 0x20 || c == '\\' {
				plain = false
				break
			}
		}
		if plain {
			s.i = start + n + 1
			return s.b[start : start+n], true
		}
	}
	for s.i < len(s.b) {
		switch c := s.b[s.i]; {
		case c == '"':
			raw := s.b[start:s.i]
			s.i++
			return raw, true
		case c == '\\':
			if s.i+1 >= len(s.b) {
				return nil, false
			}
			switch s.b[s.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i += 2
			case 'u':
				if s.i+6 > len(s.b) || !isHex4(s.b[s.i+2:s.i+6]) {
					return nil, false
				}
				s.i += 6
			default:
				return nil, false
			}
		case c < 0x20:
			return nil, false
		default:
			s.i++
		}
	}
	return nil, false
}

func isHex4(b []byte) bool {
	for _, c := range b {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

func (s *jsonScanner) digits() bool {
	start := s.i
	for s.i < len(s.b) && '0' <= s.b[s.i] && s.b[s.i] <= '9' {
		s.i++
	}
	return s.i > start
}

// numLit consumes a number in JSON's grammar and returns its text.
func (s *jsonScanner) numLit() ([]byte, bool) {
	s.ws()
	start := s.i
	if s.i < len(s.b) && s.b[s.i] == '-' {
		s.i++
	}
	switch {
	case s.i < len(s.b) && s.b[s.i] == '0':
		s.i++
	case s.i < len(s.b) && '1' <= s.b[s.i] && s.b[s.i] <= '9':
		s.digits()
	default:
		return nil, false
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if !s.digits() {
			return nil, false
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if !s.digits() {
			return nil, false
		}
	}
	return s.b[start:s.i], true
}

// num consumes a number and converts it. Like encoding/json decoding into a
// float64, a number beyond float64's range is an error.
func (s *jsonScanner) num() (float64, bool) {
	lit, ok := s.numLit()
	if !ok {
		return 0, false
	}
	// Counts are small integers: convert them exactly without ParseFloat.
	if len(lit) <= 15 {
		var v float64
		neg, digits := false, lit
		if digits[0] == '-' {
			neg, digits = true, digits[1:]
		}
		integer := true
		for _, c := range digits {
			if c < '0' || c > '9' {
				integer = false
				break
			}
			v = v*10 + float64(c-'0')
		}
		if integer {
			if neg {
				v = -v
			}
			return v, true
		}
	}
	// The bytes are not modified while ParseFloat reads them, so viewing them
	// as a string saves an allocation per number.
	v, err := strconv.ParseFloat(unsafe.String(unsafe.SliceData(lit), len(lit)), 64)
	return v, err == nil
}

// numOrNull reads a number; null leaves *dst untouched and reports set=false.
func (s *jsonScanner) numOrNull(dst *float64) (set, ok bool) {
	if s.peek() == 'n' {
		return false, s.lit("null")
	}
	v, ok := s.num()
	if ok {
		*dst = v
	}
	return ok, ok
}

// skip consumes any value.
func (s *jsonScanner) skip(depth int) bool {
	if depth > maxJSONDepth {
		return false
	}
	switch s.peek() {
	case '"':
		_, ok := s.str()
		return ok
	case '{':
		return s.object(depth, func([]byte) bool { return s.skip(depth + 1) })
	case '[':
		return s.array(depth, func(int) bool { return s.skip(depth + 1) })
	case 't':
		return s.lit("true")
	case 'f':
		return s.lit("false")
	case 'n':
		return s.lit("null")
	}
	_, ok := s.numLit() // a skipped number is never converted, so never out of range
	return ok
}

// object consumes an object, calling value for each key with the scanner on
// the key's value, which value must consume.
func (s *jsonScanner) object(depth int, value func(key []byte) bool) bool {
	if depth > maxJSONDepth || s.peek() != '{' {
		return false
	}
	s.i++
	if s.peek() == '}' {
		s.i++
		return true
	}
	for {
		key, ok := s.str()
		if !ok || s.peek() != ':' {
			return false
		}
		s.i++
		if !value(key) {
			return false
		}
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			return true
		default:
			return false
		}
	}
}

// array consumes an array, calling elem with each element's index.
func (s *jsonScanner) array(depth int, elem func(i int) bool) bool {
	if depth > maxJSONDepth || s.peek() != '[' {
		return false
	}
	s.i++
	if s.peek() == ']' {
		s.i++
		return true
	}
	for n := 0; ; n++ {
		if !elem(n) {
			return false
		}
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			s.i++
			return true
		default:
			return false
		}
	}
}

// keyIs matches a key as encoding/json matches struct fields: ASCII case folded.
func keyIs(key []byte, name string) bool { return bytes.EqualFold(key, []byte(name)) }
