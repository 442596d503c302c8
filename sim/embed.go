package sim

import (
	"context"
	"errors"
	"math"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// EmbeddingDim is the simulated model's embedding size.
const EmbeddingDim = 16

// Embedding is the simulated model's embedding of a prompt's token ids: a
// unit vector that depends on the ids alone, so the same prompt embeds the
// same on every engine and surface.
func Embedding(ids []uint32) []float32 {
	sum := make([]float64, EmbeddingDim)
	for pos, id := range ids {
		for d := range sum {
			x := mix(uint64(id)<<32 | uint64(pos&0xffff)<<8 | uint64(d))
			sum[d] += float64(x>>11)/float64(1<<53)*2 - 1
		}
	}
	var norm float64
	for _, v := range sum {
		norm += v * v
	}
	norm = math.Sqrt(norm)
	out := make([]float32, EmbeddingDim)
	for d, v := range sum {
		if norm > 0 {
			out[d] = float32(v / norm)
		}
	}
	return out
}

// embedGRPC runs one Embed call: the prompt goes through the engine as a
// prefill (it waits and takes its time like any request), then its
// embedding is answered.
func (s *Server) embedGRPC(ctx context.Context, ids []uint32, dpRank int) ([]float32, error) {
	if len(ids) == 0 {
		return nil, status.Error(codes.InvalidArgument, "tokenized.input_ids must not be empty")
	}
	if s.opts.Role != RoleRegular {
		return nil, status.Errorf(codes.FailedPrecondition, "a %s engine serves no embeddings", s.opts.Role)
	}
	e := s.eng.Load()
	if e == nil {
		return nil, status.Error(codes.Unavailable, errEngineStopped.Error())
	}
	req, err := e.submit(ctx, submitSpec{promptTokens: len(ids), maxTokens: 1, dpRank: dpRank, ids: ids})
	switch {
	case errors.Is(err, errTooLong):
		return nil, status.Error(codes.InvalidArgument, err.Error())
	case err != nil:
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	defer req.cancel()
	for !req.done.Load() {
		select {
		case <-req.notify:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	if req.err != nil {
		return nil, status.Error(codes.Internal, req.err.Error())
	}
	return Embedding(ids), nil
}

// mix is SplitMix64's finalizer: every input bit stirs every output bit.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}
