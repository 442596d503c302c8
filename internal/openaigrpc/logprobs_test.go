package openaigrpc

import (
	"bufio"
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
)

// TestLogprobsShape: the logprobs objects are OpenAI's (and vLLM's): a chat
// choice's {"content":[{token, logprob, bytes, top_logprobs}]}, a text
// completion's {text_offset, token_logprobs, tokens, top_logprobs} with each
// position's map holding the token said first and each text once; a logprob
// JSON cannot carry is -9999.
func TestLogprobsShape(t *testing.T) {
	toks := []lpToken{
		{lpAlt: lpAlt{raw: "Hi", lp: -0.25}, top: []lpAlt{{raw: "Hi", lp: -0.25}, {raw: " yo", lp: -1.5}}},
		{lpAlt: lpAlt{raw: "\xe6\x97", lp: float32(math.Inf(-1))}},
	}
	chat := string(appendChatLogprobs(nil, toks))
	wantChat := `{"content":[` +
		`{"token":"Hi","logprob":-0.25,"bytes":[72,105],"top_logprobs":[{"token":"Hi","logprob":-0.25,"bytes":[72,105]},{"token":" yo","logprob":-1.5,"bytes":[32,121,111]}]},` +
		`{"token":"` + "\ufffd" + `","logprob":-9999,"bytes":[230,151],"top_logprobs":[]}]}`
	if chat != wantChat {
		t.Errorf("chat:\n got %s\nwant %s", chat, wantChat)
	}
	text, next := appendCompletionLogprobs(nil, toks, 7)
	wantText := `{"text_offset":[7,9],"token_logprobs":[-0.25,-9999],"tokens":["Hi","` + "\ufffd" +
		`"],"top_logprobs":[{"Hi":-0.25," yo":-1.5},{"` + "\ufffd" + `":-9999}]}`
	if string(text) != wantText || next != 10 {
		t.Errorf("completion:\n got %s (next offset %d)\nwant %s (10)", text, next, wantText)
	}
	for _, b := range [][]byte{[]byte(chat), text} {
		if !json.Valid(b) {
			t.Errorf("not JSON: %s", b)
		}
	}
	for v, want := range map[float32]string{float32(math.NaN()): "-9999", -1e9: "-9999", float32(math.Inf(1)): "0", -0.1: "-0.1", -3: "-3"} {
		if got := string(appendLogprob(nil, v)); got != want {
			t.Errorf("logprob %v: %s, want %s", v, got, want)
		}
	}
}

// TestLogprobsFollowText: streamed, a token's logprobs go with the first
// event that carries text from it on (a character split over tokens comes
// with the token that completes it), every token once, their bytes spelling
// the whole text; a completion that lists every position again adds none;
// without a stream every position is listed once.
func TestLogprobsFollowText(t *testing.T) {
	m := model(t)
	text := "ok 🦙 done"
	ids := m.Tok.Encode(text)
	lps := make([]TokenLogprob, len(ids))
	for i, id := range ids {
		lps[i] = TokenLogprob{Logprob: -float32(i) / 4, Top: []TopLogprob{{ID: id, Logprob: -float32(i) / 4}}}
	}
	for _, stream := range []bool{true, false} {
		for _, chat := range []bool{true, false} {
			call := offline(m, chat, stream, nil)
			call.tok, call.req.withLogprobs, call.req.topLogprobs = m.Tok, true, 1
			var buf []byte
			var err error
			for i, id := range ids {
				if buf, err = call.apply(msg{u: Update{Tokens: []uint32{id}, Logprobs: lps[i : i+1]}}, buf); err != nil {
					t.Fatal(err)
				}
			}
			if buf, err = call.apply(msg{u: Update{Complete: true, Finish: "stop", Tokens: ids, Logprobs: lps}}, buf); err != nil {
				t.Fatal(err)
			}
			if !stream {
				buf = call.final()
			}
			positions, spelled, lpBytes := 0, "", ""
			sc := bufio.NewScanner(bytes.NewReader(buf))
			sc.Buffer(nil, 1<<20)
			for sc.Scan() {
				line := strings.TrimPrefix(sc.Text(), "data: ")
				if line == "" || line == "[DONE]" {
					continue
				}
				var ev struct {
					Choices []struct {
						Text     string
						Delta    struct{ Content string }
						Message  struct{ Content string }
						Logprobs *struct {
							Content []struct {
								Bytes []byte
							}
							Tokens     []string
							TextOffset []int `json:"text_offset"`
						}
					}
				}
				// bytes are a list of numbers, not base64: read them as ints.
				line = bytesAsInts(line)
				if err := json.Unmarshal([]byte(line), &ev); err != nil {
					t.Fatalf("%s: %v", line, err)
				}
				ch := ev.Choices[0]
				evText := ch.Text + ch.Delta.Content + ch.Message.Content
				if ch.Logprobs == nil {
					if evText != "" {
						t.Errorf("chat %v stream %v: text %q without logprobs", chat, stream, evText)
					}
					continue
				}
				for _, c := range ch.Logprobs.Content {
					lpBytes += string(c.Bytes)
				}
				positions += len(ch.Logprobs.Content) + len(ch.Logprobs.Tokens)
				spelled += evText
			}
			if positions != len(ids) || spelled != text || (chat && lpBytes != text) {
				t.Errorf("chat %v stream %v: %d positions for %d tokens, text %q, logprobs' bytes %q", chat, stream, positions, len(ids), spelled, lpBytes)
			}
		}
	}
}

