package sim

import (
	"context"
	"encoding/json"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	sglangpb "github.com/smg-project/smg/gen/sglang/grpc/scheduler"
	commonpb "github.com/smg-project/smg/gen/smg/grpc/common"
	vllmpb "github.com/smg-project/smg/gen/vllm/grpc/engine"
)

// sglangServicer is the SGLang scheduler service of one simulated engine.
type sglangServicer struct {
	sglangpb.UnimplementedSglangSchedulerServer
	s *Server
}

var _ sglangpb.SglangSchedulerServer = sglangServicer{}

func (v sglangServicer) Generate(req *sglangpb.GenerateRequest, stream grpc.ServerStreamingServer[sglangpb.GenerateResponse]) error {
	p := genParams{id: req.GetRequestId(), ids: req.GetTokenized().GetInputIds(), stream: req.GetStream(), dpRank: -1,
		maxTokens: int(req.GetSamplingParams().GetMaxNewTokens()), logprobs: -1}
	if req.GetReturnLogprob() {
		if k := req.GetTopLogprobsNum(); k < 0 || k > MaxTopLogprobs {
			return invalid("top_logprobs_num %d: want 0..%d", k, MaxTopLogprobs)
		}
		p.logprobs = int(req.GetTopLogprobsNum())
	}
	if r := req.GetDataParallelRank(); r > 0 { // proto3 cannot tell 0 from unset: 0 lets the engine pick
		p.dpRank = int(r)
	}
	if d := req.GetDisaggregatedParams(); d != nil {
		p.pd = &pdInfo{host: d.GetBootstrapHost(), port: int(d.GetBootstrapPort()), hasPort: d.GetBootstrapPort() > 0, room: uint64(uint32(d.GetBootstrapRoom()))}
	}
	return v.s.generateGRPC(stream.Context(), p, func(u genUpdate) error {
		resp := &sglangpb.GenerateResponse{RequestId: req.GetRequestId()}
		if u.done {
			c := &sglangpb.GenerateComplete{OutputIds: u.tokens, FinishReason: u.finish, PromptTokens: uint32(u.prompt),
				CompletionTokens: uint32(u.completion)}
			if p.logprobs >= 0 {
				c.OutputLogprobs = sglangLogprobs(u.tokens, u.start, p.logprobs)
			}
			resp.Response = &sglangpb.GenerateResponse_Complete{Complete: c}
		} else {
			c := &sglangpb.GenerateStreamChunk{TokenIds: u.tokens, PromptTokens: uint32(u.prompt), CompletionTokens: uint32(u.completion)}
			if p.logprobs >= 0 {
				c.OutputLogprobs = sglangLogprobs(u.tokens, u.start, p.logprobs)
			}
			resp.Response = &sglangpb.GenerateResponse_Chunk{Chunk: c}
		}
		return stream.Send(resp)
	})
}

func (v sglangServicer) Embed(ctx context.Context, req *sglangpb.EmbedRequest) (*sglangpb.EmbedResponse, error) {
	rank := -1
	if r := req.GetDataParallelRank(); r > 0 {
		rank = int(r)
	}
	ids := req.GetTokenized().GetInputIds()
	vec, err := v.s.embedGRPC(ctx, ids, rank)
	if err != nil {
		return nil, err
	}
	return &sglangpb.EmbedResponse{EmbeddingDim: uint32(len(vec)), Embedding: vec, PromptTokens: uint32(len(ids))}, nil
}

func (v sglangServicer) HealthCheck(context.Context, *sglangpb.HealthCheckRequest) (*sglangpb.HealthCheckResponse, error) {
	return &sglangpb.HealthCheckResponse{Healthy: true, Message: "ok"}, nil
}

func (v sglangServicer) Abort(_ context.Context, req *sglangpb.AbortRequest) (*sglangpb.AbortResponse, error) {
	if v.s.grpcReqs.abort(req.GetRequestId()) == 0 {
		return &sglangpb.AbortResponse{Success: false, Message: "no such request"}, nil
	}
	return &sglangpb.AbortResponse{Success: true}, nil
}

