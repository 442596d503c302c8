package tokenizer

import "unicode/utf8"

// byteRune maps each byte to the printable character GPT-2's byte-level
// alphabet spells it with; runeByte is its inverse.
var byteRune, runeByte = byteLevelAlphabet()

func byteLevelAlphabet() ([256]rune, map[rune]byte) {
	var fwd [256]rune
	back := make(map[rune]byte, 256)
	n := 0
	for b := range 256 {
		if b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE && b <= 0xFF {
			fwd[b] = rune(b)
		} else {
			fwd[b] = rune(256 + n)
			n++
		}
		back[fwd[b]] = byte(b)
	}
	return fwd, back
}

// toByteLevel spells s's bytes in the byte-level alphabet.
func toByteLevel(s string) string {
	out := make([]byte, 0, len(s)*2)
	for i := 0; i < len(s); i++ {
		out = utf8.AppendRune(out, byteRune[s[i]])
	}
	return string(out)
}

// fromByteLevel appends the bytes a byte-level token spells.
func fromByteLevel(b []byte, token string) []byte {
	for _, r := range token {
		if c, ok := runeByte[r]; ok {
			b = append(b, c)
		} else {
			b = utf8.AppendRune(b, r) // not byte-level: an added token's own text
		}
	}
	return b
}

// ByteLevel spells s in GPT-2's byte-level alphabet, as a byte-level BPE
// vocabulary writes its tokens (a space is "Ġ"): for code that writes a
// tokenizer.json.
func ByteLevel(s string) string { return toByteLevel(s) }
