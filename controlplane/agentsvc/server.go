// Package agentsvc serves AgentService: the stream on which per-node agents
// push what they observe of their engines (load records, contact, transport
// failures, the engine's own silence) and receive the engines assigned to
// their node.
//
// Pushed records feed the evidence inbox as the poller's reads do, their
// liveness side as pushed evidence, so agent-covered workers are judged by
// silence (the spec's "When a Worker Goes Silent Entirely"). The stream is
// one of the covered engines' channels: when it breaks, each records a
// connection failure.
//
// It owns the agents' streams (identity, assignment, wire decoding); it
// hands what it decodes to the evidence inbox and writes to the registry
// only which node's agent feeds a worker, never a verdict.
package agentsvc

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/smg-project/smg/controlplane/evidence"
	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/loadpb"
	"github.com/smg-project/smg/internal/podwatch"
	"github.com/smg-project/smg/internal/workerurl"
)

// Options configure a Server.
type Options struct {
	// Auth turns a stream's tokens into its identity (zero: every stream is
	// accepted), under its client certificate's (CertAuth); an identity
	// naming a node binds the stream to it.
	Auth TokenAuth
	// Registration says what an agent may register (hello.register).
	Registration RegistrationPolicy
	// Remove deletes a worker (admin.Service.Remove): workers an agent
	// registered go when their node's agent is gone for good.
	Remove func(workerID string) error
	// GoneAfter is how long a node may be without a stream before the
	// workers its agent registered are removed (0: never).
	GoneAfter time.Duration
	// AfterFunc schedules that removal (nil: time.AfterFunc); tests inject it.
	AfterFunc func(d time.Duration, f func()) (stop func() bool)
	// Now is the clock evidence is stamped with (nil: time.Now). The
	// control plane's clock is used, never the agent's, so skew between
	// nodes cannot age or rejuvenate evidence.
	Now func() time.Time
	// StreamEnded, when set, hears the workers an ended stream covered, so
	// the poller can take them over at once.
	StreamEnded func(workerIDs []string)
	// CoverageChanged, when set, hears that Covers may answer differently,
	// so the load monitor hands gRPC workers' KV event streams over at once.
	CoverageChanged func()
	// Discovery, when set, registers the engine pods agents discover on
	// their nodes.
	Discovery DiscoverySink
	// Applying, when set, runs after a message is read and before it is
	// applied: tests and the scale harness block in it to hold a stream
	// unread, as a control plane starved of CPU does.
	Applying func()
	// Applied, when set, runs when the receive loop is done with a message
	// (tests: the stream is read up to it).
	Applied func()
	// Refused, when set, hears every engine authorize refuses (tests).
	Refused func(node, url string, err error)
}

// DiscoverySink takes the complete set of pods one source (an agent's node)
// sees (discovery.Reconciler).
type DiscoverySink interface {
	ReplaceSource(source string, pods []podwatch.Pod)
}

// Server implements smgv1.AgentServiceServer.
type Server struct {
	smgv1.UnimplementedAgentServiceServer

	reg    *registry.Registry
	ev     *evidence.Inbox
	submit func(*smgv1.WorkerSpec) (string, error)
	opts   Options
	log    *slog.Logger

	closeOnce sync.Once
	closing   chan struct{} // closed by Close: every stream says goodbye

	mu       sync.Mutex
	nodes    map[string]*agentStream // the latest stream of each node
	gone     map[string]func() bool  // node → stops its pending removal
	covering map[string]int          // by engine URL: the latest streams assigned it (Covers)

	ended func(node string) // tests: a stream's end has been applied
}

// New returns an AgentService over the registry, feeding ev. submit
// registers the engines agents register themselves (admin.Service.Submit).
func New(reg *registry.Registry, ev *evidence.Inbox,
	submit func(*smgv1.WorkerSpec) (string, error), opts Options, log *slog.Logger) *Server {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.AfterFunc == nil {
		opts.AfterFunc = func(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }
	}
	return &Server{reg: reg, ev: ev, submit: submit, opts: opts, log: log,
		closing: make(chan struct{}), nodes: map[string]*agentStream{}, gone: map[string]func() bool{}, covering: map[string]int{}}
}