func (v sglangServicer) GetModelInfo(context.Context, *sglangpb.GetModelInfoRequest) (*sglangpb.GetModelInfoResponse, error) {
	o := v.s.opts
	return &sglangpb.GetModelInfoResponse{ModelPath: o.Model, TokenizerPath: o.Model, IsGeneration: true,
		ServedModelName: o.Model, MaxContextLength: int32(o.KVCapacityTokens), VocabSize: int32(vocabSize()),
		ModelType: "sim", EosTokenIds: []int32{tokEOS}, BosTokenId: tokBOS, MaxReqInputLen: int32(o.KVCapacityTokens - 1),
		Architectures: []string{"SimForCausalLM"}}, nil
}

func (v sglangServicer) GetServerInfo(context.Context, *sglangpb.GetServerInfoRequest) (*sglangpb.GetServerInfoResponse, error) {
	s, o := v.s, v.s.opts
	mode := "null"
	if o.Role != RoleRegular {
		mode = o.Role
	}
	var bootstrap any
	if p := s.bootstrapPort(); p > 0 {
		bootstrap = p
	}
	args, err := toStruct(map[string]any{
		"model_path": o.Model, "served_model_name": o.Model, "max_running_requests": o.MaxRunningRequests,
		"max_total_tokens": o.KVCapacityTokens, "chunked_prefill_size": o.MaxBatchedTokens, "dp_size": o.DPSize,
		"tp_size": o.TPSize, "disaggregation_mode": mode, "disaggregation_bootstrap_port": bootstrap,
	})
	if err != nil {
		return nil, err
	}
	info, err := toStruct(map[string]any{"max_total_num_tokens": o.KVCapacityTokens, "max_running_requests": o.MaxRunningRequests})
	if err != nil {
		return nil, err
	}
	return &sglangpb.GetServerInfoResponse{ServerArgs: args, SchedulerInfo: info, ActiveRequests: int32(s.activeRequests()),
		IsPaused: s.Fault().Freeze, UptimeSeconds: time.Since(s.startedAt()).Seconds(), SglangVersion: "sim", ServerType: "grpc",
		MaxTotalNumTokens: int32(o.KVCapacityTokens)}, nil
}

// toStruct goes through JSON so that ints become numbers and nil null.
func toStruct(m map[string]any) (*structpb.Struct, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	st := &structpb.Struct{}
	return st, st.UnmarshalJSON(b)
}

func (v sglangServicer) GetLoads(_ context.Context, req *sglangpb.GetLoadsRequest) (*sglangpb.GetLoadsResponse, error) {
	v.s.getLoads.Add(1)
	rank, err := rankArg(req.DpRank, v.s.opts.DPSize)
	if err != nil {
		return nil, err
	}
	out := &sglangpb.GetLoadsResponse{Timestamp: time.Now().UTC().Format(time.RFC3339Nano), Version: "sim",
		Aggregate: &sglangpb.AggregateMetrics{}}
	for _, r := range v.s.reports(rank) {
		l := v.s.pushed(r)
		out.Loads = append(out.Loads, &sglangpb.SchedulerLoad{DpRank: l.DpRank, NumRunningReqs: l.NumRunningReqs,
			NumWaitingReqs: l.NumWaitingReqs, NumTotalReqs: l.NumTotalReqs, NumUsedTokens: l.NumUsedTokens,
			MaxTotalNumTokens: l.MaxTotalNumTokens, TokenUsage: l.TokenUsage, GenThroughput: l.GenThroughput,
			Utilization: l.Utilization, MaxRunningRequests: l.MaxRunningRequests})
		a := out.Aggregate
		a.TotalRunningReqs += l.NumRunningReqs
		a.TotalWaitingReqs += l.NumWaitingReqs
		a.TotalReqs += l.NumTotalReqs
		a.AvgTokenUsage += l.TokenUsage / float64(v.s.opts.DPSize)
		a.AvgThroughput += l.GenThroughput / float64(v.s.opts.DPSize)
		a.AvgUtilization += l.Utilization / float64(v.s.opts.DPSize)
	}
	out.DpRankCount = int32(len(out.Loads))
	return out, nil
}

