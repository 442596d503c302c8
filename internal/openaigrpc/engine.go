package openaigrpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc"

	sglangpb "github.com/smg-project/smg/gen/sglang/grpc/scheduler"
	vllmpb "github.com/smg-project/smg/gen/vllm/grpc/engine"
	"github.com/smg-project/smg/internal/enginegrpc"
)

// Sampling is what a generation asks of the engine.
type Sampling struct {
	MaxTokens   *int64
	Temperature *float64
	TopP        *float64
	TopK        *int64
	Stop        []string
	Seed        *int64
	SkipSpecial bool
	// Logprobs asks for each output token's logprob, and TopLogprobs most
	// likely tokens at each position.
	Logprobs    bool
	TopLogprobs int
	// Bootstrap, on both legs of a prefill/decode pair, names the prefill
	// engine's KV bootstrap endpoint and the pair's room.
	Bootstrap *Bootstrap
}

// Bootstrap is a PD pair's KV handover: SGLang's DisaggregatedParams, or
// the same triple in vLLM's kv_transfer_params_json.
type Bootstrap struct {
	Host string `json:"bootstrap_host"`
	Port int32  `json:"bootstrap_port"`
	Room uint64 `json:"bootstrap_room"`
}

// Sampling reads the request's sampling parameters.
func (r *Request) Sampling() Sampling {
	sp := Sampling{MaxTokens: r.maxTokens(), Temperature: r.Temperature, TopP: r.TopP, TopK: r.TopK,
		Stop: r.stops, Seed: r.Seed, SkipSpecial: r.SkipSpecialTokens == nil || *r.SkipSpecialTokens,
		Logprobs: r.withLogprobs}
	if r.withLogprobs {
		sp.TopLogprobs = r.topLogprobs
	}
	return sp
}

// Update is one message of a Generate stream, flavor aside.
type Update struct {
	// Tokens are the new token ids of a chunk, or the complete message's
	// output ids (every token, or those not streamed yet, by engine).
	Tokens   []uint32
	Complete bool
	Finish   string // "stop", "length" or "abort" (complete only)
	// Prompt and Completion are the engine's token counts so far.
	Prompt, Completion uint32
	// Logprobs are the output logprobs the message carries (nil: none),
	// position by position as Tokens.
	Logprobs []TokenLogprob
}

// TokenLogprob is one output position: the token's logprob and the most
// likely tokens there.
type TokenLogprob struct {
	Logprob float32
	Top     []TopLogprob
}

// TopLogprob is one of the most likely tokens at a position.
type TopLogprob struct {
	ID      uint32
	Logprob float32
}

// readLogprobs reads either flavor's OutputLogProbs; lists that do not line
// up are an engine fault.
func readLogprobs[T interface {
	GetValues() []float32
	GetTokenIds() []uint32
}](lps []float32, ids []uint32, tops []T) ([]TokenLogprob, error) {
	if len(lps) != len(ids) || (len(tops) != 0 && len(tops) != len(ids)) {
		return nil, fmt.Errorf("the engine sent output logprobs for %d positions with %d token ids and %d top lists", len(lps), len(ids), len(tops))
	}
	out := make([]TokenLogprob, len(lps))
	for i, lp := range lps {
		out[i].Logprob = lp
		if len(tops) == 0 {
			continue
		}
		v, t := tops[i].GetValues(), tops[i].GetTokenIds()
		if len(v) != len(t) {
			return nil, fmt.Errorf("the engine sent top logprobs with %d values for %d token ids", len(v), len(t))
		}
		out[i].Top = make([]TopLogprob, len(v))
		for j := range v {
			out[i].Top[j] = TopLogprob{ID: t[j], Logprob: v[j]}
		}
	}
	return out, nil
}

// Stream is one Generate call.
type Stream interface {
	// Recv returns the next update; io.EOF after the last message.
	Recv() (Update, error)
}

