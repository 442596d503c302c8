package openaigrpc

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"sync"

	sglangpb "github.com/smg-project/smg/gen/sglang/grpc/scheduler"
	vllmpb "github.com/smg-project/smg/gen/vllm/grpc/engine"
	"github.com/smg-project/smg/internal/enginegrpc"
	"github.com/smg-project/smg/internal/jsonstr"
)

// MaxEmbedInputs bounds the inputs of one embeddings request (OpenAI's).
const MaxEmbedInputs = 2048

// embedParallel bounds the Embed calls one request has in flight.
const embedParallel = 16

// EmbedRequest is an OpenAI embeddings request, as served here.
type EmbedRequest struct {
	Model          string          `json:"model"`
	Input          json.RawMessage `json:"input"`
	EncodingFormat string          `json:"encoding_format"`
	Dimensions     *int64          `json:"dimensions"`
}

// ParseEmbed reads a /v1/embeddings body: input is a string, a list of
// strings, token ids or lists of token ids; encoding_format float or base64.
func ParseEmbed(body []byte) (*EmbedRequest, error) {
	r := &EmbedRequest{}
	if err := json.Unmarshal(body, r); err != nil {
		return nil, badf("Invalid request: %v", err)
	}
	switch {
	case isNull(r.Input):
		return nil, badf("input is required")
	case r.EncodingFormat != "" && r.EncodingFormat != "float" && r.EncodingFormat != "base64":
		return nil, badf("encoding_format must be float or base64")
	case r.Dimensions != nil:
		return nil, badf("dimensions is not served by gRPC workers: the engine answers the model's own size")
	}
	return r, nil
}

// EmbedPrompts tokenizes each input; each must fit the model's context.
func (m *Model) EmbedPrompts(r *EmbedRequest) ([][]uint32, error) {
	prompts, err := m.completionPrompts(r.Input)
	if err != nil {
		return nil, badf("input must be a string, a list of strings, token ids or lists of token ids")
	}
	if len(prompts) > MaxEmbedInputs {
		return nil, badf("input has %d items; at most %d", len(prompts), MaxEmbedInputs)
	}
	for i, ids := range prompts {
		if len(ids) == 0 {
			return nil, badf("input %d is empty", i)
		}
		if m.MaxContext > 0 && len(ids) > m.MaxContext {
			return nil, badf("input %d has %d tokens; this model's maximum context length is %d tokens", i, len(ids), m.MaxContext)
		}
	}
	return prompts, nil
}

// Embed asks the engine behind c for one prompt's embedding.
func Embed(ctx context.Context, c *enginegrpc.Client, id string, ids []uint32) (vec []float32, prompt uint32, err error) {
	flavor, err := c.Flavor(ctx)
	if err != nil {
		return nil, 0, err
	}
	if flavor == enginegrpc.FlavorSGLang {
		r, err := sglangpb.NewSglangSchedulerClient(c.Conn()).Embed(ctx,
			&sglangpb.EmbedRequest{RequestId: id, Tokenized: &sglangpb.TokenizedInput{InputIds: ids}})
		if err != nil {
			return nil, 0, err
		}
		return r.GetEmbedding(), r.GetPromptTokens(), nil
	}
	r, err := vllmpb.NewVllmEngineClient(c.Conn()).Embed(ctx,
		&vllmpb.EmbedRequest{RequestId: id, Tokenized: &vllmpb.TokenizedInput{InputIds: ids}})
	if err != nil {
		return nil, 0, err
	}
	return r.GetEmbedding(), r.GetPromptTokens(), nil
}

// EmbedCall is one embeddings request served over Embed: one call per
// input, a few at a time.
type EmbedCall struct {
	req    *EmbedRequest
	model  string
	vecs   [][]float32
	prompt []uint32
	done   chan error
	cancel context.CancelFunc
}

// StartEmbed sends every input's Embed call to the engine behind c.
func StartEmbed(ctx context.Context, c *enginegrpc.Client, req *EmbedRequest, prompts [][]uint32, model string) *EmbedCall {
	ctx, cancel := context.WithCancel(ctx)
	e := &EmbedCall{req: req, model: model, vecs: make([][]float32, len(prompts)), prompt: make([]uint32, len(prompts)),
		done: make(chan error, 1), cancel: cancel}
	id := newID("embd-")
	go func() {
		var wg sync.WaitGroup
		var once sync.Once
		var first error
		sem := make(chan struct{}, embedParallel)
		for i, ids := range prompts {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
			}
			if ctx.Err() != nil {
				break
			}
			wg.Go(func() {
				defer func() { <-sem }()
				vec, n, err := Embed(ctx, c, id+"-"+strconv.Itoa(i), ids)
				if err == nil {
					err = checkEmbedding(vec)
				}
				if err != nil {
					once.Do(func() { first = err; cancel() })
					return
				}
				e.vecs[i], e.prompt[i] = vec, n
			})
		}
		wg.Wait()
		if first == nil {
			first = ctx.Err()
		}
		e.done <- first
	}()
	return e
}

// Wait blocks until every input is embedded. An error reached the client
// with nothing: the caller may retry elsewhere.
func (e *EmbedCall) Wait(ctx context.Context) error {
	select {
	case err := <-e.done:
		if err != nil {
			return Classify(err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close cancels the calls still in flight.
func (e *EmbedCall) Close() { e.cancel() }

// Serve writes OpenAI's embeddings answer.
func (e *EmbedCall) Serve(_ context.Context, w http.ResponseWriter, progress Progress) error {
	b64 := e.req.EncodingFormat == "base64"
	b := make([]byte, 0, 64+len(e.vecs)*(len(e.vecs[0])*12+64))
	b = append(b, `{"object":"list","data":[`...)
	var prompt int64
	var raw []byte
	for i, vec := range e.vecs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"object":"embedding","index":`...)
		b = strconv.AppendInt(b, int64(i), 10)
		b = append(b, `,"embedding":`...)
		if b64 {
			raw = raw[:0]
			for _, f := range vec {
				raw = binary.LittleEndian.AppendUint32(raw, math.Float32bits(f))
			}
			b = append(b, '"')
			b = base64.StdEncoding.AppendEncode(b, raw)
			b = append(b, '"')
		} else {
			b = append(b, '[')
			for k, f := range vec {
				if k > 0 {
					b = append(b, ',')
				}
				b = strconv.AppendFloat(b, float64(f), 'g', -1, 32)
			}
			b = append(b, ']')
		}
		b = append(b, '}')
		prompt += int64(e.prompt[i])
	}
	b = append(b, `],"model":`...)
	b = jsonstr.Append(b, e.model)
	b = append(b, `,"usage":{"prompt_tokens":`...)
	b = strconv.AppendInt(b, prompt, 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, prompt, 10)
	b = append(b, "}}"...)
	progress(0)
	return writeJSON(w, b)
}

// checkEmbedding refuses an engine's embedding the answer cannot carry.
func checkEmbedding(vec []float32) error {
	if len(vec) == 0 {
		return &EngineError{Status: http.StatusBadGateway, Type: "server_error", Retry: true,
			Message: "the engine answered Embed with an empty embedding"}
	}
	for _, f := range vec {
		if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
			return &EngineError{Status: http.StatusBadGateway, Type: "server_error", Retry: true,
				Message: "the engine answered Embed with a value that is not a finite number"}
		}
	}
	return nil
}
