package openaigrpc

import (
	"bytes"
	"encoding/json"
	"strconv"

	"github.com/smg-project/smg/internal/jsonstr"
)

// generateRequest is SGLang's native /generate request, as served here.
type generateRequest struct {
	Text           json.RawMessage `json:"text"`
	InputIDs       json.RawMessage `json:"input_ids"`
	SamplingParams json.RawMessage `json:"sampling_params"`
	Stream         bool            `json:"stream"`
	ReturnLogprob  bool            `json:"return_logprob"`
	InputEmbeds    json.RawMessage `json:"input_embeds"`
	ImageData      json.RawMessage `json:"image_data"`
}

// nativeSampling is /generate's sampling_params.
type nativeSampling struct {
	MaxNewTokens      *int64          `json:"max_new_tokens"`
	Temperature       *float64        `json:"temperature"`
	TopP              *float64        `json:"top_p"`
	TopK              *int64          `json:"top_k"`
	N                 *int64          `json:"n"`
	Stop              json.RawMessage `json:"stop"`
	SkipSpecialTokens *bool           `json:"skip_special_tokens"`
	Seed              *int64          `json:"sampling_seed"`
	Regex             json.RawMessage `json:"regex"`
	JSONSchema        json.RawMessage `json:"json_schema"`
	EBNF              json.RawMessage `json:"ebnf"`
}

// ParseGenerate reads SGLang's native /generate body: text or input_ids (one
// prompt or a batch), sampling_params (max_new_tokens, temperature, top_p,
// top_k, n, stop, skip_special_tokens, sampling_seed) and stream. The answer
// is SGLang's: text, output_ids and meta_info per generation.
func ParseGenerate(body []byte) (*Request, error) {
	var g generateRequest
	if err := json.Unmarshal(body, &g); err != nil {
		return nil, badf("Invalid request: %v", err)
	}
	text, ids := !isNull(g.Text), !isNull(g.InputIDs)
	switch {
	case text && ids:
		return nil, badf("give either text or input_ids, not both")
	case !text && !ids:
		return nil, badf("text or input_ids is required")
	case g.ReturnLogprob:
		return nil, badf("return_logprob is not served by gRPC workers on /generate")
	case !isNull(g.InputEmbeds) || !isNull(g.ImageData):
		return nil, badf("input_embeds and image_data are not served by gRPC workers")
	}
	r := &Request{Native: true, Stream: g.Stream, Prompt: g.Text}
	if ids {
		r.Prompt = g.InputIDs
	}
	r.batch = bytes.HasPrefix(bytes.TrimSpace(r.Prompt), []byte("[")) &&
		(text || bytes.HasPrefix(bytes.TrimSpace(bytes.TrimSpace(r.Prompt)[1:]), []byte("[")))
	if sp := bytes.TrimSpace(g.SamplingParams); len(sp) > 0 && sp[0] == '[' {
		return nil, badf("a list of sampling_params is not served by gRPC workers: give one object for every prompt")
	}
	var sp nativeSampling
	if !isNull(g.SamplingParams) {
		if err := json.Unmarshal(g.SamplingParams, &sp); err != nil {
			return nil, badf("Invalid sampling_params: %v", err)
		}
	}
	if !isNull(sp.Regex) || !isNull(sp.JSONSchema) || !isNull(sp.EBNF) {
		return nil, badf("regex, json_schema and ebnf are not served by gRPC workers")
	}
	r.MaxTokens, r.Temperature, r.TopP, r.TopK, r.N = sp.MaxNewTokens, sp.Temperature, sp.TopP, sp.TopK, sp.N
	r.Stop, r.SkipSpecialTokens, r.Seed = sp.Stop, sp.SkipSpecialTokens, sp.Seed
	if r.N != nil && *r.N > 1 {
		r.batch = true
	}
	if err := r.check(); err != nil {
		return nil, err
	}
	return r, nil
}

// appendNativeItem appends one generation in /generate's shape: the text so
// far, output_ids (all of them, or those new since the last event), and
// meta_info with the finish reason (null while it runs).
func (c *Call) appendNativeItem(b []byte, g *gen, ids []uint32, final bool) []byte {
	b = append(b, `{"text":`...)
	b = jsonstr.Append(b, string(g.text))
	b = append(b, `,"output_ids":[`...)
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(id), 10)
	}
	b = append(b, `],"meta_info":{"id":`...)
	b = jsonstr.Append(b, g.id)
	b = append(b, `,"finish_reason":`...)
	switch {
	case !final:
		b = append(b, "null"...)
	case g.finish == "length":
		b = append(b, `{"type":"length","length":`...)
		b = strconv.AppendInt(b, int64(g.complete), 10)
		b = append(b, '}')
	case g.finish == "stop" && g.matched != "":
		b = append(b, `{"type":"stop","matched":`...)
		b = jsonstr.Append(b, g.matched)
		b = append(b, '}')
	default:
		b = append(b, `{"type":`...)
		b = jsonstr.Append(b, g.finish)
		b = append(b, '}')
	}
	b = append(b, `,"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(g.prompt), 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, int64(g.complete), 10)
	b = append(b, '}')
	if c.req.Stream {
		b = append(b, `,"index":`...)
		b = strconv.AppendInt(b, int64(g.index), 10)
	}
	return append(b, '}')
}

// appendNativeEvent appends one /generate SSE event of choice g: the text
// so far and the ids not sent yet.
func (c *Call) appendNativeEvent(b []byte, g *gen, final bool) []byte {
	b = append(b, "data: "...)
	b = c.appendNativeItem(b, g, g.ids[g.sentIDs:], final)
	g.sentIDs = len(g.ids)
	return append(b, "\n\n"...)
}

// finalNative is a non-streamed /generate answer: one object, or a list
// for a batch or n>1.
func (c *Call) finalNative() []byte {
	b := make([]byte, 0, 256)
	if c.req.batch {
		b = append(b, '[')
	}
	for i, g := range c.gens {
		if i > 0 {
			b = append(b, ',')
		}
		b = c.appendNativeItem(b, g, g.ids, true)
	}
	if c.req.batch {
		b = append(b, ']')
	}
	return b
}
