package tokenizer

import "strings"

// StreamDecoder turns a generation's ids into text as they arrive, one
// token's text at a time, never cutting a multi-byte character: bytes of a
// character that a later token completes are held until it comes.
type StreamDecoder struct {
	t           *Tokenizer
	skipSpecial bool
	pending     []byte
}

// NewStreamDecoder starts a stream; special tokens are left out when
// skipSpecial is set (as engines do for a completion's text).
func (t *Tokenizer) NewStreamDecoder(skipSpecial bool) *StreamDecoder {
	return &StreamDecoder{t: t, skipSpecial: skipSpecial}
}

// Next returns the text id completes ("" while a character is incomplete).
// An unknown id is an error and changes nothing.
func (d *StreamDecoder) Next(id uint32) (string, error) {
	b, err := d.t.appendToken(d.pending, id, d.skipSpecial)
	if err != nil {
		return "", err
	}
	held := incompleteTail(b)
	out := strings.ToValidUTF8(string(b[:len(b)-held]), "\uFFFD")
	d.pending = append(d.pending[:0], b[len(b)-held:]...)
	return out, nil
}

// Flush ends the stream: bytes still held (a character the generation never
// completed) come out as U+FFFD.
func (d *StreamDecoder) Flush() string {
	out := strings.ToValidUTF8(string(d.pending), "\uFFFD")
	d.pending = d.pending[:0]
	return out
}

// incompleteTail is the length of the UTF-8 character b ends inside of: a
// lead byte followed by fewer continuation bytes than it announces (0 when b
// ends on a whole character or on bytes no later byte can make valid).
func incompleteTail(b []byte) int {
	for n := 1; n <= 3 && n <= len(b); n++ {
		c := b[len(b)-n]
		if c&0xC0 == 0x80 {
			continue // a continuation byte: look further back for its lead
		}
		need := 0
		switch {
		case c&0xE0 == 0xC0:
			need = 2
		case c&0xF0 == 0xE0:
			need = 3
		case c&0xF8 == 0xF0:
			need = 4
		}
		if need > n {
			return n // the lead byte announces more bytes than follow it
		}
		return 0
	}
	return 0
}