// Close tells every stream, and any that opens later, goodbye (agents
// reconnect at once); grpc.Server.GracefulStop waits for the handlers.
func (s *Server) Close() {
	s.closeOnce.Do(func() { close(s.closing) })
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, stop := range s.gone {
		stop()
	}
	clear(s.gone)
}

type agentStream struct {
	ctx  context.Context // the stream's: ends with it
	node string
	peer string
	own  []string // engines named in the hello

	// read is how far the control plane has read the stream (the agent's
	// silence or our lag); heard is the message being applied.
	read  *evidence.Stream
	heard judge.Heard

	hosts *hostSet // where this node's engines may be
	pods  podsSlot // discovered pods waiting for authorize

	mu      sync.Mutex
	covered map[string]bool // engine URLs assigned to or reported by this stream
	refused map[string]bool // engine URLs whose refusal was logged

	assigned []string // the latest assignment sent (guarded by the Server's mu)

	// The rest is the receive goroutine's alone.

	engines map[string]*engineState // by canonical URL
	// known maps the URLs the agent sends, as spelled, to their worker on
	// this node while its spec is the one found: a record costs one map
	// lookup, not normalising its URL.
	known map[string]knownWorker
	// pending is the latest record of each hello engine not registered yet
	// when it came: the first contact after its registration applies it
	// (the agent sends a record only when something changed).
	pending map[string]*smgv1.LoadRecord
	dec     recordsDecoder
	scratch wireRecord // a record proto.Unmarshal decoded
}

type knownWorker struct {
	h      *registry.Handle
	spec   *smgv1.WorkerSpec
	engine *engineState // of spec's URL: a record reaches it without another lookup
}

// engineState is what a stream keeps of one engine.
type engineState struct {
	reported bool       // covered already: a record takes no lock to cover it
	last     lastRecord // the latest record, re-applied by a contact ("nothing changed")
	hasLast  bool
	slot     *evidence.Slot // its worker's, kept while the inbox keeps it
}

// maxKnown bounds a stream's known URLs: an agent may spell URLs any
// number of ways.
const maxKnown = 16384

type lastRecord struct {
	rec judge.Record
	at  time.Time
	// unjudged is the load of a record while the worker was not Ready: the
	// first contact after it turns Ready ingests it (an idle engine's load
	// may never change again, so never be sent again).
	unjudged *smgv1.EngineLoad
	// confirmed is when a contact last moved the worker's load revision
	// (evidence.Inbox.Refresh), at most once per refreshEvery.
	confirmed time.Time
}

// refreshEvery bounds how often a contact moves a worker's load revision:
// routers see loads on a --watch-load-interval grid (1 s by default).
const refreshEvery = time.Second

func (st *agentStream) cover(urls ...string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, u := range urls {
		st.covered[u] = true
	}
}

// coverReported covers e's engine, url, reported by the agent.
func (st *agentStream) coverReported(e *engineState, url string) {
	if e.reported {
		return
	}
	e.reported = true
	st.cover(url)
}

