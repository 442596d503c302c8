package enginegrpc

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math"

	"google.golang.org/grpc"

	sglangpb "github.com/smg-project/smg/gen/sglang/grpc/scheduler"
	commonpb "github.com/smg-project/smg/gen/smg/grpc/common"
	vllmpb "github.com/smg-project/smg/gen/vllm/grpc/engine"
)

// Info is what registration reads from a gRPC worker.
type Info struct {
	Flavor string
	// Model is the served model name (else the model path).
	Model string
	// MaxRunningRequests is the running window per DP rank (0: not reported).
	MaxRunningRequests int
	DPSize             int
	// Role is "prefill", "decode" or "" (regular), as the engine reports it.
	Role string
	// BootstrapPort is a prefill engine's KV bootstrap port (0: none).
	BootstrapPort int
	MaxContext    int
}

// Info reads the model (GetModelInfo), the window, DP size and PD role
// (GetServerInfo, then GetLoads for what the server info leaves out).
func (c *Client) Info(ctx context.Context) (Info, error) {
	f, err := c.Flavor(ctx)
	if err != nil {
		return Info{}, err
	}
	info := Info{Flavor: f, DPSize: 1}
	if f == FlavorSGLang {
		mi, err := c.sg.GetModelInfo(ctx, &sglangpb.GetModelInfoRequest{})
		if err != nil {
			return Info{}, c.wrap(err)
		}
		info.Model, info.MaxContext = first(mi.GetServedModelName(), mi.GetModelPath()), int(mi.GetMaxContextLength())
		si, err := c.sg.GetServerInfo(ctx, &sglangpb.GetServerInfoRequest{})
		if err != nil {
			return Info{}, c.wrap(err)
		}
		args := si.GetServerArgs().GetFields()
		info.MaxRunningRequests = intField(args["max_running_requests"].GetNumberValue())
		if n := intField(args["dp_size"].GetNumberValue()); n > 0 {
			info.DPSize = n
		}
		switch mode := args["disaggregation_mode"].GetStringValue(); mode {
		case "prefill", "decode":
			info.Role = mode
		}
		info.BootstrapPort = intField(args["disaggregation_bootstrap_port"].GetNumberValue())
	} else {
		mi, err := c.vl.GetModelInfo(ctx, &vllmpb.GetModelInfoRequest{})
		if err != nil {
			return Info{}, c.wrap(err)
		}
		info.Model, info.MaxContext = first(mi.GetServedModelName(), mi.GetModelPath()), int(min(mi.GetMaxContextLength(), math.MaxInt32))
		si, err := c.vl.GetServerInfo(ctx, &vllmpb.GetServerInfoRequest{})
		if err != nil {
			return Info{}, c.wrap(err)
		}
		if n := int(si.GetDataParallelSize()); n > 0 {
			info.DPSize = n
		}
		switch si.GetKvRole() {
		case "kv_producer":
			info.Role = "prefill"
		case "kv_consumer":
			info.Role = "decode"
		}
	}
	if info.Model == "" {
		return Info{}, fmt.Errorf("worker %s answered GetModelInfo without a model name", c.url)
	}
	if info.MaxRunningRequests <= 0 { // vLLM's server info has no window: its load report does
		loads, err := c.Loads(ctx)
		if err != nil {
			return Info{}, err
		}
		for _, l := range loads {
			info.MaxRunningRequests = max(info.MaxRunningRequests, l.MaxRunning)
		}
	}
	if info.MaxRunningRequests < 0 || info.MaxRunningRequests > 1<<20 {
		info.MaxRunningRequests = 0
	}
	if info.BootstrapPort < 0 || info.BootstrapPort > 65535 {
		info.BootstrapPort = 0
	}
	return info, nil
}

