package openaigrpc

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"encoding/json"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"
)

// qwen3 is a real byte-level BPE model (multi-byte characters span tokens).
var qwen3 = sync.OnceValues(func() (*Model, error) {
	gz, err := os.ReadFile("../tokenizer/testdata/qwen3/tokenizer.json.gz")
	if err != nil {
		return nil, err
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return nil, err
	}
	tok, err := io.ReadAll(zr)
	if err != nil {
		return nil, err
	}
	cfg, err := os.ReadFile("../tokenizer/testdata/qwen3/tokenizer_config.json")
	if err != nil {
		return nil, err
	}
	return build(map[string][]byte{"tokenizer.json": tok, "tokenizer_config.json": cfg}, "qwen3", "qwen3")
})

func model(t testing.TB) *Model {
	m, err := qwen3()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// offline is a call with one choice and no engine: updates are applied by
// hand.
func offline(m *Model, chat, stream bool, stops []string) *Call {
	c := &Call{req: &Request{Chat: chat, Stream: stream, stops: stops}, model: "m", id: "x"}
	g := &gen{first: true, dec: m.Tok.NewStreamDecoder(true), stop: stopper{stops: stops}, cancel: func() {}}
	g.done.Store(true) // nothing to abort: there is no engine
	c.gens, c.live = []*gen{g}, 1
	return c
}

// contents reads an SSE transcript: each event's content or text, the
// finish reason, and whether every event was JSON.
func contents(t testing.TB, sse []byte) (texts []string, finish string) {
	sc := bufio.NewScanner(bytes.NewReader(sse))
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Choices []struct {
				Text         *string
				Delta        struct{ Content *string }
				FinishReason *string `json:"finish_reason"`
			}
		}
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("event is not JSON: %v: %s", err, line)
		}
		for _, ch := range ev.Choices {
			if s := ch.Text; s != nil && *s != "" {
				texts = append(texts, *s)
			}
			if s := ch.Delta.Content; s != nil && *s != "" {
				texts = append(texts, *s)
			}
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
	}
	return texts, finish
}

// TestStopStrings: a stop string is cut from the text with everything after
// it, even across tokens, and text that may begin one is held back until
// it cannot; the choice ends with "stop". Without a match, what was held
// comes out at the end.
func TestStopStrings(t *testing.T) {
	m := model(t)
	for _, c := range []struct {
		text  string
		stops []string
		want  string
		fin   string
	}{
		{"Hello world. The end is near.", []string{"end"}, "Hello world. The ", "stop"},
		{"Hello world. The end is near.", []string{"is near", "world"}, "Hello ", "stop"},
		{"Hello world.", []string{"worlds"}, "Hello world.", "length"},
		{"a\n\nb", []string{"\n\n"}, "a", "stop"},
		{"日本語のテキスト", []string{"のテ"}, "日本語", "stop"},
		{"no stop at all", nil, "no stop at all", "length"},
	} {
		ids := m.Tok.Encode(c.text)
		for _, stream := range []bool{true, false} {
			call := offline(m, true, stream, c.stops)
			var buf []byte
			for i, id := range ids {
				var err error
				if buf, err = call.apply(msg{u: Update{Tokens: []uint32{id}, Completion: uint32(i + 1)}}, buf); err != nil {
					t.Fatal(err)
				}
			}
			buf, _ = call.apply(msg{u: Update{Complete: true, Finish: "length", Tokens: ids}}, buf)
			got, fin := string(call.gens[0].text), call.gens[0].finish
			if stream {
				texts, f := contents(t, buf)
				got, fin = strings.Join(texts, ""), f
			}
			if got != c.want || fin != c.fin {
				t.Errorf("%q stops %q (stream %v): %q finish %q, want %q finish %q", c.text, c.stops, stream, got, fin, c.want, c.fin)
			}
		}
	}
}

// FuzzDetokenize: any ids, in any batches, with any stop string, come out
// as JSON events whose texts are valid UTF-8 (never half a character), or
// as an error naming an unknown id; never a panic.
func FuzzDetokenize(f *testing.F) {
	m := model(f)
	f.Add([]byte{0x10, 0x27, 0, 0, 0xff, 0xff, 0x01, 0}, "e", uint8(2))
	f.Add(binary.LittleEndian.AppendUint32(nil, 151643), "", uint8(1))
	f.Add([]byte("\xe6\x97\xa5\xe6\x9c\xac"), "\n", uint8(3))
	f.Fuzz(func(t *testing.T, raw []byte, stop string, batch uint8) {
		var ids []uint32
		for len(raw) >= 3 {
			ids = append(ids, uint32(raw[0])|uint32(raw[1])<<8|uint32(raw[2]&0x3)<<16) // up to 2^18: past the vocabulary too
			raw = raw[3:]
		}
		var stops []string
		if stop != "" {
			stops = []string{stop}
		}
		call := offline(m, len(ids)%2 == 0, true, stops)
		size := max(int(batch)%8, 1)
		var buf []byte
		var err error
		for i := 0; i < len(ids) && err == nil; i += size {
			buf, err = call.apply(msg{u: Update{Tokens: ids[i:min(i+size, len(ids))]}}, buf)
		}
		if err == nil {
			buf, err = call.apply(msg{u: Update{Complete: true, Finish: "length"}}, buf)
		}
		texts, _ := contents(t, buf)
		for _, s := range texts {
			if !utf8.ValidString(s) {
				t.Fatalf("an event's text is not UTF-8: %q", s)
			}
		}
		if err != nil && !strings.Contains(err.Error(), "unknown token id") {
			t.Fatalf("unexpected error: %v", err)
		}
	})
}
