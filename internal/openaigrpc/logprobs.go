package openaigrpc

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/smg-project/smg/internal/jsonstr"
	"github.com/smg-project/smg/internal/tokenizer"
)

// lpToken is one output position as an answer shows it: the token's bytes
// and logprob, and the most likely tokens there.
type lpToken struct {
	lpAlt
	top []lpAlt
}

type lpAlt struct {
	raw string // the token's bytes, which may be part of a UTF-8 character
	lp  float32
}

// newLPToken reads the bytes of position id's token and of its alternatives.
func newLPToken(tok *tokenizer.Tokenizer, id uint32, lp TokenLogprob) (lpToken, error) {
	raw, err := tok.TokenBytes(id)
	if err != nil {
		return lpToken{}, engineSent(err)
	}
	t := lpToken{lpAlt: lpAlt{raw: string(raw), lp: lp.Logprob}}
	if len(lp.Top) > 0 {
		t.top = make([]lpAlt, len(lp.Top))
		for i, a := range lp.Top {
			raw, err := tok.TokenBytes(a.ID)
			if err != nil {
				return lpToken{}, engineSent(fmt.Errorf("a top logprob: %w", err))
			}
			t.top[i] = lpAlt{raw: string(raw), lp: a.Logprob}
		}
	}
	return t, nil
}

func engineSent(err error) error {
	return &EngineError{Status: http.StatusBadGateway, Type: "server_error", Message: fmt.Sprintf("the engine sent %v", err)}
}

// logprobsFor lines the logprobs of an update up with tokens, the ids of
// it this choice has not seen: a completion may list every output position
// or only those not streamed.
func logprobsFor(u Update, tokens []uint32) ([]TokenLogprob, error) {
	switch n := len(u.Logprobs); {
	case len(tokens) == 0:
		return nil, nil
	case n == len(tokens):
		return u.Logprobs, nil
	case n == len(u.Tokens):
		return u.Logprobs[n-len(tokens):], nil
	}
	return nil, engineSent(fmt.Errorf("logprobs for %d positions with %d tokens", len(u.Logprobs), len(tokens)))
}

// appendLogprob writes a logprob as the shortest decimal that reads back as
// the same float32; -inf and NaN (which JSON cannot carry) as -9999, as
// vLLM does.
func appendLogprob(b []byte, v float32) []byte {
	f := float64(v)
	if math.IsNaN(f) || f < -9999 {
		f = -9999
	} else if f > 0 {
		f = 0
	}
	return strconv.AppendFloat(b, f, 'f', -1, 32)
}

// text is the token as text: bytes that are not UTF-8 read as U+FFFD.
func (a lpAlt) text() string { return strings.ToValidUTF8(a.raw, "\uFFFD") }

// appendChatAlt writes {"token","logprob","bytes"} without its closing brace.
func appendChatAlt(b []byte, a lpAlt) []byte {
	b = append(b, `{"token":`...)
	b = jsonstr.Append(b, a.text())
	b = append(b, `,"logprob":`...)
	b = appendLogprob(b, a.lp)
	b = append(b, `,"bytes":[`...)
	for i := range len(a.raw) {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(a.raw[i]), 10)
	}
	return append(b, ']')
}

// appendChatLogprobs writes a chat choice's logprobs: {"content":[...]}.
func appendChatLogprobs(b []byte, toks []lpToken) []byte {
	b = append(b, `{"content":[`...)
	for i, t := range toks {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendChatAlt(b, t.lpAlt)
		b = append(b, `,"top_logprobs":[`...)
		for j, a := range t.top {
			if j > 0 {
				b = append(b, ',')
			}
			b = append(appendChatAlt(b, a), '}')
		}
		b = append(b, "]}"...)
	}
	return append(b, "]}"...)
}

// appendCompletionLogprobs writes a text completion choice's logprobs, the
// first token at text offset offset (in characters): each position's
// top_logprobs maps the token said and the most likely ones (each text
// once) to their logprobs. It returns the offset after the tokens.
func appendCompletionLogprobs(b []byte, toks []lpToken, offset int) ([]byte, int) {
	b = append(b, `{"text_offset":[`...)
	for i, t := range toks {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(offset), 10)
		offset += utf8.RuneCountInString(t.text())
	}
	b = append(b, `],"token_logprobs":[`...)
	for i, t := range toks {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendLogprob(b, t.lp)
	}
	b = append(b, `],"tokens":[`...)
	for i, t := range toks {
		if i > 0 {
			b = append(b, ',')
		}
		b = jsonstr.Append(b, t.text())
	}
	b = append(b, `],"top_logprobs":[`...)
	for i, t := range toks {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '{')
		seen := make(map[string]bool, len(t.top)+1)
		for j, a := range append([]lpAlt{t.lpAlt}, t.top...) {
			s := a.text()
			if seen[s] {
				continue
			}
			seen[s] = true
			if j > 0 {
				b = append(b, ',')
			}
			b = jsonstr.Append(b, s)
			b = append(b, ':')
			b = appendLogprob(b, a.lp)
		}
		b = append(b, '}')
	}
	return append(b, "]}"...), offset
}