func first(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// intField reads a JSON number as an int; NaN, fractions and values out of
// int32 read as 0.
func intField(v float64) int {
	if v != math.Trunc(v) || v < math.MinInt32 || v > math.MaxInt32 {
		return 0
	}
	return int(v)
}

// RankLoad is one DP rank's load as GetLoads or a pushed record reports it.
type RankLoad struct {
	Rank         int
	Running      int
	Waiting      int
	TokenUsage   float64
	Throughput   float64
	CacheHitRate float64
	MaxRunning   int
	// KVCapacity is the rank's KV cache capacity in tokens
	// (max_total_num_tokens; 0: not reported).
	KVCapacity int64
}

// Loads reads GetLoads (every rank).
func (c *Client) Loads(ctx context.Context) ([]RankLoad, error) {
	f, err := c.Flavor(ctx)
	if err != nil {
		return nil, err
	}
	var out []RankLoad
	if f == FlavorSGLang {
		r, err := c.sg.GetLoads(ctx, &sglangpb.GetLoadsRequest{})
		if err != nil {
			return nil, c.wrap(err)
		}
		for _, l := range r.GetLoads() {
			out = append(out, RankLoad{Rank: int(l.GetDpRank()), Running: int(l.GetNumRunningReqs()), Waiting: int(l.GetNumWaitingReqs()),
				TokenUsage: l.GetTokenUsage(), Throughput: l.GetGenThroughput(), CacheHitRate: l.GetCacheHitRate(),
				MaxRunning: int(l.GetMaxRunningRequests()), KVCapacity: int64(l.GetMaxTotalNumTokens())})
		}
		return out, nil
	}
	r, err := c.vl.GetLoads(ctx, &vllmpb.GetLoadsRequest{})
	if err != nil {
		return nil, c.wrap(err)
	}
	for _, l := range r.GetLoads() {
		out = append(out, RankLoad{Rank: int(l.GetDpRank()), Running: int(l.GetNumRunningReqs()), Waiting: int(l.GetNumWaitingReqs()),
			TokenUsage: l.GetTokenUsage(), Throughput: l.GetGenThroughput(), CacheHitRate: l.GetCacheHitRate(),
			MaxRunning: int(l.GetMaxRunningRequests()), KVCapacity: int64(l.GetMaxTotalNumTokens())})
	}
	return out, nil
}

// PushedRankLoad reads the load record riding a KV event batch.
func PushedRankLoad(l *commonpb.PushedLoad) RankLoad {
	return RankLoad{Rank: int(l.GetDpRank()), Running: int(l.GetNumRunningReqs()), Waiting: int(l.GetNumWaitingReqs()),
		TokenUsage: l.GetTokenUsage(), Throughput: l.GetGenThroughput(), CacheHitRate: l.GetCacheHitRate(),
		MaxRunning: int(l.GetMaxRunningRequests()), KVCapacity: int64(l.GetMaxTotalNumTokens())}
}

// Check reports why a rank's load cannot be believed: a rank outside the
// engine's, a negative count, a usage that is not a fraction.
func (l RankLoad) Check(ranks int) error {
	switch {
	case l.Rank < 0 || l.Rank >= max(ranks, 1):
		return fmt.Errorf("dp_rank %d outside the engine's %d ranks", l.Rank, max(ranks, 1))
	case l.Running < 0 || l.Waiting < 0 || l.MaxRunning < 0 || l.KVCapacity < 0:
		return fmt.Errorf("rank %d: negative count (running %d, waiting %d, max running %d, max total tokens %d)", l.Rank, l.Running, l.Waiting, l.MaxRunning, l.KVCapacity)
	case !(l.TokenUsage >= 0 && l.TokenUsage <= 1.5): // NaN fails too; a little above 1 is seen on real engines
		return fmt.Errorf("rank %d: token usage %v is not a fraction", l.Rank, l.TokenUsage)
	case !(l.Throughput >= 0 && l.Throughput < math.Inf(1)):
		return fmt.Errorf("rank %d: throughput %v", l.Rank, l.Throughput)
	case !(l.CacheHitRate >= 0 && l.CacheHitRate <= 1):
		return fmt.Errorf("rank %d: cache hit rate %v is not a fraction", l.Rank, l.CacheHitRate)
	}
	return nil
}

// KVStream is a SubscribeKvEvents stream.
type KVStream = grpc.ServerStreamingClient[commonpb.KvEventBatch]

// SubscribeKV opens the engine's KV event stream (after start; 0: from now).
func (c *Client) SubscribeKV(ctx context.Context, start uint64) (KVStream, error) {
	f, err := c.Flavor(ctx)
	if err != nil {
		return nil, err
	}
	req := &commonpb.SubscribeKvEventsRequest{StartSequenceNumber: start}
	var st KVStream
	if f == FlavorSGLang {
		st, err = c.sg.SubscribeKvEvents(ctx, req)
	} else {
		st, err = c.vl.SubscribeKvEvents(ctx, req)
	}
	return st, c.wrap(err)
}

// MaxTokenizerBytes bounds the tokenizer archive GetTokenizer may stream.
const MaxTokenizerBytes = 64 << 20

// maxTokenizerChunks bounds the messages of one GetTokenizer stream, so a
// servicer streaming empty chunks forever is cut too.
const maxTokenizerChunks = 1 << 14

// Tokenizer reads the tokenizer archive (a zip), at most limit bytes,
// checks it against the SHA-256 the last chunk carries and that it opens as
// a zip. Its errors name the worker.
func (c *Client) Tokenizer(ctx context.Context, limit int) ([]byte, error) {
	f, err := c.Flavor(ctx)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream when reading stops early
	var st grpc.ServerStreamingClient[commonpb.GetTokenizerChunk]
	if f == FlavorSGLang {
		st, err = c.sg.GetTokenizer(ctx, &commonpb.GetTokenizerRequest{})
	} else {
		st, err = c.vl.GetTokenizer(ctx, &commonpb.GetTokenizerRequest{})
	}
	if err != nil {
		return nil, c.wrap(err)
	}
	var buf bytes.Buffer
	var sum string
	for n := 0; ; n++ {
		ch, err := st.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("worker %s: GetTokenizer: %w", c.url, c.wrap(err))
		}
		if sum != "" {
			return nil, fmt.Errorf("worker %s: GetTokenizer sent chunks after the one with the digest", c.url)
		}
		if n >= maxTokenizerChunks || buf.Len()+len(ch.GetData()) > limit {
			return nil, fmt.Errorf("worker %s: GetTokenizer streamed more than %d bytes or %d chunks", c.url, limit, maxTokenizerChunks)
		}
		buf.Write(ch.GetData())
		sum = ch.GetSha256()
	}
	if sum == "" {
		return nil, fmt.Errorf("worker %s: GetTokenizer ended without a SHA-256 digest", c.url)
	}
	got := sha256.Sum256(buf.Bytes())
	if hex.EncodeToString(got[:]) != sum {
		return nil, fmt.Errorf("worker %s: GetTokenizer archive does not match its SHA-256 %q", c.url, sum)
	}
	if _, err := zip.NewReader(bytes.NewReader(buf.Bytes()), int64(buf.Len())); err != nil {
		return nil, fmt.Errorf("worker %s: GetTokenizer archive is not a zip: %v", c.url, err)
	}
	return buf.Bytes(), nil
}
