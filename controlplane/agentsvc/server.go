// Package agentsvc serves AgentService: the stream on which per-node agents
// push what they observe of their engines (load records, contact, transport
// failures, the engine's own silence) and receive the engines assigned to
// their node.
//
// Pushed records feed the same ingester as the built-in poller (the overload
// check runs once per record) and the liveness tracker as pushed evidence, so
// agent-covered workers are judged by silence (the spec's "When a Worker Goes
// Silent Entirely"). The stream itself is one of the covered engines'
// channels: when it breaks, every engine it covered records a connection
// failure.
package agentsvc

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/smg-project/smg/controlplane/ingest"
	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/liveness"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/bearer"
)

// Options configure a Server.
type Options struct {
	// Token, when set, is required as gRPC metadata
	// "authorization: Bearer <token>" (smg agent --token). mTLS, when used
	// instead, is configured on the grpc.Server.
	Token string
	// Now is the clock evidence is stamped with (nil: time.Now). The
	// control plane's clock is used, never the agent's, so skew between
	// nodes cannot age or rejuvenate evidence.
	Now func() time.Time
	// StreamEnded, when set, hears the workers an ended stream covered, so
	// the poller can take them over at once.
	StreamEnded func(workerIDs []string)
}

// Server implements smgv1.AgentServiceServer.
type Server struct {
	smgv1.UnimplementedAgentServiceServer

	reg    *registry.Registry
	in     *ingest.Ingester
	tr     *liveness.Tracker
	submit func(*smgv1.WorkerSpec) (string, error)
	opts   Options
	log    *slog.Logger

	closeOnce sync.Once
	closing   chan struct{} // closed by Close: every stream says goodbye

	mu    sync.Mutex
	nodes map[string]*agentStream // the latest stream of each node

	ended func(node string) // tests: a stream's end has been applied
}

// New returns an AgentService over the registry. submit registers a worker
// in the background (admin.Service.Submit); it runs for engines an agent
// registers itself (hello.register).
func New(reg *registry.Registry, in *ingest.Ingester, tr *liveness.Tracker,
	submit func(*smgv1.WorkerSpec) (string, error), opts Options, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Server{reg: reg, in: in, tr: tr, submit: submit, opts: opts, log: log,
		closing: make(chan struct{}), nodes: map[string]*agentStream{}}
}

// Close tells every stream, and any that opens later, goodbye (agents
// reconnect at once) and ends them. It does not wait: grpc.Server.GracefulStop
// waits for the handlers.
func (s *Server) Close() {
	s.closeOnce.Do(func() { close(s.closing) })
}

// agentStream is one agent's stream.
type agentStream struct {
	node string
	peer string
	own  []string // engines named in the hello

	mu      sync.Mutex
	covered map[string]bool // engine URLs assigned to or reported by this stream

	// last is the latest record per engine URL, so that a contact or a
	// heartbeat ("nothing changed since my last record") re-applies it.
	// Only the receive goroutine touches it.
	last map[string]lastRecord
}

type lastRecord struct {
	rec judge.Record
	at  time.Time
}

func (st *agentStream) cover(urls ...string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, u := range urls {
		st.covered[u] = true
	}
}

func (st *agentStream) coveredURLs() []string {
	st.mu.Lock()
	defer st.mu.Unlock()
	out := make([]string, 0, len(st.covered))
	for u := range st.covered {
		out = append(out, u)
	}
	slices.Sort(out)
	return out
}

// Report serves one agent's stream.
func (s *Server) Report(stream grpc.BidiStreamingServer[smgv1.ReportRequest, smgv1.ReportResponse]) error {
	ctx := stream.Context()
	if err := s.authorize(ctx); err != nil {
		return err
	}
	first, err := stream.Recv()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil
		}
		return err
	}
	hello := first.GetHello()
	if hello == nil {
		return status.Error(codes.InvalidArgument, "agent: the first message must be a hello")
	}
	if hello.GetNode() == "" {
		return status.Error(codes.InvalidArgument, "agent: the hello must name the agent's node (smg agent --node)")
	}
	st := &agentStream{node: hello.GetNode(), peer: peerOf(ctx), own: dedup(hello.GetEngineUrls()),
		covered: map[string]bool{}, last: map[string]lastRecord{}}
	s.log.Info("Agent connected", "node", st.node, "peer", st.peer, "engines", len(st.own), "register", hello.GetRegister())
	if hello.GetRegister() {
		s.register(st)
	}
	s.addStream(st)

	recvErr := make(chan error, 1) // buffered: the receiver never waits on us
	go s.receive(stream, st, recvErr)

	err = s.serve(ctx, stream, st, recvErr)
	broke := err != nil
	s.endStream(st, broke)
	if broke {
		s.log.Warn("Agent stream broke: its engines record a connection failure", "node", st.node, "peer", st.peer, "error", err)
	} else {
		s.log.Info("Agent disconnected", "node", st.node, "peer", st.peer)
	}
	if s.ended != nil {
		s.ended(st.node)
	}
	return err
}

