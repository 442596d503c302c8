package openaigrpc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/smg-project/smg/internal/chattemplate"
)

// MaxGenerations bounds the generations of one request (prompts times n).
const MaxGenerations = 128

// Request is the part of an OpenAI chat or text completion served here.
type Request struct {
	Chat bool
	// Native is SGLang's /generate: its answer is text, output_ids and
	// meta_info per generation.
	Native   bool
	Model    string                 `json:"model"`
	Messages []chattemplate.Message `json:"messages"`
	Prompt   json.RawMessage        `json:"prompt"`
	Stream   bool                   `json:"stream"`
	// StreamOptions.IncludeUsage adds the usage chunk before [DONE].
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	MaxTokens           *int64          `json:"max_tokens"`
	MaxCompletionTokens *int64          `json:"max_completion_tokens"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	TopK                *int64          `json:"top_k"`
	N                   *int64          `json:"n"`
	Seed                *int64          `json:"seed"`
	Stop                json.RawMessage `json:"stop"`
	// Logprobs is a chat's boolean, or a completion's number of most likely
	// tokens per position; TopLogprobs is a chat's.
	Logprobs    json.RawMessage `json:"logprobs"`
	TopLogprobs *int64          `json:"top_logprobs"`
	// ChatTemplateKwargs are extra template variables (e.g. enable_thinking).
	ChatTemplateKwargs map[string]any `json:"chat_template_kwargs"`
	// SkipSpecialTokens (default true) leaves special tokens out of the text.
	SkipSpecialTokens *bool `json:"skip_special_tokens"`
	// Bootstraps, set by the caller for the legs of a PD pair, hold one
	// bootstrap per generation, prompt-major (prompt p's choice k is
	// p*n+k): each generation is its own engine request with its own room.
	Bootstraps []Bootstrap `json:"-"`

	stops []string
	batch bool // /generate: the answer is a list (a batch of prompts, or n>1)
	// withLogprobs: the answer carries logprobs, with topLogprobs most
	// likely tokens per position.
	withLogprobs bool
	topLogprobs  int
}

// MaxTopLogprobs bounds the most likely tokens a position may list (vLLM's
// default max_logprobs).
const MaxTopLogprobs = 20

// BadRequest is a request this package refuses before anything is sent to
// an engine: a 400 naming what is wrong.
type BadRequest struct{ Msg string }

func (e *BadRequest) Error() string { return e.Msg }

func badf(format string, args ...any) error { return &BadRequest{fmt.Sprintf(format, args...)} }

// ParseRequest reads a chat (chat true) or text completion body.
func ParseRequest(body []byte, chat bool) (*Request, error) {
	r := &Request{Chat: chat}
	if err := json.Unmarshal(body, r); err != nil {
		return nil, badf("Invalid request: %v", err)
	}
	if chat && len(r.Messages) == 0 {
		return nil, badf("messages must not be empty")
	}
	if !chat && isNull(r.Prompt) {
		return nil, badf("prompt is required")
	}
	if err := r.check(); err != nil {
		return nil, err
	}
	return r, nil
}

// check validates the sampling parameters and reads stop.
func (r *Request) check() error {
	if mt := r.maxTokens(); mt != nil && *mt < 1 {
		return badf("max_tokens must be at least 1")
	}
	if r.N != nil && (*r.N < 1 || *r.N > MaxGenerations) {
		return badf("n must be between 1 and %d", MaxGenerations)
	}
	if r.Temperature != nil && (*r.Temperature < 0 || *r.Temperature > 2) {
		return badf("temperature must be between 0 and 2")
	}
	if r.TopP != nil && (*r.TopP <= 0 || *r.TopP > 1) {
		return badf("top_p must be in (0, 1]")
	}
	if r.TopK != nil && (*r.TopK < -1 || *r.TopK > 1<<20) {
		return badf("top_k must be -1 (off) or a positive number")
	}
	if err := r.readLogprobs(); err != nil {
		return err
	}
	if !isNull(r.Stop) {
		var one string
		if json.Unmarshal(r.Stop, &one) == nil {
			r.stops = []string{one}
		} else if err := json.Unmarshal(r.Stop, &r.stops); err != nil {
			return badf("stop must be a string or a list of strings")
		}
		if len(r.stops) > 16 {
			return badf("stop lists %d strings; at most 16", len(r.stops))
		}
		kept := r.stops[:0]
		for _, s := range r.stops {
			if s != "" {
				kept = append(kept, s)
			}
		}
		r.stops = kept
	}
	return nil
}

// readLogprobs reads a chat's logprobs (a boolean) and top_logprobs, or a
// completion's logprobs (the most likely tokens per position).
func (r *Request) readLogprobs() error {
	if r.Chat {
		on := false
		if !isNull(r.Logprobs) && json.Unmarshal(r.Logprobs, &on) != nil {
			return badf("logprobs must be a boolean")
		}
		if k := r.TopLogprobs; k != nil {
			if *k < 0 || *k > MaxTopLogprobs {
				return badf("top_logprobs must be between 0 and %d, got %d", MaxTopLogprobs, *k)
			}
			if *k > 0 && !on {
				return badf("top_logprobs needs logprobs set to true")
			}
		}
		r.withLogprobs = on
		if on && r.TopLogprobs != nil {
			r.topLogprobs = int(*r.TopLogprobs)
		}
		return nil
	}
	if isNull(r.Logprobs) {
		return nil
	}
	var k int64
	if json.Unmarshal(r.Logprobs, &k) != nil || k < 0 || k > MaxTopLogprobs {
		return badf("logprobs must be an integer between 0 and %d (the most likely tokens listed per position)", MaxTopLogprobs)
	}
	r.withLogprobs, r.topLogprobs = true, int(k)
	return nil
}

// WantsLogprobs reports whether the answer carries logprobs.
func (r *Request) WantsLogprobs() bool { return r.withLogprobs }

func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// maxTokens is max_tokens, else max_completion_tokens, else nil.
func (r *Request) maxTokens() *int64 {
	if r.MaxTokens != nil {
		return r.MaxTokens
	}
	return r.MaxCompletionTokens
}

// n is the choices per prompt.
func (r *Request) n() int {
	if r.N == nil {
		return 1
	}
	return int(*r.N)
}

// IncludeUsage reports stream_options.include_usage.
func (r *Request) IncludeUsage() bool { return r.StreamOptions != nil && r.StreamOptions.IncludeUsage }

// Prompts returns each prompt's token ids: the chat rendered with the
// model's template (add_generation_prompt) and tokenized, or a completion's
// prompt (a string, a list of strings, token ids, or lists of token ids).
// Every prompt must leave room for max_tokens in the model's context.
func (m *Model) Prompts(r *Request) ([][]uint32, error) {
	var prompts [][]uint32
	if r.Chat {
		if m.Tmpl == nil {
			return nil, badf("The model has no chat template: %v", m.tmplErr)
		}
		text, err := m.Tmpl.Render(r.Messages, chattemplate.Options{AddGenerationPrompt: true, Kwargs: r.ChatTemplateKwargs})
		if err != nil {
			var te *chattemplate.Error
			if errors.As(err, &te) && te.Message >= 0 {
				return nil, badf("The chat template cannot render messages[%d]: %v", te.Message, te.Err)
			}
			return nil, badf("The chat template cannot render the messages: %v", err)
		}
		prompts = [][]uint32{m.Tok.Encode(text)}
	} else {
		var err error
		if prompts, err = m.completionPrompts(r.Prompt); err != nil {
			return nil, err
		}
	}
	if len(prompts)*r.n() > MaxGenerations {
		return nil, badf("%d prompts times n=%d is over %d generations", len(prompts), r.n(), MaxGenerations)
	}
	for i, ids := range prompts {
		if len(ids) == 0 {
			return nil, badf("prompt %d is empty", i)
		}
		if m.MaxContext <= 0 {
			continue
		}
		want := int64(len(ids))
		if mt := r.maxTokens(); mt != nil {
			want += *mt
		}
		if len(ids) >= m.MaxContext || want > int64(m.MaxContext) {
			msg := "This model's maximum context length is " + strconv.Itoa(m.MaxContext) + " tokens. However, you requested " +
				strconv.FormatInt(want, 10) + " tokens (" + strconv.Itoa(len(ids)) + " in the prompt"
			if mt := r.maxTokens(); mt != nil {
				msg += ", " + strconv.FormatInt(*mt, 10) + " in the completion"
			}
			return nil, &BadRequest{msg + "). Please reduce the length of the prompt or of the completion."}
		}
	}
	return prompts, nil
}

func (m *Model) completionPrompts(raw json.RawMessage) ([][]uint32, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return [][]uint32{m.Tok.Encode(s)}, nil
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil && len(ss) > 0 {
		out := make([][]uint32, len(ss))
		for i, p := range ss {
			out[i] = m.Tok.Encode(p)
		}
		return out, nil
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) == nil && len(ids) > 0 {
		p, err := m.checkIDs(ids, -1)
		return [][]uint32{p}, err
	}
	var idss [][]int64
	if json.Unmarshal(raw, &idss) == nil && len(idss) > 0 {
		out := make([][]uint32, len(idss))
		for i, ids := range idss {
			var err error
			if out[i], err = m.checkIDs(ids, i); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return nil, badf("prompt must be a string, a list of strings, token ids or lists of token ids")
}

// checkIDs refuses ids the tokenizer does not have: the engine would read
// them as something else or fail.
func (m *Model) checkIDs(ids []int64, prompt int) ([]uint32, error) {
	out := make([]uint32, len(ids))
	vocab := int64(m.Tok.VocabSize())
	for i, id := range ids {
		if id < 0 || id >= vocab {
			where := "prompt"
			if prompt >= 0 {
				where = "prompt[" + strconv.Itoa(prompt) + "]"
			}
			return nil, badf("%s[%d]: token id %d is outside the vocabulary (0..%d)", where, i, id, vocab-1)
		}
		out[i] = uint32(id)
	}
	return out, nil
}

// Choices is n: the choices asked per prompt.
func (r *Request) Choices() int { return r.n() }
