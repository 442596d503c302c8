package sim

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"math"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	sglangpb "github.com/smg-project/smg/gen/sglang/grpc/scheduler"
	commonpb "github.com/smg-project/smg/gen/smg/grpc/common"
	vllmpb "github.com/smg-project/smg/gen/vllm/grpc/engine"
)

func grpcOptions(flavor string) Options {
	o := fastOptions()
	o.Flavor = flavor
	o.GRPC = true
	o.KVHeartbeat = 50 * time.Millisecond
	return o
}

func dial(t *testing.T, s *Server) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func ids(n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(firstWordID + i%len(vocab))
	}
	return out
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestGRPCGenerateSGLang: a streamed generation arrives as token batches
// whose concatenation is the final output, then a GenerateComplete.
func TestGRPCGenerateSGLang(t *testing.T) {
	s := startSim(t, grpcOptions(FlavorSGLang))
	c := sglangpb.NewSglangSchedulerClient(dial(t, s))
	st, err := c.Generate(ctxT(t), &sglangpb.GenerateRequest{RequestId: "r1", Stream: true,
		Tokenized:      &sglangpb.TokenizedInput{InputIds: ids(20)},
		SamplingParams: &sglangpb.SamplingParams{MaxNewTokens: proto.Uint32(6)}})
	if err != nil {
		t.Fatal(err)
	}
	var streamed []uint32
	var done *sglangpb.GenerateComplete
	for {
		r, err := st.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if r.GetRequestId() != "r1" {
			t.Fatalf("request id %q", r.GetRequestId())
		}
		if ch := r.GetChunk(); ch != nil {
			streamed = append(streamed, ch.GetTokenIds()...)
			if ch.GetCompletionTokens() != uint32(len(streamed)) || ch.GetPromptTokens() != 20 {
				t.Fatalf("chunk counts %v after %d tokens", ch, len(streamed))
			}
		}
		if r.GetComplete() != nil {
			done = r.GetComplete()
		}
	}
	if done == nil || done.GetFinishReason() != "length" || done.GetCompletionTokens() != 6 || len(streamed) != 6 {
		t.Fatalf("complete %v, streamed %v", done, streamed)
	}
	for i, id := range done.GetOutputIds() {
		if id != streamed[i] || id < firstWordID || int(id) >= vocabSize() {
			t.Fatalf("output %v, streamed %v", done.GetOutputIds(), streamed)
		}
	}
}

// TestGRPCGenerateVLLMNonStreaming: without stream, only the completion comes.
func TestGRPCGenerateVLLMNonStreaming(t *testing.T) {
	s := startSim(t, grpcOptions(FlavorVLLM))
	c := vllmpb.NewVllmEngineClient(dial(t, s))
	st, err := c.Generate(ctxT(t), &vllmpb.GenerateRequest{RequestId: "r1",
		Input:          &vllmpb.GenerateRequest_Tokenized{Tokenized: &vllmpb.TokenizedInput{InputIds: ids(5)}},
		SamplingParams: &vllmpb.SamplingParams{MaxTokens: proto.Uint32(4)}, DataParallelRank: proto.Int32(0)})
	if err != nil {
		t.Fatal(err)
	}
	var got []*vllmpb.GenerateResponse
	for {
		r, err := st.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r)
	}
	if len(got) != 1 || got[0].GetComplete().GetCompletionTokens() != 4 || len(got[0].GetComplete().GetOutputIds()) != 4 {
		t.Fatalf("got %v", got)
	}
}