// bytesAsInts turns "bytes":[1,2] into a JSON string of those bytes so that
// encoding/json reads it into a []byte-like string field.
func bytesAsInts(line string) string {
	var v any
	if json.Unmarshal([]byte(line), &v) != nil {
		return line
	}
	var walk func(any) any
	walk = func(x any) any {
		switch x := x.(type) {
		case map[string]any:
			for k, e := range x {
				if k == "bytes" {
					var b []byte
					for _, n := range e.([]any) {
						b = append(b, byte(n.(float64)))
					}
					x[k] = b // marshalled as base64, which []byte reads back
					continue
				}
				x[k] = walk(e)
			}
		case []any:
			for i := range x {
				x[i] = walk(x[i])
			}
		}
		return x
	}
	out, _ := json.Marshal(walk(v))
	return string(out)
}

// TestLogprobsThatDoNotLineUp: an engine whose logprobs do not match its
// tokens is an engine fault (502), never a panic.
func TestLogprobsThatDoNotLineUp(t *testing.T) {
	m := model(t)
	ids := m.Tok.Encode("hello there")
	call := offline(m, true, true, nil)
	call.tok, call.req.withLogprobs = m.Tok, true
	if _, err := call.apply(msg{u: Update{Tokens: ids, Logprobs: []TokenLogprob{{Logprob: -1}}}}, nil); err == nil || !strings.Contains(err.Error(), "logprobs for 1 positions") {
		t.Errorf("too few logprobs: %v", err)
	}
	call = offline(m, true, true, nil)
	call.tok, call.req.withLogprobs = m.Tok, true
	bad := []TokenLogprob{{Logprob: -1, Top: []TopLogprob{{ID: 1 << 30}}}}
	if _, err := call.apply(msg{u: Update{Tokens: ids[:1], Logprobs: bad}}, nil); err == nil || !strings.Contains(err.Error(), "unknown token id") {
		t.Errorf("an unknown top token: %v", err)
	}
	if _, err := readLogprobs[topStub]([]float32{-1}, []uint32{1, 2}, nil); err == nil {
		t.Error("lists of different lengths read")
	}
	if _, err := readLogprobs([]float32{-1}, []uint32{1}, []topStub{{v: []float32{-1, -2}, ids: []uint32{3}}}); err == nil {
		t.Error("a top list of different lengths read")
	}
}

type topStub struct {
	v   []float32
	ids []uint32
}

func (s topStub) GetValues() []float32  { return s.v }
func (s topStub) GetTokenIds() []uint32 { return s.ids }