// Report serves one agent's stream.
func (s *Server) Report(stream grpc.BidiStreamingServer[smgv1.ReportRequest, smgv1.ReportResponse]) error {
	ctx := stream.Context()
	id, err := CertAuth{Next: s.opts.Auth}.Authenticate(ctx)
	if err != nil {
		s.log.Warn("Agent refused", "peer", peerOf(ctx), "err", err)
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
	if id.Node != "" && hello.GetNode() != id.Node {
		s.log.Warn("Agent refused: its credentials are bound to another node", "credentials_node", id.Node, "hello_node", hello.GetNode(), "peer", peerOf(ctx))
		return status.Errorf(codes.PermissionDenied, "agent: these credentials (token or client certificate) are for node %q, not %q (smg agent --node)", id.Node, hello.GetNode())
	}
	st := &agentStream{ctx: ctx, node: hello.GetNode(), peer: peerOf(ctx), own: canonicalSet(hello.GetEngineUrls()),
		hosts: newHostSet(id, ctx), refused: map[string]bool{}, covered: map[string]bool{},
		engines: map[string]*engineState{}, known: map[string]knownWorker{}, pending: map[string]*smgv1.LoadRecord{},
		read: s.ev.OpenStream()}
	s.log.Info("Agent connected", "node", st.node, "peer", st.peer, "engines", len(st.own), "register", hello.GetRegister())
	s.addStream(st)
	if hello.GetRegister() {
		s.register(ctx, st)
	}

	recvErr := make(chan error, 1) // buffered: the receiver never waits on us
	go s.receive(stream, st, recvErr)

	err = s.serve(ctx, stream, st, recvErr)
	s.endStream(st, err != nil)
	if err != nil {
		s.log.Warn("Agent stream broke: its engines record a connection failure", "node", st.node, "peer", st.peer, "error", err)
	} else {
		s.log.Info("Agent disconnected", "node", st.node, "peer", st.peer)
	}
	if s.ended != nil {
		s.ended(st.node)
	}
	return err
}

// serve sends the node's assignment, and again whenever it changes, until
// the stream ends; it returns nil for a clean end, else the stream's error.
func (s *Server) serve(ctx context.Context, stream grpc.ServerStream, st *agentStream, recvErr <-chan error) error {
	a := &assignment{node: st.node, own: st.own, byID: map[string]string{}}
	var sent []string
	first := true
	for {
		changed := s.reg.MembershipChanged() // before reading, so no change slips between
		urls := a.update(s.reg)
		if first || !slices.Equal(urls, sent) {
			st.cover(urls...)
			if err := stream.SendMsg(&smgv1.ReportResponse{Msg: &smgv1.ReportResponse_Assignment{
				Assignment: &smgv1.Assignment{EngineUrls: urls, AcceptsRecords: true}}}); err != nil {
				return err
			}
			sent, first = urls, false
			s.setAssigned(st, urls)
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
	raw := &rawRequest{}
	for {
		err := stream.RecvMsg(raw)
		if err == nil {
			err = s.handle(st, raw.buf, s.opts.Now())
			raw.release()
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			done <- err
			return
		}
	}
}

// handle applies one message, b its wire bytes: records by the stream's
// own decoder, anything else by proto.Unmarshal (whose error a malformed
// message gets, as from gRPC's codec).
func (s *Server) handle(st *agentStream, b []byte, now time.Time) error {
	recs, sentAt, ok := st.dec.decode(b)
	var req *smgv1.ReportRequest
	if !ok {
		req = &smgv1.ReportRequest{}
		if err := proto.Unmarshal(b, req); err != nil {
			return status.Errorf(codes.Internal, "grpc: failed to unmarshal the received message: %v", err)
		}
		if ts := req.GetSentAt(); ts != nil {
			sentAt = ts.AsTime()
		}
	}
	st.heard = st.read.Read(now, sentAt)
	if s.opts.Applying != nil {
		s.opts.Applying()
	}
	defer func() {
		st.read.Applied()
		if s.opts.Applied != nil {
			s.opts.Applied()
		}
	}()
	if ok {
		for _, r := range recs { // bounded by the message size limit
			s.record(st, r, now)
		}
		return nil
	}
	switch m := req.Msg.(type) {
	case *smgv1.ReportRequest_Record:
		st.scratch.setProto(m.Record)
		s.record(st, &st.scratch, now)
	case *smgv1.ReportRequest_Records:
		for _, r := range m.Records.GetRecords() { // bounded by the message size limit
			st.scratch.setProto(r)
			s.record(st, &st.scratch, now)
		}
	case *smgv1.ReportRequest_Event:
		s.event(st, m.Event, now)
	case *smgv1.ReportRequest_Heartbeat:
		for _, u := range m.Heartbeat.GetWorkerUrls() {
			if w, _ := s.workerEngine(st, u); w != nil {
				s.vouch(st, w, now)
			}
		}
	case *smgv1.ReportRequest_Pods:
		s.pods(st, m.Pods)
	case *smgv1.ReportRequest_Hello:
		s.log.Warn("Agent sent a second hello; ignored", "node", st.node)
	}
	return nil
}

// workerEngine returns the registered worker with url if it is on the
// stream's node, with the state of its engine, or nil (another node's
// worker is refused: authorize logs it once per stream).
func (s *Server) workerEngine(st *agentStream, url string) (*registry.Worker, *engineState) {
	if k, ok := st.known[url]; ok {
		if w := k.h.Get(); w != nil && w.Spec == k.spec {
			return w, k.engine
		}
		delete(st.known, url)
	}
	w := s.reg.Snapshot().GetByURL(canonicalURL(url))
	if w == nil {
		s.log.Debug("Agent reported an engine that is not registered; ignored", "url", url)
		return nil, nil
	}
	if _, err := s.authorize(st.ctx, st, describe, w.Spec); err != nil {
		return nil, nil
	}
	if len(st.known) >= maxKnown {
		clear(st.known)
	}
	e := st.engines[w.Spec.GetUrl()]
	if e == nil {
		e = &engineState{}
		st.engines[w.Spec.GetUrl()] = e
	}
	if h := s.reg.Handle(w.ID); h != nil {
		st.known[url] = knownWorker{h: h, spec: w.Spec, engine: e}
	}
	return w, e
}

// record takes in one record; r is the stream's, reused by the next
// message (the inbox copies its load).
func (s *Server) record(st *agentStream, r *wireRecord, now time.Time) {
	w, e := s.recordWorker(st, r.url)
	if w == nil {
		// Kept even if the registration landed since the lookup (an idle
		// engine sends no other record): the next contact applies it.
		if u := canonicalURL(string(r.url)); slices.Contains(st.own, u) {
			st.pending[u] = r.own() // bounded by the hello's engines
		}
		return
	}
	url := w.Spec.GetUrl()
	delete(st.pending, url)
	st.coverReported(e, url)
	loadpb.Clamp(r.load) // as the poller's reads are: the agent's numbers are its own
	rec := judge.Record{
		Pushed:        true,
		Waiting:       int64(r.load.GetWaitingRequests()),
		Silence:       max(r.silence.AsDuration(), 0), // nil: 0
		PrefillInHand: max(r.prefill, 0),
		StepWire:      r.stepWire,
		Idle:          runsNothing(r.load),
		Heard:         st.heard,
	}
	last := lastRecord{rec: rec, at: now}
	if w.AgentNode != st.node { // the registry is written only when it changes
		if err := s.storeAgentNode([]string{w.ID}, st.node, func(cur string) bool { return cur != st.node }); err != nil {
			s.log.Error("Agent node not stored", "worker_id", w.ID, "node", st.node, "error", err)
		}
	}
	// Only Ready workers are judged for overload, as by the poller: one out
	// of Ready must not get its cleared veto back from a record.
	o := evidence.Observed{WorkerID: w.ID, Rec: rec}
	if w.Ready() {
		if cur, kept := e.slot.Worker(); cur != w || !kept {
			e.slot = s.ev.Slot(w.ID)
		}
		o.Load, o.Slot = r.load, e.slot
	} else if r.load != nil {
		last.unjudged = proto.CloneOf(r.load)
	}
	e.last, e.hasLast = last, true
	if err := s.ev.Observe(&o, now); err != nil {
		s.log.Debug("Agent record not ingested", "worker_id", w.ID, "error", err)
	}
}

// recordWorker is workerEngine for a record's URL, not copied when the
// stream knows it.
func (s *Server) recordWorker(st *agentStream, url []byte) (*registry.Worker, *engineState) {
	if k, ok := st.known[string(url)]; ok {
		if w := k.h.Get(); w != nil && w.Spec == k.spec {
			return w, k.engine
		}
	}
	return s.workerEngine(st, string(url))
}

// runsNothing reports whether a load shows ranks and none of them runs a
// request (an empty load says nothing).
func runsNothing(l *smgv1.EngineLoad) bool {
	for _, r := range l.GetRanks() {
		if r.GetRunningRequests() > 0 {
			return false
		}
	}
	return len(l.GetRanks()) > 0
}

func (s *Server) event(st *agentStream, e *smgv1.EngineEvent, now time.Time) {
	w, eng := s.workerEngine(st, e.GetWorkerUrl())
	if w == nil {
		return
	}
	url := w.Spec.GetUrl()
	st.coverReported(eng, url)
	switch e.GetKind() {
	case smgv1.EngineEventKind_ENGINE_EVENT_KIND_CONTACT:
		s.vouch(st, w, now)
	case smgv1.EngineEventKind_ENGINE_EVENT_KIND_TRANSPORT_FAILURE:
		eng.hasLast = false
		s.log.Debug("Agent reports a transport failure", "worker_id", w.ID, "url", url, "detail", e.GetDetail())
		s.ev.Failure(w.ID, judge.ConnectionFailure, now)
	case smgv1.EngineEventKind_ENGINE_EVENT_KIND_NO_REPORT, smgv1.EngineEventKind_ENGINE_EVENT_KIND_TIMEOUT:
		eng.hasLast = false
		if err := s.ev.NoReport(w.ID); err != nil {
			s.log.Debug("Agent no-report not ingested", "worker_id", w.ID, "url", url, "kind", e.GetKind().String(), "error", err)
		}
		if e.GetKind() == smgv1.EngineEventKind_ENGINE_EVENT_KIND_NO_REPORT { // a timeout is no contact
			s.ev.Heard(w.ID, st.heard, now)
		}
	default:
		s.log.Debug("Agent sent an event of unknown kind; ignored", "url", url, "kind", e.GetKind().String())
	}
}

// vouch applies contact ("the engine answered, nothing changed"): the last
// record is re-applied, its silence aged by the time since, so the poller
// does not take over from a live agent; without a record it is plain contact.
func (s *Server) vouch(st *agentStream, w *registry.Worker, now time.Time) {
	if r, ok := st.pending[w.Spec.GetUrl()]; ok {
		st.scratch.setProto(r)
		s.record(st, &st.scratch, now) // registered since its record arrived
		return
	}
	e := st.engines[w.Spec.GetUrl()]
	if e == nil || !e.hasLast {
		s.ev.Heard(w.ID, st.heard, now)
		return
	}
	lr := &e.last
	switch {
	case lr.unjudged != nil && w.Ready():
		if err := s.ev.Report(w.ID, lr.unjudged); err != nil { // the inbox's now
			s.log.Debug("Agent record not ingested", "worker_id", w.ID, "url", w.Spec.GetUrl(), "error", err)
		}
		lr.unjudged = nil
		lr.confirmed = now
	case w.Ready() && now.Sub(lr.at) >= refreshEvery && now.Sub(lr.confirmed) >= refreshEvery:
		// The engine answered with the load stored: a new report of it.
		if err := s.ev.Refresh(w.ID); err != nil {
			s.log.Debug("Agent contact not ingested", "worker_id", w.ID, "error", err)
		}
		lr.confirmed = now
	}
	rec := lr.rec
	rec.Heard = st.heard
	if rec.Silence > 0 && now.After(lr.at) {
		rec.Silence += now.Sub(lr.at)
	}
	s.ev.Record(w.ID, rec, now)
}

// storeAgentNode sets the AgentNode (which node's agent feeds it) of the
// workers ids whose stored one passes replace.
func (s *Server) storeAgentNode(ids []string, node string, replace func(cur string) bool) error {
	_, err := s.reg.Update(func(t *registry.Txn) error {
		for _, id := range ids {
			if w := t.Get(id); w != nil && replace(w.AgentNode) {
				c := w.Clone()
				c.AgentNode = node
				t.Insert(c)
			}
		}
		return nil
	})
	return err
}

func (s *Server) current(st *agentStream) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nodes[st.node] == st
}

func (s *Server) addStream(st *agentStream) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.nodes[st.node]; old != nil {
		s.log.Info("Agent reconnected before its previous stream ended; the new stream takes over", "node", st.node)
		s.countAssigned(old.assigned, -1) // the new stream's assignment counts instead
	}
	s.nodes[st.node] = st // a reconnect replaces a stream not seen ending yet
	if stop := s.gone[st.node]; stop != nil {
		stop() // back in time: its workers stay
		delete(s.gone, st.node)
	}
}

// endStream forgets a node's stream. Only the node's latest stream speaks
// for its engines: a replaced stream ending later neither records failures
// nor clears the feeding node.
func (s *Server) endStream(st *agentStream, broke bool) {
	s.ev.CloseStream(st.read) // its engines' silence is the control plane's clock's again
	s.mu.Lock()
	current := s.nodes[st.node] == st
	if current {
		delete(s.nodes, st.node)
		s.countAssigned(st.assigned, -1)
		s.scheduleGone(st.node)
	}
	s.mu.Unlock()
	if !current {
		return
	}
	s.coverageChanged()
	now := s.opts.Now()
	var ids []string
	snap := s.reg.Snapshot()
	st.mu.Lock()
	covered := slices.Sorted(maps.Keys(st.covered))
	st.mu.Unlock()
	for _, u := range covered {
		w := snap.GetByURL(u)
		if w == nil {
			continue
		}
		if _, err := s.authorize(context.Background(), st, describe, w.Spec); err != nil {
			continue // another node's worker is not this stream's to fail
		}
		ids = append(ids, w.ID)
		if broke {
			s.ev.Failure(w.ID, judge.ConnectionFailure, now)
		}
	}
	if s.opts.StreamEnded != nil && len(ids) > 0 {
		s.opts.StreamEnded(ids)
	}
	if err := s.storeAgentNode(ids, "", func(cur string) bool { return cur == st.node }); err != nil {
		s.log.Error("Agent node not cleared", "node", st.node, "error", err)
	}
}

// setAssigned records the assignment just sent on st; it counts for Covers
// while st is its node's latest stream.
func (s *Server) setAssigned(st *agentStream, urls []string) {
	s.mu.Lock()
	current := s.nodes[st.node] == st
	if current {
		s.countAssigned(st.assigned, -1)
		s.countAssigned(urls, 1)
	}
	st.assigned = urls
	s.mu.Unlock()
	if current {
		s.coverageChanged()
	}
}

// countAssigned adds d to the count of each URL; s.mu is held.
func (s *Server) countAssigned(urls []string, d int) {
	for _, u := range urls {
		if n := s.covering[u] + d; n > 0 {
			s.covering[u] = n
		} else {
			delete(s.covering, u)
		}
	}
}

func (s *Server) coverageChanged() {
	if s.opts.CoverageChanged != nil {
		s.opts.CoverageChanged()
	}
}

// Covers reports whether a connected agent is assigned the engine url
// (canonical): that agent polls it and streams its KV events, not the monitor.
func (s *Server) Covers(url string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.covering[url] > 0
}

func peerOf(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

// canonicalURL is url in the registry's canonical form ("http://h:8000/"
// finds "http://h:8000"), or url unchanged if it has none.
func canonicalURL(url string) string {
	if c, err := workerurl.Normalize(url, workerurl.Options{AllowLinkLocal: true}); err == nil {
		return c
	}
	return url
}

// canonicalSet is urls in canonical form, sorted, each once.
func canonicalSet(urls []string) []string {
	out := make([]string, len(urls))
	for i, u := range urls {
		out[i] = canonicalURL(u)
	}
	slices.Sort(out)
	return slices.Compact(out)
}
