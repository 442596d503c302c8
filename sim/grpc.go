package sim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	sglangpb "github.com/smg-project/smg/gen/sglang/grpc/scheduler"
	commonpb "github.com/smg-project/smg/gen/smg/grpc/common"
	vllmpb "github.com/smg-project/smg/gen/vllm/grpc/engine"
)

// tokenizerChunk is the size of one GetTokenizer message.
const tokenizerChunk = 16 << 10

// GRPCURL is the engine's gRPC URL, grpc://host:port (grpcs:// with TLS),
// or "" when it serves no gRPC.
func (s *Server) GRPCURL() string {
	if s.grpcAddr == "" {
		return ""
	}
	if s.opts.TLS != nil {
		return "grpcs://" + s.grpcAddr
	}
	return "grpc://" + s.grpcAddr
}

// KVStreams is the number of SubscribeKvEvents streams open now (GET
// /sim/stats kv_streams): how many readers follow the engine's KV events.
func (s *Server) KVStreams() int { return int(s.kvStreams.Load()) }

// GetLoadsCalls is the number of GetLoads calls received (GET /sim/stats
// grpc_get_loads): how often the engine is polled over gRPC.
func (s *Server) GetLoadsCalls() int64 { return s.getLoads.Load() }

// GRPCAddr is the engine's gRPC host:port ("" without gRPC).
func (s *Server) GRPCAddr() string { return s.grpcAddr }

// serveGRPCLocked starts a gRPC server on ln with the flavor's service. A
// kill stops it; a revive calls this again on the same address.
func (s *Server) serveGRPCLocked(ln net.Listener) {
	opts := []grpc.ServerOption{
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: time.Second, PermitWithoutStream: true}),
	}
	if s.opts.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.opts.TLS)))
	}
	gs := grpc.NewServer(opts...)
	if s.opts.Flavor == FlavorSGLang {
		sglangpb.RegisterSglangSchedulerServer(gs, sglangServicer{s: s})
	} else {
		vllmpb.RegisterVllmEngineServer(gs, vllmServicer{s: s})
	}
	s.gs = gs
	l := trackListener{resetListener{ln, &s.resetting}, s}
	go func() {
		if err := gs.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.log.Error("grpc serve", "err", err)
		}
	}()
	s.log.Info("engine gRPC listening", "url", s.GRPCURL())
}

// trackListener records the connections it accepts in s.conns, so the
// reset fault can cut them as it cuts HTTP connections.
type trackListener struct {
	net.Listener
	s *Server
}

func (l trackListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c, s: l.s}
	l.s.connMu.Lock()
	l.s.conns[tc] = struct{}{}
	l.s.connMu.Unlock()
	return tc, nil
}

type trackedConn struct {
	net.Conn
	s    *Server
	once sync.Once
}

// NetConn lets abortConn reach the TCP connection.
func (c *trackedConn) NetConn() net.Conn { return c.Conn }

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.s.connMu.Lock()
		delete(c.s.conns, c)
		c.s.connMu.Unlock()
	})
	return c.Conn.Close()
}

// genParams is a Generate request, flavor aside.
type genParams struct {
	id        string
	ids       []uint32
	maxTokens int // 0: the default
	stream    bool
	dpRank    int // -1: the engine picks
	pd        *pdInfo
	logprobs  int // alternatives per position, -1: no logprobs
}

// genUpdate is what one Generate response carries.
type genUpdate struct {
	tokens             []uint32 // new tokens (a chunk) or every token (the end)
	start              int      // the position of tokens[0] in the output
	done               bool
	finish             string
	prompt, completion int
}

