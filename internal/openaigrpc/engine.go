package openaigrpc

import (
	"context"
	"encoding/json"
	"errors"
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
	return Sampling{MaxTokens: r.maxTokens(), Temperature: r.Temperature, TopP: r.TopP, TopK: r.TopK,
		Stop: r.stops, Seed: r.Seed, SkipSpecial: r.SkipSpecialTokens == nil || *r.SkipSpecialTokens}
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
		return Update{Tokens: c.GetTokenIds(), Prompt: c.GetPromptTokens(), Completion: c.GetCompletionTokens()}, nil
	}
	if c := m.GetComplete(); c != nil {
		return Update{Tokens: c.GetOutputIds(), Complete: true, Finish: c.GetFinishReason(),
			Prompt: c.GetPromptTokens(), Completion: c.GetCompletionTokens()}, nil
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
		return Update{Tokens: c.GetTokenIds(), Prompt: c.GetPromptTokens(), Completion: c.GetCompletionTokens()}, nil
	}
	if c := m.GetComplete(); c != nil {
		return Update{Tokens: c.GetOutputIds(), Complete: true, Finish: c.GetFinishReason(),
			Prompt: c.GetPromptTokens(), Completion: c.GetCompletionTokens()}, nil
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
