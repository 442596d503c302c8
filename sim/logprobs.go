package sim

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	sglangpb "github.com/smg-project/smg/gen/sglang/grpc/scheduler"
	vllmpb "github.com/smg-project/smg/gen/vllm/grpc/engine"
)

// MaxTopLogprobs is the most alternatives a position may list (OpenAI's
// top_logprobs bound).
const MaxTopLogprobs = 20

// The simulated model's logprobs are a function of the position and the word
// said there, so the HTTP and gRPC surfaces give the same figures: the word
// said is the most likely (between -1/8 and -2), each next alternative (the
// vocabulary's next words) half a nat less likely. Every figure is a multiple
// of 1/8: exact in float32, so the gRPC wire changes none.
func wordLogprob(pos, word int) float32 {
	return -float32((word*7+pos*3)%16+1) / 8
}

// topWords are the k most likely words at pos where word was said, most
// likely first.
func topWords(pos, word, k int) (words []int, lps []float32) {
	lp := wordLogprob(pos, word)
	for j := range k {
		words = append(words, (word+j)%len(vocab))
		lps = append(lps, lp-float32(j)/2)
	}
	return words, lps
}

// outputLogprobs fills the fields of an OutputLogProbs (either flavor's) for
// ids said from position start, k alternatives each.
func outputLogprobs(ids []uint32, start, k int, top func(values []float32, ids []uint32)) []float32 {
	lps := make([]float32, len(ids))
	for i, id := range ids {
		w := int(id) - firstWordID
		lps[i] = wordLogprob(start+i, w)
		words, values := topWords(start+i, w, k)
		topIDs := make([]uint32, len(words))
		for j, tw := range words {
			topIDs[j] = wordID(tw)
		}
		top(values, topIDs)
	}
	return lps
}

func sglangLogprobs(ids []uint32, start, k int) *sglangpb.OutputLogProbs {
	o := &sglangpb.OutputLogProbs{TokenIds: ids}
	o.TokenLogprobs = outputLogprobs(ids, start, k, func(values []float32, ids []uint32) {
		o.TopLogprobs = append(o.TopLogprobs, &sglangpb.TopLogProbs{Values: values, TokenIds: ids})
	})
	return o
}

func vllmLogprobs(ids []uint32, start, k int) *vllmpb.OutputLogProbs {
	o := &vllmpb.OutputLogProbs{TokenIds: ids}
	o.TokenLogprobs = outputLogprobs(ids, start, k, func(values []float32, ids []uint32) {
		o.TopLogprobs = append(o.TopLogprobs, &vllmpb.TopLogProbs{Values: values, TokenIds: ids})
	})
	return o
}

// logprobsAsk is what an OpenAI request asks for: on, and k alternatives.
type logprobsAsk struct {
	on bool
	k  int
}

// readLogprobs reads a chat's logprobs (a bool) and top_logprobs, or a
// completion's logprobs (the number of alternatives).
func readLogprobs(chat bool, logprobs json.RawMessage, topLogprobs *int) (logprobsAsk, error) {
	raw := strings.TrimSpace(string(logprobs))
	if chat {
		var on bool
		if raw != "" && raw != "null" && json.Unmarshal(logprobs, &on) != nil {
			return logprobsAsk{}, fmt.Errorf("logprobs must be a boolean")
		}
		if topLogprobs != nil && (*topLogprobs < 0 || *topLogprobs > MaxTopLogprobs) {
			return logprobsAsk{}, fmt.Errorf("top_logprobs must be between 0 and %d", MaxTopLogprobs)
		}
		if topLogprobs != nil && *topLogprobs > 0 && !on {
			return logprobsAsk{}, fmt.Errorf("top_logprobs needs logprobs set to true")
		}
		a := logprobsAsk{on: on}
		if on && topLogprobs != nil {
			a.k = *topLogprobs
		}
		return a, nil
	}
	if raw == "" || raw == "null" {
		return logprobsAsk{}, nil
	}
	var k int
	if json.Unmarshal(logprobs, &k) != nil || k < 0 || k > MaxTopLogprobs {
		return logprobsAsk{}, fmt.Errorf("logprobs must be an integer between 0 and %d", MaxTopLogprobs)
	}
	return logprobsAsk{on: true, k: k}, nil
}

// appendFloat writes a logprob as the shortest decimal that reads back as
// the same float32.
func appendFloat(b []byte, v float32) []byte { return strconv.AppendFloat(b, float64(v), 'f', -1, 32) }

// appendChatEntry appends one token's entry of a chat answer's
// logprobs.content (the words need no JSON escaping).
func appendChatEntry(b []byte, pos, word, k int) []byte {
	tok := func(b []byte, w int, lp float32) []byte {
		s := vocab[w] + " "
		b = append(b, `{"token":"`...)
		b = append(b, s...)
		b = append(b, `","logprob":`...)
		b = appendFloat(b, lp)
		b = append(b, `,"bytes":[`...)
		for i := range len(s) {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, int64(s[i]), 10)
		}
		return append(b, ']')
	}
	b = tok(b, word, wordLogprob(pos, word))
	b = append(b, `,"top_logprobs":[`...)
	words, lps := topWords(pos, word, k)
	for j, w := range words {
		if j > 0 {
			b = append(b, ',')
		}
		b = append(tok(b, w, lps[j]), '}')
	}
	return append(b, "]}"...)
}

// chatLogprobs is a chat choice's logprobs object for the words said from
// position start.
func chatLogprobs(words []int, start, k int) []byte {
	b := []byte(`{"content":[`)
	for i, w := range words {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendChatEntry(b, start+i, w, k)
	}
	return append(b, "]}"...)
}

// completionLogprobs is a text completion choice's logprobs object for the
// words said from position start, the first at text offset offset: each
// position's top_logprobs holds the word said and the k most likely.
func completionLogprobs(words []int, start, offset, k int) []byte {
	b := []byte(`{"text_offset":[`)
	for i, w := range words {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(offset), 10)
		offset += len(vocab[w]) + 1
	}
	b = append(b, `],"token_logprobs":[`...)
	for i, w := range words {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendFloat(b, wordLogprob(start+i, w))
	}
	b = append(b, `],"tokens":[`...)
	for i, w := range words {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(append(append(b, '"'), vocab[w]...), ` "`...)
	}
	b = append(b, `],"top_logprobs":[`...)
	for i, w := range words {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"`...)
		b = append(b, vocab[w]...)
		b = append(b, ` ":`...)
		b = appendFloat(b, wordLogprob(start+i, w))
		tops, lps := topWords(start+i, w, k)
		for j, t := range tops {
			if t == w {
				continue // the word said is listed first
			}
			b = append(b, `,"`...)
			b = append(b, vocab[t]...)
			b = append(b, ` ":`...)
			b = appendFloat(b, lps[j])
		}
		b = append(b, '}')
	}
	return append(b, "]}"...)
}

// logprobs is the logprobs object of the next words of o's answer, or nil
// when the request asked for none; it moves o's position past them.
func (o *output) logprobs(words []int) []byte {
	if !o.ask.on {
		return nil
	}
	var b []byte
	if o.chat {
		b = chatLogprobs(words, o.pos, o.ask.k)
	} else {
		b = completionLogprobs(words, o.pos, o.offset, o.ask.k)
	}
	o.pos += len(words)
	for _, w := range words {
		o.offset += len(vocab[w]) + 1
	}
	return b
}