// generateGRPC runs one Generate call: it submits the request and calls send
// with each batch of new tokens (streaming) and once at the end.
func (s *Server) generateGRPC(ctx context.Context, p genParams, send func(genUpdate) error) error {
	if len(p.ids) == 0 {
		return status.Error(codes.InvalidArgument, "tokenized.input_ids must not be empty")
	}
	maxTokens := p.maxTokens
	if maxTokens == 0 {
		maxTokens = s.opts.DefaultMaxTokens
	}
	spec := submitSpec{promptTokens: len(p.ids), maxTokens: maxTokens, dpRank: p.dpRank, pd: p.pd,
		stream: p.stream && s.opts.Role != RolePrefill, ids: p.ids}
	if s.opts.Role != RoleRegular {
		if p.pd == nil || (s.opts.Role == RoleDecode && (p.pd.host == "" || p.pd.port == 0)) {
			return status.Errorf(codes.InvalidArgument, "%s engine needs bootstrap_host, bootstrap_port and bootstrap_room", s.opts.Role)
		}
		if s.opts.Role == RolePrefill {
			spec.maxTokens = 1 // a prefill engine only computes the first token
		}
	}
	e := s.eng.Load()
	if e == nil {
		return status.Error(codes.Unavailable, errEngineStopped.Error())
	}
	id := p.id
	if id == "" {
		id = "sim-" + strconv.FormatUint(e.ids.Add(1), 10)
	}
	req, err := e.submit(ctx, spec)
	switch {
	case errors.Is(err, errTooLong), errors.Is(err, errRoomInUse):
		return status.Error(codes.InvalidArgument, err.Error())
	case err != nil:
		return status.Error(codes.Unavailable, err.Error())
	}
	defer req.cancel()
	if !s.grpcReqs.add(id, req) {
		return status.Errorf(codes.AlreadyExists, "request_id %q is already running", id)
	}
	defer s.grpcReqs.remove(id, req)
	words := rand.New(rand.NewPCG(req.seed, 0))
	var out []uint32
	sent := 0
	for {
		done := req.done.Load()
		for n := int(req.generated.Load()); len(out) < n; {
			out = append(out, wordID(words.IntN(len(vocab))))
		}
		if p.stream && len(out) > sent {
			if err := send(genUpdate{tokens: out[sent:], start: sent, prompt: len(p.ids), completion: len(out)}); err != nil {
				return err
			}
			sent = len(out)
		}
		if done {
			finish := req.finish
			switch {
			case errors.Is(req.err, context.Canceled) && ctx.Err() == nil:
				finish = "abort" // an Abort call, not the client leaving
			case req.err != nil:
				return status.Error(codes.Internal, req.err.Error())
			}
			return send(genUpdate{tokens: out, done: true, finish: finish, prompt: len(p.ids), completion: len(out)})
		}
		select {
		case <-req.notify:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// grpcRequests maps running Generate calls by request id, for Abort.
type grpcRequests struct {
	mu      sync.Mutex
	m       map[string]*request
	aborted uint64 // requests ended by Abort
	started uint64 // Generate requests admitted
}

func (g *grpcRequests) add(id string, r *request) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.m == nil {
		g.m = map[string]*request{}
	}
	if _, dup := g.m[id]; dup {
		return false
	}
	g.m[id] = r
	g.started++
	return true
}

func (g *grpcRequests) remove(id string, r *request) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.m[id] == r {
		delete(g.m, id)
	}
}

// abort cancels the named requests; it reports how many were running.
func (g *grpcRequests) abort(ids ...string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, id := range ids {
		if r := g.m[id]; r != nil {
			r.cancel()
			n++
		}
	}
	g.aborted += uint64(n)
	return n
}

// GRPCRequests is how many Generate requests the engine took.
func (s *Server) GRPCRequests() uint64 {
	s.grpcReqs.mu.Lock()
	defer s.grpcReqs.mu.Unlock()
	return s.grpcReqs.started
}

// GRPCAborts is how many running Generate requests an Abort call ended.
func (s *Server) GRPCAborts() uint64 {
	s.grpcReqs.mu.Lock()
	defer s.grpcReqs.mu.Unlock()
	return s.grpcReqs.aborted
}

// rankReport is one rank's load for GetLoads and the pushed load records.
type rankReport struct {
	rank                          int
	running, waiting, used, total int
	window                        int
	usage, throughput             float64
	silence                       time.Duration
	prefill                       int64
}

// reports reads every rank's load (rank filters to one rank when >= 0); nil
// while killed or with silent metrics. The garbage fault reports absurd
// figures: what a broken servicer would send.
func (s *Server) reports(rank int) []rankReport {
	e := s.eng.Load()
	if e == nil || s.silent.Load() {
		return nil
	}
	now := time.Now()
	var out []rankReport
	for _, r := range e.ranks {
		if rank >= 0 && r.id != rank {
			continue
		}
		st := r.stats(now)
		r.mu.Lock()
		silence, prefill := r.silence(now), r.prefillInHand()
		r.mu.Unlock()
		rr := rankReport{rank: r.id, running: st.Running, waiting: st.Waiting, used: st.KVUsed,
			total: st.Capacity, window: st.Window, usage: st.usage(), throughput: st.Throughput,
			silence: silence, prefill: prefill}
		if s.garbage.Load() {
			rr = rankReport{rank: math.MaxInt32, running: -5, waiting: math.MaxInt32, used: -1, total: -1,
				window: -1, usage: math.NaN(), throughput: math.Inf(1), silence: -time.Hour, prefill: -1}
		}
		out = append(out, rr)
	}
	return out
}

// pushed is a rank's load record as it rides a KV event batch.
func (s *Server) pushed(r rankReport) *commonpb.PushedLoad {
	l := &commonpb.PushedLoad{
		DpRank: int32(r.rank), NumRunningReqs: int32(r.running), NumWaitingReqs: int32(r.waiting),
		NumTotalReqs: int32(r.running + r.waiting), NumUsedTokens: int32(r.used), MaxTotalNumTokens: int32(r.total),
		TokenUsage: r.usage, GenThroughput: r.throughput, Utilization: float64(r.running) / float64(max(r.window, 1)),
		MaxRunningRequests: int32(r.window), PrefillTokensInHand: r.prefill, StepWire: s.opts.Flavor == FlavorVLLM,
	}
	if s.opts.GRPCExtensions == ExtensionsAll {
		sec := r.silence.Seconds()
		l.EngineSilenceSeconds = &sec
	}
	return l
}

// subscribeKV streams KV event batches from the current state (or after
// start, when it is still kept): every batch with its rank's load record,
// and a heartbeat for every rank quiet for the heartbeat interval.
func (s *Server) subscribeKV(ctx context.Context, start uint64, send func(*commonpb.KvEventBatch) error) error {
	s.kvStreams.Add(1)
	defer s.kvStreams.Add(-1)
	e := s.eng.Load()
	if e == nil {
		return status.Error(codes.Unavailable, errEngineStopped.Error())
	}
	after := e.kvLog.newest()
	if start > 0 {
		for i := range after {
			after[i] = min(after[i], start)
		}
	}
	ext := s.opts.GRPCExtensions != ExtensionsNone
	lastSent := make([]time.Time, len(after))
	now := time.Now()
	for i := range lastSent {
		lastSent[i] = now
	}
	timer := time.NewTimer(s.opts.KVHeartbeat)
	defer timer.Stop()
	load := func(rank int) *commonpb.PushedLoad {
		if !ext {
			return nil
		}
		if rs := s.reports(rank); len(rs) == 1 {
			return s.pushed(rs[0])
		}
		return nil
	}
	for {
		batches, changed := e.kvLog.since(after)
		stalled := s.Fault().StallKVEvents
		if !stalled {
			for _, b := range batches {
				msg := &commonpb.KvEventBatch{SequenceNumber: b.seq, Timestamp: float64(b.at.UnixNano()) / 1e9,
					DpRank: ptr(int32(b.rank)), Load: load(b.rank), Events: kvEvents(b.events)}
				if err := send(msg); err != nil {
					return err
				}
				after[b.rank] = b.seq
				lastSent[b.rank] = time.Now()
			}
		}
		now := time.Now()
		next := now.Add(s.opts.KVHeartbeat)
		for rank, at := range lastSent {
			due := at.Add(s.opts.KVHeartbeat)
			if stalled || !ext {
				continue
			}
			if !due.After(now) {
				msg := &commonpb.KvEventBatch{SequenceNumber: after[rank], Timestamp: float64(now.UnixNano()) / 1e9,
					DpRank: ptr(int32(rank)), Heartbeat: true, Load: load(rank)}
				if err := send(msg); err != nil {
					return err
				}
				lastSent[rank] = now
				due = now.Add(s.opts.KVHeartbeat)
			}
			if due.Before(next) {
				next = due
			}
		}
		timer.Reset(time.Until(next))
		select {
		case <-changed:
		case <-timer.C:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-e.stop:
			return status.Error(codes.Unavailable, errEngineStopped.Error())
		}
	}
}

func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

func ptr[T any](v T) *T { return &v }

func kvEvents(evs []kvEvent) []*commonpb.KvCacheEvent {
	out := make([]*commonpb.KvCacheEvent, 0, len(evs))
	for _, ev := range evs {
		ce := &commonpb.KvCacheEvent{EventId: ev.id}
		if ev.stored {
			blocks := make([]*commonpb.KvBlock, len(ev.hashes))
			for i, h := range ev.hashes {
				blocks[i] = &commonpb.KvBlock{BlockHash: h, TokenIds: ev.tokens[i], BlockSize: kvBlockSize}
			}
			ce.Data = &commonpb.KvCacheEvent_Stored{Stored: &commonpb.KvBlocksStored{Blocks: blocks}}
		} else {
			ce.Data = &commonpb.KvCacheEvent_Removed{Removed: &commonpb.KvBlocksRemoved{BlockHashes: ev.hashes}}
		}
		out = append(out, ce)
	}
	return out
}

// sendTokenizer streams the tokenizer archive in chunks, the digest on the last.
func sendTokenizer(send func(*commonpb.GetTokenizerChunk) error) error {
	data, sum := tokenizerArchive()
	for off := 0; off < len(data); off += tokenizerChunk {
		end := min(off+tokenizerChunk, len(data))
		c := &commonpb.GetTokenizerChunk{Data: data[off:end]}
		if end == len(data) {
			c.Sha256 = sum
		}
		if err := send(c); err != nil {
			return err
		}
	}
	return nil
}

// bootstrapPort is a prefill engine's KV bootstrap port: its HTTP port.
func (s *Server) bootstrapPort() int {
	if s.opts.Role != RolePrefill {
		return 0
	}
	_, p, err := net.SplitHostPort(s.addr)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(p)
	return n
}

// activeRequests is the requests the engine holds.
func (s *Server) activeRequests() int {
	n := 0
	for _, r := range s.reports(-1) {
		n += r.running + r.waiting
	}
	return max(n, 0)
}

// rankArg reads an optional DP rank filter.
func rankArg(p *int32, ranks int) (int, error) {
	if p == nil {
		return -1, nil
	}
	if *p < 0 || int(*p) >= ranks {
		return 0, status.Error(codes.InvalidArgument, fmt.Sprintf("dp_rank %d: the engine has ranks 0..%d", *p, ranks-1))
	}
	return int(*p), nil
}