// TestGRPCGenerateBadInput: no input ids, a prompt larger than the cache,
// a duplicate request id and a PD leg without its bootstrap fields are
// refused with InvalidArgument or AlreadyExists, not a hang.
func TestGRPCGenerateBadInput(t *testing.T) {
	o := grpcOptions(FlavorSGLang)
	o.KVCapacityTokens = 100
	o.ITL = 50 * time.Millisecond
	s := startSim(t, o)
	c := sglangpb.NewSglangSchedulerClient(dial(t, s))
	ctx := ctxT(t)
	recvErr := func(req *sglangpb.GenerateRequest) error {
		st, err := c.Generate(ctx, req)
		if err != nil {
			return err
		}
		for {
			if _, err := st.Recv(); err != nil {
				return err
			}
		}
	}
	if err := recvErr(&sglangpb.GenerateRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("empty input: %v", err)
	}
	if err := recvErr(&sglangpb.GenerateRequest{Tokenized: &sglangpb.TokenizedInput{InputIds: ids(200)}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("too long: %v", err)
	}
	long, err := c.Generate(ctx, &sglangpb.GenerateRequest{RequestId: "dup", Stream: true,
		Tokenized: &sglangpb.TokenizedInput{InputIds: ids(4)}, SamplingParams: &sglangpb.SamplingParams{MaxNewTokens: proto.Uint32(50)}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := long.Recv(); err != nil { // the first token: the request is registered
		t.Fatal(err)
	}
	if err := recvErr(&sglangpb.GenerateRequest{RequestId: "dup", Tokenized: &sglangpb.TokenizedInput{InputIds: ids(4)},
		SamplingParams: &sglangpb.SamplingParams{MaxNewTokens: proto.Uint32(2)}}); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("duplicate: %v", err)
	}
	o.Role = RoleDecode
	d := startSim(t, o)
	dc := sglangpb.NewSglangSchedulerClient(dial(t, d))
	st, err := dc.Generate(ctx, &sglangpb.GenerateRequest{Tokenized: &sglangpb.TokenizedInput{InputIds: ids(4)}})
	if err == nil {
		_, err = st.Recv()
	}
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("decode without bootstrap: %v", err)
	}
}

// TestGRPCAbort: Abort ends a running generation with finish_reason abort.
func TestGRPCAbort(t *testing.T) {
	for _, flavor := range []string{FlavorSGLang, FlavorVLLM} {
		t.Run(flavor, func(t *testing.T) {
			o := grpcOptions(flavor)
			o.ITL = 20 * time.Millisecond
			s := startSim(t, o)
			conn := dial(t, s)
			ctx := ctxT(t)
			var finish string
			if flavor == FlavorSGLang {
				c := sglangpb.NewSglangSchedulerClient(conn)
				st, err := c.Generate(ctx, &sglangpb.GenerateRequest{RequestId: "a", Stream: true,
					Tokenized: &sglangpb.TokenizedInput{InputIds: ids(4)}, SamplingParams: &sglangpb.SamplingParams{MaxNewTokens: proto.Uint32(10000)}})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := st.Recv(); err != nil {
					t.Fatal(err)
				}
				if r, err := c.Abort(ctx, &sglangpb.AbortRequest{RequestId: "a"}); err != nil || !r.GetSuccess() {
					t.Fatalf("abort: %v %v", r, err)
				}
				for finish == "" {
					r, err := st.Recv()
					if err != nil {
						t.Fatal(err)
					}
					finish = r.GetComplete().GetFinishReason()
				}
			} else {
				c := vllmpb.NewVllmEngineClient(conn)
				st, err := c.Generate(ctx, &vllmpb.GenerateRequest{RequestId: "a", Stream: true,
					Input:          &vllmpb.GenerateRequest_Tokenized{Tokenized: &vllmpb.TokenizedInput{InputIds: ids(4)}},
					SamplingParams: &vllmpb.SamplingParams{MaxTokens: proto.Uint32(10000)}})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := st.Recv(); err != nil {
					t.Fatal(err)
				}
				if _, err := c.Abort(ctx, &vllmpb.AbortRequest{RequestIds: []string{"a", "unknown"}}); err != nil {
					t.Fatal(err)
				}
				for finish == "" {
					r, err := st.Recv()
					if err != nil {
						t.Fatal(err)
					}
					finish = r.GetComplete().GetFinishReason()
				}
			}
			if finish != "abort" {
				t.Fatalf("finish %q", finish)
			}
		})
	}
}

// TestGRPCInfo: model, server info and loads per flavor, DP ranks and PD role.
func TestGRPCInfo(t *testing.T) {
	o := grpcOptions(FlavorSGLang)
	o.DPSize = 2
	o.Role = RolePrefill
	s := startSim(t, o)
	ctx := ctxT(t)
	c := sglangpb.NewSglangSchedulerClient(dial(t, s))
	mi, err := c.GetModelInfo(ctx, &sglangpb.GetModelInfoRequest{})
	if err != nil || mi.GetServedModelName() != o.Model || mi.GetVocabSize() != int32(vocabSize()) {
		t.Fatalf("model info %v %v", mi, err)
	}
	si, err := c.GetServerInfo(ctx, &sglangpb.GetServerInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	args := si.GetServerArgs().GetFields()
	if args["max_running_requests"].GetNumberValue() != float64(o.MaxRunningRequests) || args["dp_size"].GetNumberValue() != 2 ||
		args["disaggregation_mode"].GetStringValue() != "prefill" || int(args["disaggregation_bootstrap_port"].GetNumberValue()) != s.bootstrapPort() ||
		s.bootstrapPort() == 0 || si.GetServerType() != "grpc" {
		t.Fatalf("server info %v", si)
	}
	loads, err := c.GetLoads(ctx, &sglangpb.GetLoadsRequest{})
	if err != nil || loads.GetDpRankCount() != 2 || len(loads.GetLoads()) != 2 || loads.GetLoads()[1].GetDpRank() != 1 ||
		loads.GetLoads()[0].GetMaxRunningRequests() != int32(o.MaxRunningRequests) {
		t.Fatalf("loads %v %v", loads, err)
	}
	one, err := c.GetLoads(ctx, &sglangpb.GetLoadsRequest{DpRank: proto.Int32(1)})
	if err != nil || len(one.GetLoads()) != 1 || one.GetLoads()[0].GetDpRank() != 1 {
		t.Fatalf("rank 1: %v %v", one, err)
	}
	if _, err := c.GetLoads(ctx, &sglangpb.GetLoadsRequest{DpRank: proto.Int32(7)}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("rank 7: %v", err)
	}
	if h, err := c.HealthCheck(ctx, &sglangpb.HealthCheckRequest{}); err != nil || !h.GetHealthy() {
		t.Fatalf("health %v %v", h, err)
	}

	vo := grpcOptions(FlavorVLLM)
	vo.Role = RoleDecode
	vo.DPSize = 3
	v := startSim(t, vo)
	vc := vllmpb.NewVllmEngineClient(dial(t, v))
	vsi, err := vc.GetServerInfo(ctx, &vllmpb.GetServerInfoRequest{})
	if err != nil || vsi.GetKvRole() != "kv_consumer" || vsi.GetDataParallelSize() != 3 || vsi.GetServerType() != "vllm-grpc" {
		t.Fatalf("vllm server info %v %v", vsi, err)
	}
	vl, err := vc.GetLoads(ctx, &vllmpb.GetLoadsRequest{})
	if err != nil || len(vl.GetLoads()) != 3 {
		t.Fatalf("vllm loads %v %v", vl, err)
	}
	// The engine serves its own flavor only.
	if _, err := sglangpb.NewSglangSchedulerClient(dial(t, v)).GetLoads(ctx, &sglangpb.GetLoadsRequest{}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("sglang call on a vllm engine: %v", err)
	}
}

// TestGRPCTokenizer: the chunks make a zip whose digest the last one carries.
func TestGRPCTokenizer(t *testing.T) {
	s := startSim(t, grpcOptions(FlavorVLLM))
	st, err := vllmpb.NewVllmEngineClient(dial(t, s)).GetTokenizer(ctxT(t), &commonpb.GetTokenizerRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	var sum string
	for {
		ch, err := st.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if sum != "" {
			t.Fatal("a chunk after the digest")
		}
		buf.Write(ch.GetData())
		sum = ch.GetSha256()
	}
	got := sha256.Sum256(buf.Bytes())
	if hex.EncodeToString(got[:]) != sum {
		t.Fatalf("digest %q", sum)
	}
	zr, err := zip.NewReader(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range zr.File {
		names[f.Name] = true
	}
	if !names["tokenizer.json"] || !names["tokenizer_config.json"] {
		t.Fatalf("archive holds %v", names)
	}
}

// kvRecv reads batches until one satisfies ok.
func kvRecv(t *testing.T, st grpc.ServerStreamingClient[commonpb.KvEventBatch], ok func(*commonpb.KvEventBatch) bool) *commonpb.KvEventBatch {
	t.Helper()
	for {
		b, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if ok(b) {
			return b
		}
	}
}

// TestGRPCKVEvents: a prompt's full blocks are stored when its prefill is
// done and removed when it ends; every batch carries its rank's load
// record; quiet spells bring heartbeats with the load.
func TestGRPCKVEvents(t *testing.T) {
	s := startSim(t, grpcOptions(FlavorSGLang))
	conn := dial(t, s)
	c := sglangpb.NewSglangSchedulerClient(conn)
	ctx := ctxT(t)
	kv, err := c.SubscribeKvEvents(ctx, &commonpb.SubscribeKvEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	hb := kvRecv(t, kv, func(b *commonpb.KvEventBatch) bool { return b.GetHeartbeat() })
	if hb.GetLoad() == nil || hb.GetLoad().EngineSilenceSeconds == nil || len(hb.GetEvents()) != 0 || hb.DpRank == nil {
		t.Fatalf("heartbeat %v", hb)
	}
	gen, err := c.Generate(ctx, &sglangpb.GenerateRequest{Tokenized: &sglangpb.TokenizedInput{InputIds: ids(40)},
		SamplingParams: &sglangpb.SamplingParams{MaxNewTokens: proto.Uint32(3)}})
	if err != nil {
		t.Fatal(err)
	}
	stored := kvRecv(t, kv, func(b *commonpb.KvEventBatch) bool { return len(b.GetEvents()) > 0 })
	blocks := stored.GetEvents()[0].GetStored().GetBlocks()
	if len(blocks) != 40/kvBlockSize || blocks[0].GetBlockSize() != kvBlockSize || len(blocks[0].GetTokenIds()) != kvBlockSize ||
		stored.GetLoad() == nil || stored.GetSequenceNumber() == 0 || stored.GetHeartbeat() {
		t.Fatalf("stored batch %v", stored)
	}
	for {
		if _, err := gen.Recv(); err != nil {
			break
		}
	}
	removed := kvRecv(t, kv, func(b *commonpb.KvEventBatch) bool { return len(b.GetEvents()) > 0 })
	hashes := removed.GetEvents()[0].GetRemoved().GetBlockHashes()
	if len(hashes) != len(blocks) || hashes[0] != blocks[0].GetBlockHash() || removed.GetSequenceNumber() != stored.GetSequenceNumber()+1 {
		t.Fatalf("removed %v after stored %v", removed, stored)
	}

	// Resuming after the stored batch replays the removal.
	again, err := c.SubscribeKvEvents(ctx, &commonpb.SubscribeKvEventsRequest{StartSequenceNumber: stored.GetSequenceNumber()})
	if err != nil {
		t.Fatal(err)
	}
	if b := kvRecv(t, again, func(b *commonpb.KvEventBatch) bool { return !b.GetHeartbeat() }); b.GetSequenceNumber() != removed.GetSequenceNumber() {
		t.Fatalf("resumed at %d, want %d", b.GetSequenceNumber(), removed.GetSequenceNumber())
	}
}

// TestGRPCExtensionLevels: "load" sends records without the silence
// figure (an older servicer); "none" sends plain batches and no heartbeat.
func TestGRPCExtensionLevels(t *testing.T) {
	o := grpcOptions(FlavorVLLM)
	o.GRPCExtensions = ExtensionsLoad
	s := startSim(t, o)
	ctx := ctxT(t)
	kv, err := vllmpb.NewVllmEngineClient(dial(t, s)).SubscribeKvEvents(ctx, &commonpb.SubscribeKvEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	hb := kvRecv(t, kv, func(b *commonpb.KvEventBatch) bool { return b.GetHeartbeat() })
	if hb.GetLoad() == nil || hb.GetLoad().EngineSilenceSeconds != nil || !hb.GetLoad().GetStepWire() {
		t.Fatalf("load-level heartbeat %v", hb)
	}

	o.GRPCExtensions = ExtensionsNone
	n := startSim(t, o)
	conn := dial(t, n)
	nkv, err := vllmpb.NewVllmEngineClient(conn).SubscribeKvEvents(ctx, &commonpb.SubscribeKvEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	gen, err := vllmpb.NewVllmEngineClient(conn).Generate(ctx, &vllmpb.GenerateRequest{
		Input: &vllmpb.GenerateRequest_Tokenized{Tokenized: &vllmpb.TokenizedInput{InputIds: ids(32)}}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := nkv.Recv() // the first message is the stored batch: no heartbeat came before it
	if err != nil || b.GetHeartbeat() || b.GetLoad() != nil || len(b.GetEvents()) == 0 {
		t.Fatalf("plain batch %v %v", b, err)
	}
	for {
		if _, err := gen.Recv(); err != nil {
			break
		}
	}
}

// TestGRPCFreezeSilence: a frozen engine holding a streaming request keeps
// answering heartbeats, and their silence figure grows from the request's
// arrival; prefill in hand is reported.
func TestGRPCFreezeSilence(t *testing.T) {
	o := grpcOptions(FlavorSGLang)
	o.Fault.Freeze = true
	s := startSim(t, o)
	conn := dial(t, s)
	c := sglangpb.NewSglangSchedulerClient(conn)
	ctx := ctxT(t)
	kv, err := c.SubscribeKvEvents(ctx, &commonpb.SubscribeKvEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if hb := kvRecv(t, kv, func(b *commonpb.KvEventBatch) bool { return b.GetHeartbeat() }); hb.GetLoad().GetEngineSilenceSeconds() != 0 {
		t.Fatalf("idle engine reports silence %v", hb.GetLoad())
	}
	if _, err := c.Generate(ctx, &sglangpb.GenerateRequest{Stream: true, Tokenized: &sglangpb.TokenizedInput{InputIds: ids(30)}}); err != nil {
		t.Fatal(err)
	}
	hb := kvRecv(t, kv, func(b *commonpb.KvEventBatch) bool { return b.GetLoad().GetEngineSilenceSeconds() >= 0.15 })
	if l := hb.GetLoad(); l.GetNumWaitingReqs() != 1 || l.GetPrefillTokensInHand() != 30 || l.GetStepWire() {
		t.Fatalf("frozen record %v", l)
	}
	if si, err := c.GetServerInfo(ctx, &sglangpb.GetServerInfoRequest{}); err != nil || !si.GetIsPaused() {
		t.Fatalf("server info while frozen: %v %v", si, err)
	}
}

// TestGRPCFaults: kill cuts the streams and the listener, and clearing it
// serves again on the same address; reset fails calls; a stalled event
// stream sends nothing while GetLoads answers; garbage sends absurd loads.
func TestGRPCFaults(t *testing.T) {
	o := grpcOptions(FlavorVLLM)
	s := startSim(t, o)
	addr := s.GRPCAddr()
	conn := dial(t, s)
	c := vllmpb.NewVllmEngineClient(conn)
	ctx := ctxT(t)

	kv, err := c.SubscribeKvEvents(ctx, &commonpb.SubscribeKvEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	kvRecv(t, kv, func(b *commonpb.KvEventBatch) bool { return b.GetHeartbeat() })
	if err := s.SetFault(Fault{Kill: true}); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := kv.Recv(); err != nil {
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("killed stream ended with %v", err)
			}
			break
		}
	}
	if _, err := c.GetLoads(ctx, &vllmpb.GetLoadsRequest{}, grpc.WaitForReady(false)); status.Code(err) != codes.Unavailable {
		t.Fatalf("killed engine answered: %v", err)
	}
	if err := s.SetFault(Fault{}); err != nil {
		t.Fatal(err)
	}
	if s.GRPCAddr() != addr {
		t.Fatalf("revived on %s, not %s", s.GRPCAddr(), addr)
	}
	if _, err := c.GetLoads(ctx, &vllmpb.GetLoadsRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("revived engine: %v", err)
	}

	if err := s.SetFault(Fault{Reset: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetLoads(ctx, &vllmpb.GetLoadsRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("resetting engine answered: %v", err)
	}
	if err := s.SetFault(Fault{StallKVEvents: true}); err != nil {
		t.Fatal(err)
	}
	stalled, err := c.SubscribeKvEvents(ctx, &commonpb.SubscribeKvEventsRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := stalled.Recv()
		got <- err
	}()
	if _, err := c.GetLoads(ctx, &vllmpb.GetLoadsRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("GetLoads while the event stream stalls: %v", err)
	}
	select {
	case err := <-got:
		t.Fatalf("stalled stream sent something (%v)", err)
	case <-time.After(4 * o.KVHeartbeat):
	}
	if err := s.SetFault(Fault{GarbageMetrics: true}); err != nil { // clears the stall too
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("stream after the stall: %v", err)
	}
	l, err := c.GetLoads(ctx, &vllmpb.GetLoadsRequest{})
	if err != nil || len(l.GetLoads()) != 1 || !math.IsNaN(l.GetLoads()[0].GetTokenUsage()) || l.GetLoads()[0].GetNumRunningReqs() >= 0 {
		t.Fatalf("garbage loads %v %v", l, err)
	}
	if err := s.SetFault(Fault{SilentMetrics: true}); err != nil {
		t.Fatal(err)
	}
	if l, err := c.GetLoads(ctx, &vllmpb.GetLoadsRequest{}); err != nil || len(l.GetLoads()) != 0 {
		t.Fatalf("silent loads %v %v", l, err)
	}
}

// TestGRPCEmbed: Embed answers the prompt's embedding (a unit vector of the
// ids alone) after the prompt went through the engine; refusals are gRPC
// statuses.
func TestGRPCEmbed(t *testing.T) {
	o := grpcOptions(FlavorSGLang)
	o.KVCapacityTokens = 100
	s := startSim(t, o)
	c := sglangpb.NewSglangSchedulerClient(dial(t, s))
	ctx := ctxT(t)
	r, err := c.Embed(ctx, &sglangpb.EmbedRequest{Tokenized: &sglangpb.TokenizedInput{InputIds: []uint32{5, 6, 7}}})
	if err != nil {
		t.Fatal(err)
	}
	var norm float64
	for _, v := range r.GetEmbedding() {
		norm += float64(v) * float64(v)
	}
	if r.GetEmbeddingDim() != EmbeddingDim || len(r.GetEmbedding()) != EmbeddingDim || r.GetPromptTokens() != 3 || math.Abs(norm-1) > 1e-5 {
		t.Fatalf("embedding: %v", r)
	}
	if other := Embedding([]uint32{5, 7, 6}); slices.Equal(other, r.GetEmbedding()) {
		t.Error("the order of the ids does not change the embedding")
	}
	for name, req := range map[string]*sglangpb.EmbedRequest{
		"empty":    {},
		"too long": {Tokenized: &sglangpb.TokenizedInput{InputIds: ids(200)}},
	} {
		if _, err := c.Embed(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v", name, err)
		}
	}
	o.Role = RolePrefill
	p := startSim(t, o)
	if _, err := sglangpb.NewSglangSchedulerClient(dial(t, p)).Embed(ctx, &sglangpb.EmbedRequest{
		Tokenized: &sglangpb.TokenizedInput{InputIds: []uint32{5}}}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("a prefill engine: %v", err)
	}
}