// serve sends the node's assignment, and again whenever the registry changes
// it, until the agent closes its side, the stream breaks or Close says goodbye.
// It returns nil for a clean end and the error of a broken stream.
func (s *Server) serve(ctx context.Context, stream grpc.ServerStream, st *agentStream, recvErr <-chan error) error {
	a := newAssignment(st.node, st.own)
	var sent []string
	first := true
	for {
		changed := s.reg.MembershipChanged() // before reading, so no change slips between
		urls := a.update(s.reg)
		if first || !slices.Equal(urls, sent) {
			st.cover(urls...)
			if err := stream.SendMsg(&smgv1.ReportResponse{Msg: &smgv1.ReportResponse_Assignment{
				Assignment: &smgv1.Assignment{EngineUrls: urls}}}); err != nil {
				return err
			}
			sent, first = urls, false
		}
		select {
		case <-changed:
		case <-s.closing:
			// Our own goodbye is no failure of the engines.
			_ = stream.SendMsg(&smgv1.ReportResponse{Msg: &smgv1.ReportResponse_Goodbye{
				Goodbye: &smgv1.Goodbye{Reason: "control plane shutting down"}}})
			return nil
		case err := <-recvErr:
			return err
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// receive applies the agent's messages until the stream ends; io.EOF (the
// agent closed its side) ends it cleanly with a nil error.
func (s *Server) receive(stream grpc.BidiStreamingServer[smgv1.ReportRequest, smgv1.ReportResponse], st *agentStream, done chan<- error) {
	for {
		req, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			done <- err
			return
		}
		now := s.opts.Now()
		switch m := req.Msg.(type) {
		case *smgv1.ReportRequest_Record:
			s.record(st, m.Record, now)
		case *smgv1.ReportRequest_Event:
			s.event(st, m.Event, now)
		case *smgv1.ReportRequest_Heartbeat:
			for _, u := range m.Heartbeat.GetWorkerUrls() {
				if w := s.worker(u); w != nil {
					s.vouch(st, w, now)
				}
			}
		case *smgv1.ReportRequest_Hello:
			s.log.Warn("Agent sent a second hello; ignored", "node", st.node)
		}
	}
}

// worker returns the registered worker with url, or nil (logged at debug:
// an agent may poll an engine before its registration completes).
func (s *Server) worker(url string) *registry.Worker {
	w := s.reg.Snapshot().GetByURL(url)
	if w == nil {
		s.log.Debug("Agent reported an engine that is not registered; ignored", "url", url)
	}
	return w
}

func (s *Server) record(st *agentStream, r *smgv1.LoadRecord, now time.Time) {
	url := r.GetWorkerUrl()
	w := s.worker(url)
	if w == nil {
		return
	}
	st.cover(url)
	var silence time.Duration
	if r.GetEngineSilence() != nil {
		silence = max(r.GetEngineSilence().AsDuration(), 0)
	}
	rec := judge.Record{
		Pushed:        true,
		Waiting:       int64(r.GetLoad().GetWaitingRequests()),
		Silence:       silence,
		PrefillInHand: max(r.GetPrefillTokensInHand(), 0),
		StepWire:      r.GetStepWire(),
	}
	st.last[url] = lastRecord{rec: rec, at: now}
	s.setAgentNode(w.ID, st.node)
	// Like the poller, only Ready workers are judged for overload: a worker
	// leaving Ready has its veto cleared and must not get it back from a
	// record while it is out.
	if w.Ready() {
		if err := s.in.Report(w.ID, r.GetLoad()); err != nil {
			s.log.Debug("Agent record not ingested", "worker_id", w.ID, "url", url, "error", err)
		}
	}
	s.tr.Record(w.ID, rec, now)
}

func (s *Server) event(st *agentStream, e *smgv1.EngineEvent, now time.Time) {
	url := e.GetWorkerUrl()
	w := s.worker(url)
	if w == nil {
		return
	}
	st.cover(url)
	switch e.GetKind() {
	case smgv1.EngineEventKind_ENGINE_EVENT_KIND_CONTACT:
		s.vouch(st, w, now)
	case smgv1.EngineEventKind_ENGINE_EVENT_KIND_TRANSPORT_FAILURE:
		delete(st.last, url)
		s.log.Debug("Agent reports a transport failure", "worker_id", w.ID, "url", url, "detail", e.GetDetail())
		s.tr.Failure(w.ID, judge.ConnectionFailure, now)
	case smgv1.EngineEventKind_ENGINE_EVENT_KIND_NO_REPORT:
		delete(st.last, url)
		if err := s.in.NoReport(w.ID); err != nil {
			s.log.Debug("Agent no-report not ingested", "worker_id", w.ID, "url", url, "error", err)
		}
		s.tr.Contact(w.ID, now)
	case smgv1.EngineEventKind_ENGINE_EVENT_KIND_TIMEOUT:
		delete(st.last, url)
		if err := s.in.NoReport(w.ID); err != nil {
			s.log.Debug("Agent timeout not ingested", "worker_id", w.ID, "url", url, "error", err)
		}
	default:
		s.log.Debug("Agent sent an event of unknown kind; ignored", "url", url, "kind", e.GetKind().String())
	}
}

// vouch applies contact that says "the engine answered and nothing changed
// since my last record": the last record is re-applied (its silence aged by
// the time since), which keeps the worker's pushed cadence fresh so the
// poller does not take over from a live agent, and keeps an engine's silence
// growing. Without a record on this stream it is plain contact.
func (s *Server) vouch(st *agentStream, w *registry.Worker, now time.Time) {
	lr, ok := st.last[w.Spec.GetUrl()]
	if !ok {
		s.tr.Contact(w.ID, now)
		return
	}
	rec := lr.rec
	if rec.Silence > 0 && now.After(lr.at) {
		rec.Silence += now.Sub(lr.at)
	}
	s.tr.Record(w.ID, rec, now)
}

// setAgentNode records which node's agent feeds the worker; the registry is
// written only when that changes.
func (s *Server) setAgentNode(id, node string) {
	if w := s.reg.Snapshot().Get(id); w == nil || w.AgentNode == node {
		return
	}
	_, _ = s.reg.Update(func(t *registry.Txn) error {
		w := t.Get(id)
		if w == nil || w.AgentNode == node {
			return nil
		}
		c := w.Clone()
		c.AgentNode = node
		return t.Insert(c)
	})
}

// register submits the hello's engines that are not registered yet, with the
// agent's node in their spec.
func (s *Server) register(st *agentStream) {
	snap := s.reg.Snapshot()
	for _, u := range st.own {
		if snap.GetByURL(u) != nil {
			continue
		}
		id, err := s.submit(&smgv1.WorkerSpec{Url: u, Node: st.node})
		switch {
		case err == nil:
			s.log.Info("Agent registers its engine", "node", st.node, "url", u, "worker_id", id)
		case status.Code(err) == codes.AlreadyExists:
			// A registration of this URL is already under way.
		default:
			s.log.Warn("Agent's engine could not be registered", "node", st.node, "url", u, "error", status.Convert(err).Message())
		}
	}
}

func (s *Server) addStream(st *agentStream) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.nodes[st.node]; old != nil {
		s.log.Info("Agent reconnected before its previous stream ended; the new stream takes over", "node", st.node)
	}
	s.nodes[st.node] = st // a reconnect replaces a stream not seen ending yet
}

// endStream forgets a node's stream. Only the node's latest stream speaks
// for its engines: a replaced stream ending later neither records failures
// nor clears the feeding node.
func (s *Server) endStream(st *agentStream, broke bool) {
	s.mu.Lock()
	current := s.nodes[st.node] == st
	if current {
		delete(s.nodes, st.node)
	}
	s.mu.Unlock()
	if !current {
		return
	}
	now := s.opts.Now()
	var ids []string
	snap := s.reg.Snapshot()
	for _, u := range st.coveredURLs() {
		w := snap.GetByURL(u)
		if w == nil {
			continue
		}
		ids = append(ids, w.ID)
		if broke {
			s.tr.Failure(w.ID, judge.ConnectionFailure, now)
		}
	}
	if s.opts.StreamEnded != nil && len(ids) > 0 {
		s.opts.StreamEnded(ids)
	}
	_, _ = s.reg.Update(func(t *registry.Txn) error {
		for _, id := range ids {
			w := t.Get(id)
			if w == nil || w.AgentNode != st.node {
				continue
			}
			c := w.Clone()
			c.AgentNode = ""
			if err := t.Insert(c); err != nil {
				return err
			}
		}
		return nil
	})
}

// Nodes lists the nodes whose agents are connected, sorted.
func (s *Server) Nodes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.nodes))
	for n := range s.nodes {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// authorize checks the bearer token when one is configured.
func (s *Server) authorize(ctx context.Context) error {
	if s.opts.Token == "" {
		return nil
	}
	switch sent, ok := bearer.Check(ctx, s.opts.Token); {
	case !sent:
		return status.Error(codes.Unauthenticated,
			`agent: missing token: send metadata "authorization: Bearer <token>" (smg agent --token) with the control plane's --agent-token`)
	case !ok:
		return status.Error(codes.Unauthenticated, "agent: invalid token: smg agent --token does not match the control plane's --agent-token")
	}
	return nil
}

func peerOf(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

func dedup(urls []string) []string {
	out := slices.Clone(urls)
	slices.Sort(out)
	return slices.Compact(out)
}