func (v sglangServicer) GetTokenizer(_ *commonpb.GetTokenizerRequest, stream grpc.ServerStreamingServer[commonpb.GetTokenizerChunk]) error {
	return sendTokenizer(stream.Send)
}

func (v sglangServicer) SubscribeKvEvents(req *commonpb.SubscribeKvEventsRequest, stream grpc.ServerStreamingServer[commonpb.KvEventBatch]) error {
	return v.s.subscribeKV(stream.Context(), req.GetStartSequenceNumber(), stream.Send)
}

// vllmServicer is the vLLM engine service of one simulated engine.
type vllmServicer struct {
	vllmpb.UnimplementedVllmEngineServer
	s *Server
}

var _ vllmpb.VllmEngineServer = vllmServicer{}

// kvTransfer is the simulator's reading of kv_transfer_params_json: the
// SGLang-style bootstrap triple its PD model speaks.
type kvTransfer struct {
	Host string `json:"bootstrap_host"`
	Port int    `json:"bootstrap_port"`
	Room uint64 `json:"bootstrap_room"`
}

func (v vllmServicer) Generate(req *vllmpb.GenerateRequest, stream grpc.ServerStreamingServer[vllmpb.GenerateResponse]) error {
	p := genParams{id: req.GetRequestId(), ids: req.GetTokenized().GetInputIds(), stream: req.GetStream(), dpRank: -1,
		maxTokens: int(req.GetSamplingParams().GetMaxTokens()), logprobs: -1}
	if sp := req.GetSamplingParams(); sp != nil && sp.Logprobs != nil {
		k := sp.Logprobs
		if *k < 0 || *k > MaxTopLogprobs {
			return invalid("sampling_params.logprobs %d: want 0..%d", *k, MaxTopLogprobs)
		}
		p.logprobs = int(*k)
	}
	if req.DataParallelRank != nil {
		p.dpRank = int(*req.DataParallelRank)
	}
	if req.KvTransferParamsJson != nil {
		var kt kvTransfer
		if err := json.Unmarshal([]byte(*req.KvTransferParamsJson), &kt); err != nil {
			return invalid("kv_transfer_params_json: %v", err)
		}
		p.pd = &pdInfo{host: kt.Host, port: kt.Port, hasPort: kt.Port > 0, room: kt.Room}
	}
	if req.GetText() != "" && len(p.ids) == 0 {
		return invalid("text input is not served: send tokenized.input_ids")
	}
	return v.s.generateGRPC(stream.Context(), p, func(u genUpdate) error {
		resp := &vllmpb.GenerateResponse{}
		if u.done {
			c := &vllmpb.GenerateComplete{OutputIds: u.tokens, FinishReason: u.finish, PromptTokens: uint32(u.prompt),
				CompletionTokens: uint32(u.completion)}
			if p.logprobs >= 0 {
				c.OutputLogprobs = vllmLogprobs(u.tokens, u.start, p.logprobs)
			}
			resp.Response = &vllmpb.GenerateResponse_Complete{Complete: c}
		} else {
			c := &vllmpb.GenerateStreamChunk{TokenIds: u.tokens, PromptTokens: uint32(u.prompt), CompletionTokens: uint32(u.completion)}
			if p.logprobs >= 0 {
				c.OutputLogprobs = vllmLogprobs(u.tokens, u.start, p.logprobs)
			}
			resp.Response = &vllmpb.GenerateResponse_Chunk{Chunk: c}
		}
		return stream.Send(resp)
	})
}

