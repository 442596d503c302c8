package tokenizer

import (
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

func qwen3(t testing.TB) *Tokenizer { return loadModel(t, "qwen3") }

// Streaming a text's ids one by one gives the text back, each multi-byte
// character whole in one chunk, though byte-level tokens cut characters.
func TestStreamDecoderNeverCutsACharacter(t *testing.T) {
	tok := qwen3(t)
	for _, text := range []string{"日本語のテキスト", "emoji 🙂🙃 and 👩‍👩‍👧", "naïve café", "Привет, мир", "plain ascii"} {
		d := tok.NewStreamDecoder(false)
		var got strings.Builder
		for _, id := range tok.Encode(text) {
			chunk, err := d.Next(id)
			if err != nil {
				t.Fatal(err)
			}
			if !utf8.ValidString(chunk) {
				t.Fatalf("%q: chunk %q is not UTF-8", text, chunk)
			}
			got.WriteString(chunk)
		}
		got.WriteString(d.Flush())
		if got.String() != text {
			t.Errorf("streamed %q, want %q", got.String(), text)
		}
	}
	// An emoji is four bytes over several byte-level tokens: nothing comes out
	// until its last byte does.
	ids := tok.Encode("🙂")
	if len(ids) < 2 {
		t.Skipf("🙂 is one token here: %v", ids)
	}
	d := tok.NewStreamDecoder(false)
	for i, id := range ids {
		chunk, _ := d.Next(id)
		if last := i == len(ids)-1; (chunk != "") == !last {
			t.Errorf("token %d of %d gave %q", i+1, len(ids), chunk)
		}
	}
}

func TestStreamDecoderSpecialTokensAndUnknownIDs(t *testing.T) {
	tok := qwen3(t)
	end, ok := tok.TokenID("<|im_end|>")
	if !ok {
		t.Fatal("no <|im_end|>")
	}
	keep, skip := tok.NewStreamDecoder(false), tok.NewStreamDecoder(true)
	if s, _ := keep.Next(end); s != "<|im_end|>" {
		t.Errorf("kept special token: %q", s)
	}
	if s, _ := skip.Next(end); s != "" {
		t.Errorf("skipped special token: %q", s)
	}
	if _, err := keep.Next(uint32(tok.VocabSize()) + 5); err == nil {
		t.Error("an id past the vocabulary decoded")
	}
	if _, err := tok.Decode([]uint32{1 << 30}, false); err == nil {
		t.Error("Decode of an unknown id did not fail")
	}
}

// Random ids (any bytes, cut anywhere) always stream as valid UTF-8, never
// panic, and give exactly Decode's text whenever that is valid UTF-8.
func FuzzStreamDecoder(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3})
	f.Add([]byte("\xff\xfe\x00\x10\x20\x30\x40"))
	tok := qwen3(f) // loaded once per process, before any input is timed
	f.Fuzz(func(t *testing.T, seed []byte) {
		ids := make([]uint32, 0, len(seed)/2)
		for i := 0; i+1 < len(seed); i += 2 {
			ids = append(ids, (uint32(seed[i])<<8|uint32(seed[i+1]))*7%uint32(tok.VocabSize()))
		}
		d := tok.NewStreamDecoder(false)
		var got strings.Builder
		var raw []byte
		for _, id := range ids {
			chunk, err := d.Next(id)
			if err != nil {
				continue // an id the vocabulary leaves unused
			}
			raw, _ = tok.appendToken(raw, id, false)
			if !utf8.ValidString(chunk) {
				t.Fatalf("chunk %q is not UTF-8", chunk)
			}
			got.WriteString(chunk)
		}
		got.WriteString(d.Flush())
		if !utf8.ValidString(got.String()) {
			t.Fatalf("stream %q is not UTF-8", got.String())
		}
		if utf8.Valid(raw) && got.String() != string(raw) {
			t.Fatalf("streamed %q, want %q", got.String(), raw)
		}
	})
}

// Any text encodes without a panic and decodes back to itself (NFC, as the
// model's normalizer writes it).
func FuzzEncodeRoundTrip(f *testing.F) {
	for _, s := range []string{"hello world", "<|im_start|>user\n日本語<|im_end|>", "  \n\t x'S 123456 🙂", "e\u0301"} {
		f.Add(s)
	}
	tok := qwen3(f)
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		ids := tok.Encode(s)
		got, err := tok.Decode(ids, false)
		if err != nil {
			t.Fatal(err)
		}
		if want := norm.NFC.String(s); got != want {
			t.Fatalf("Decode(Encode(%q)) = %q", want, got)
		}
	})
}