// Generate starts one generation of ids on the engine behind c.
func Generate(ctx context.Context, c *enginegrpc.Client, id string, ids []uint32, sp Sampling, stream bool) (Stream, error) {
	flavor, err := c.Flavor(ctx)
	if err != nil {
		return nil, err
	}
	topP := float32(1)
	if sp.TopP != nil {
		topP = float32(*sp.TopP)
	}
	if flavor == enginegrpc.FlavorSGLang {
		p := &sglangpb.SamplingParams{Temperature: 1, TopP: topP, TopK: -1, Stop: sp.Stop, SkipSpecialTokens: sp.SkipSpecial, N: 1}
		if sp.Temperature != nil {
			p.Temperature = float32(*sp.Temperature)
		}
		if sp.TopK != nil {
			p.TopK = int32(*sp.TopK)
		}
		if sp.MaxTokens != nil {
			mt := uint32(min(*sp.MaxTokens, 1<<31))
			p.MaxNewTokens = &mt
		}
		gr := &sglangpb.GenerateRequest{RequestId: id, Tokenized: &sglangpb.TokenizedInput{InputIds: ids}, SamplingParams: p, Stream: stream}
		if sp.Logprobs {
			// No prompt logprobs: OpenAI's answers carry the output's only.
			gr.ReturnLogprob, gr.LogprobStartLen, gr.TopLogprobsNum = true, -1, int32(sp.TopLogprobs)
		}
		if b := sp.Bootstrap; b != nil {
			// SGLang's room is an int32 on this wire.
			gr.DisaggregatedParams = &sglangpb.DisaggregatedParams{BootstrapHost: b.Host, BootstrapPort: b.Port, BootstrapRoom: int32(b.Room & 0x7fffffff)}
		}
		st, err := sglangpb.NewSglangSchedulerClient(c.Conn()).Generate(ctx, gr)
		if err != nil {
			return nil, err
		}
		return sglangStream{st}, nil
	}
	p := &vllmpb.SamplingParams{TopP: topP, Stop: sp.Stop, SkipSpecialTokens: sp.SkipSpecial, N: 1}
	if sp.Temperature != nil {
		t := float32(*sp.Temperature)
		p.Temperature = &t
	}
	if sp.TopK != nil && *sp.TopK > 0 {
		p.TopK = uint32(*sp.TopK)
	}
	if sp.MaxTokens != nil {
		mt := uint32(min(*sp.MaxTokens, 1<<31))
		p.MaxTokens = &mt
	}
	if sp.Seed != nil {
		s := int32(*sp.Seed)
		p.Seed = &s
	}
	if sp.Logprobs {
		k := int32(sp.TopLogprobs)
		p.Logprobs = &k
	}
	gr := &vllmpb.GenerateRequest{RequestId: id,
		Input: &vllmpb.GenerateRequest_Tokenized{Tokenized: &vllmpb.TokenizedInput{InputIds: ids}}, SamplingParams: p, Stream: stream}
	if b := sp.Bootstrap; b != nil {
		kv, _ := json.Marshal(b)
		s := string(kv)
		gr.KvTransferParamsJson = &s
	}
	st, err := vllmpb.NewVllmEngineClient(c.Conn()).Generate(ctx, gr)
	if err != nil {
		return nil, err
	}
	return vllmStream{st}, nil
}

// errEmpty is a response that is neither a chunk nor a completion.
var errEmpty = errors.New("the engine sent a Generate response with neither a chunk nor a completion")

type sglangStream struct {
	st grpc.ServerStreamingClient[sglangpb.GenerateResponse]
}

func (s sglangStream) Recv() (Update, error) {
	m, err := s.st.Recv()
	if err != nil {
		return Update{}, err
	}
	if c := m.GetChunk(); c != nil {
		u := Update{Tokens: c.GetTokenIds(), Prompt: c.GetPromptTokens(), Completion: c.GetCompletionTokens()}
		if o := c.GetOutputLogprobs(); o != nil {
			u.Logprobs, err = readLogprobs(o.GetTokenLogprobs(), o.GetTokenIds(), o.GetTopLogprobs())
		}
		return u, err
	}
	if c := m.GetComplete(); c != nil {
		u := Update{Tokens: c.GetOutputIds(), Complete: true, Finish: c.GetFinishReason(),
			Prompt: c.GetPromptTokens(), Completion: c.GetCompletionTokens()}
		if o := c.GetOutputLogprobs(); o != nil {
			u.Logprobs, err = readLogprobs(o.GetTokenLogprobs(), o.GetTokenIds(), o.GetTopLogprobs())
		}
		return u, err
	}
	return Update{}, errEmpty
}

type vllmStream struct {
	st grpc.ServerStreamingClient[vllmpb.GenerateResponse]
}

func (s vllmStream) Recv() (Update, error) {
	m, err := s.st.Recv()
	if err != nil {
		return Update{}, err
	}
	if c := m.GetChunk(); c != nil {
		u := Update{Tokens: c.GetTokenIds(), Prompt: c.GetPromptTokens(), Completion: c.GetCompletionTokens()}
		if o := c.GetOutputLogprobs(); o != nil {
			u.Logprobs, err = readLogprobs(o.GetTokenLogprobs(), o.GetTokenIds(), o.GetTopLogprobs())
		}
		return u, err
	}
	if c := m.GetComplete(); c != nil {
		u := Update{Tokens: c.GetOutputIds(), Complete: true, Finish: c.GetFinishReason(),
			Prompt: c.GetPromptTokens(), Completion: c.GetCompletionTokens()}
		if o := c.GetOutputLogprobs(); o != nil {
			u.Logprobs, err = readLogprobs(o.GetTokenLogprobs(), o.GetTokenIds(), o.GetTopLogprobs())
		}
		return u, err
	}
	return Update{}, errEmpty
}

// Abort asks the engine to drop the generations named.
func Abort(ctx context.Context, c *enginegrpc.Client, reason string, ids ...string) error {
	flavor, err := c.Flavor(ctx)
	if err != nil {
		return err
	}
	if flavor == enginegrpc.FlavorSGLang {
		sg := sglangpb.NewSglangSchedulerClient(c.Conn())
		for _, id := range ids {
			if _, err := sg.Abort(ctx, &sglangpb.AbortRequest{RequestId: id, Reason: reason}); err != nil {
				return err
			}
		}
		return nil
	}
	_, err = vllmpb.NewVllmEngineClient(c.Conn()).Abort(ctx, &vllmpb.AbortRequest{RequestIds: ids})
	return err
}

// Prefill runs the prefill leg of a PD pair: one Generate, not streamed,
// read to its completion.
func Prefill(ctx context.Context, c *enginegrpc.Client, id string, ids []uint32, sp Sampling) error {
	st, err := Generate(ctx, c, id, ids, sp, false)
	if err != nil {
		return err
	}
	for {
		u, err := st.Recv()
		if err == io.EOF {
			return errNoComplete
		}
		if err != nil {
			return err
		}
		if u.Complete {
			return nil
		}
	}
}