func (v vllmServicer) Embed(ctx context.Context, req *vllmpb.EmbedRequest) (*vllmpb.EmbedResponse, error) {
	ids := req.GetTokenized().GetInputIds()
	vec, err := v.s.embedGRPC(ctx, ids, -1)
	if err != nil {
		return nil, err
	}
	return &vllmpb.EmbedResponse{Embedding: vec, PromptTokens: uint32(len(ids)), EmbeddingDim: uint32(len(vec))}, nil
}

func (v vllmServicer) HealthCheck(context.Context, *vllmpb.HealthCheckRequest) (*vllmpb.HealthCheckResponse, error) {
	return &vllmpb.HealthCheckResponse{Healthy: true, Message: "ok"}, nil
}

func (v vllmServicer) Abort(_ context.Context, req *vllmpb.AbortRequest) (*vllmpb.AbortResponse, error) {
	v.s.grpcReqs.abort(req.GetRequestIds()...)
	return &vllmpb.AbortResponse{}, nil
}

func (v vllmServicer) GetModelInfo(context.Context, *vllmpb.GetModelInfoRequest) (*vllmpb.GetModelInfoResponse, error) {
	o := v.s.opts
	return &vllmpb.GetModelInfoResponse{ModelPath: o.Model, IsGeneration: true, MaxContextLength: uint32(o.KVCapacityTokens),
		VocabSize: uint32(vocabSize()), ServedModelName: o.Model, TokenizerPath: o.Model, ModelType: "sim",
		Architectures: []string{"SimForCausalLM"}, EosTokenIds: []int32{tokEOS}, BosTokenId: tokBOS,
		MaxReqInputLen: int32(o.KVCapacityTokens - 1)}, nil
}

func (v vllmServicer) GetServerInfo(context.Context, *vllmpb.GetServerInfoRequest) (*vllmpb.GetServerInfoResponse, error) {
	s, o := v.s, v.s.opts
	info := &vllmpb.GetServerInfoResponse{ActiveRequests: uint32(s.activeRequests()), IsPaused: s.Fault().Freeze,
		UptimeSeconds: time.Since(s.startedAt()).Seconds(), ServerType: "vllm-grpc", DataParallelSize: int32(o.DPSize)}
	switch o.Role {
	case RolePrefill:
		info.KvConnector, info.KvRole = "SimConnector", "kv_producer"
	case RoleDecode:
		info.KvConnector, info.KvRole = "SimConnector", "kv_consumer"
	}
	return info, nil
}

func (v vllmServicer) GetLoads(_ context.Context, req *vllmpb.GetLoadsRequest) (*vllmpb.GetLoadsResponse, error) {
	v.s.getLoads.Add(1)
	rank, err := rankArg(req.DpRank, v.s.opts.DPSize)
	if err != nil {
		return nil, err
	}
	out := &vllmpb.GetLoadsResponse{Timestamp: time.Now().UTC().Format(time.RFC3339Nano), Version: "sim"}
	for _, r := range v.s.reports(rank) {
		l := v.s.pushed(r)
		out.Loads = append(out.Loads, &vllmpb.SchedulerLoad{DpRank: l.DpRank, NumRunningReqs: l.NumRunningReqs,
			NumWaitingReqs: l.NumWaitingReqs, NumTotalReqs: l.NumTotalReqs, NumUsedTokens: l.NumUsedTokens,
			MaxTotalNumTokens: l.MaxTotalNumTokens, TokenUsage: l.TokenUsage, GenThroughput: l.GenThroughput,
			Utilization: l.Utilization, MaxRunningRequests: l.MaxRunningRequests})
	}
	out.DpRankCount = int32(len(out.Loads))
	return out, nil
}

func (v vllmServicer) GetTokenizer(_ *commonpb.GetTokenizerRequest, stream grpc.ServerStreamingServer[commonpb.GetTokenizerChunk]) error {
	return sendTokenizer(stream.Send)
}

func (v vllmServicer) SubscribeKvEvents(req *commonpb.SubscribeKvEventsRequest, stream grpc.ServerStreamingServer[commonpb.KvEventBatch]) error {
	return v.s.subscribeKV(stream.Context(), req.GetStartSequenceNumber(), stream.Send)
}
