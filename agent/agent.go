// Package agent is the per-node agent: it polls the engines on its node over
// loopback with the same readers as the control plane's poller (package
// engine) and pushes what it sees to the control plane's AgentService on one
// long-lived stream: a load record when the load changes, contact after every
// other answered poll, a transport failure the moment a poll's connection
// fails, and a heartbeat through quiet spells. On wires that report every
// scheduler step it measures the engine's own silence.
//
// While cut off from the control plane it keeps only the latest record per
// engine; on reconnect it sends a hello, then those records.
//
// It owns the node's polls and its one stream; it decides no verdict and
// keeps no fleet state: judging is the control plane's.
package agent

import (
	"context"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/engine"
	"github.com/smg-project/smg/internal/enginegrpc"
	"github.com/smg-project/smg/internal/loadpb"
	"github.com/smg-project/smg/internal/netfail"
	"github.com/smg-project/smg/internal/podwatch"
	"github.com/smg-project/smg/internal/readbudget"
	"github.com/smg-project/smg/internal/workerurl"
)

// Agent is one node's agent.
type Agent struct {
	opts   Options
	log    *slog.Logger
	m      *metrics
	client *http.Client
	ownCl  bool               // the client is ours to close
	budget *readbudget.Budget // the memory the engine reads hold together

	wake chan struct{} // cap 1: an engine has something to send

	mu      sync.Mutex
	engines map[string]*engineSlot // by URL
	static  map[string]bool        // EngineURLs: never dropped by an assignment
	pollCtx context.Context        // set by Run; pollers stop with it
	wg      sync.WaitGroup         // pollers
	pods    *podSet                // nil without --service-discovery
	podW    *podwatch.Watcher
}

// engineSlot is one engine's latest state to report. Fields after cancel are
// guarded by Agent.mu.
type engineSlot struct {
	url    string
	cancel context.CancelFunc

	last      *smgv1.ReportRequest // latest record or event (failure, no report); nil before the first poll
	dirty     bool                 // last not yet delivered on the current stream
	contact   bool                 // an answered poll with nothing new to record is due
	answering bool                 // the latest poll got an answer
}

// New returns an agent; its metrics register on metrics (nil: none).
func New(opts Options, log *slog.Logger, metrics prometheus.Registerer) (*Agent, error) {
	opts = opts.withDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(metrics)
	if err != nil {
		return nil, err
	}
	budget, err := readbudget.New(int64(opts.EngineReadBudgetMiB)<<20, metrics, log)
	if err != nil {
		return nil, err
	}
	opts.GRPC.MaxRecvMsgSize = opts.GRPCEngineMaxMessageMiB << 20
	if opts.GRPC.Oversized, err = enginegrpc.OversizedCounter(metrics, log, opts.GRPCEngineMaxMessageMiB); err != nil {
		return nil, err
	}
	// The control plane keeps URLs in canonical form: the agent names its
	// engines the same way, so its assignment echoes them back unchanged.
	urls := make([]string, len(opts.EngineURLs))
	for i, u := range opts.EngineURLs {
		urls[i] = u
		if c, err := workerurl.Normalize(u, workerurl.Options{AllowLinkLocal: true}); err == nil {
			urls[i] = c
		}
	}
	opts.EngineURLs = urls
	a := &Agent{opts: opts, log: log, m: m, client: opts.HTTPClient, budget: budget, wake: make(chan struct{}, 1),
		engines: map[string]*engineSlot{}, static: map[string]bool{}}
	if a.client == nil {
		// Engines are on loopback: a few idle connections per engine suffice.
		a.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2, IdleConnTimeout: 90 * time.Second}}
		a.ownCl = true
	}
	for _, u := range opts.EngineURLs {
		a.static[u] = true
	}
	if opts.Discovery.Enabled {
		a.pods = &podSet{a: a, pods: map[string]podwatch.Pod{}}
		if a.podW, err = a.newPodWatcher(); err != nil {
			return nil, err
		}
	}
	m.connected.WithLabelValues(opts.ControlPlane).Set(0)
	return a, nil
}

// Run polls the engines and keeps the stream to the control plane up until
// ctx ends; then it flushes the latest records and closes the stream cleanly.
// It returns an error only when the control plane refuses the agent's token.
func (a *Agent) Run(ctx context.Context) error {
	pollCtx, stopPolls := context.WithCancel(ctx)
	a.mu.Lock()
	a.pollCtx = pollCtx
	for u := range a.static {
		a.startLocked(u)
	}
	a.mu.Unlock()
	if a.podW != nil {
		a.wg.Add(1)
		go func() { defer a.wg.Done(); a.podW.Run(pollCtx) }()
	}
	defer func() {
		stopPolls()
		a.wg.Wait()
		if a.ownCl {
			a.client.CloseIdleConnections()
		}
	}()
	return a.connect(ctx)
}

// assign makes the polled set the static engines plus urls.
func (a *Agent) assign(urls []string) {
	want := map[string]bool{}
	for _, u := range urls {
		want[u] = true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.pollCtx == nil || a.pollCtx.Err() != nil {
		return
	}
	for u := range want {
		if a.engines[u] == nil {
			a.startLocked(u)
			a.log.Info("Engine assigned to this node", "url", u)
		}
	}
	for u, e := range a.engines {
		if !want[u] && !a.static[u] {
			e.cancel()
			delete(a.engines, u)
			a.log.Info("Engine no longer assigned to this node", "url", u)
		}
	}
	a.m.engines.Set(float64(len(a.engines)))
}

// startLocked starts polling u; a.mu is held.
func (a *Agent) startLocked(u string) {
	ctx, cancel := context.WithCancel(a.pollCtx)
	e := &engineSlot{url: u, cancel: cancel}
	a.engines[u] = e
	a.m.engines.Set(float64(len(a.engines)))
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		if enginegrpc.IsGRPC(u) {
			a.pollGRPC(ctx, e)
			return
		}
		a.poll(ctx, e)
	}()
}

// poll reads one engine every PollInterval until ctx ends.
func (a *Agent) poll(ctx context.Context, e *engineSlot) {
	a.pollEvery(ctx, e, &poller{url: e.url, reader: engine.NewReader(a.client, e.url, engine.WithBudget(a.budget))}, nil)
}

// pollEvery runs p every PollInterval until ctx ends, except on ticks where
// skip (nil: never) says the engine's pushed records made the poll
// unnecessary.
func (a *Agent) pollEvery(ctx context.Context, e *engineSlot, p *poller, skip func(now time.Time) bool) {
	tick := time.NewTicker(a.opts.PollInterval)
	defer tick.Stop()
	for {
		if skip == nil || !skip(a.opts.Now()) {
			rep, err := p.reader.Read(ctx)
			if ctx.Err() != nil {
				return
			}
			a.post(e, p.outcome(rep, err, a.opts.Now(), a.m))
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// poller turns one engine's poll results into what to send.
type poller struct {
	url    string
	reader interface {
		Read(context.Context) (engine.Report, error)
	}
	meter silenceMeter
	state pollState // what the control plane was last told about the engine
	prev  summary   // the last record's summary, when state is stateRecord
	// failedSent is when the failure of the current spell was last sent.
	failedSent time.Time
}

// FailureRepeat is how often a failure that persists is sent again: contact
// the control plane hears from elsewhere (a router's answer) clears the
// failure it holds, and the spell's later failures must arm it again within
// the stall bound (2 s by default).
const FailureRepeat = time.Second

type pollState uint8

const (
	stateUnknown pollState = iota // nothing yet, or a timeout: the next answer is news
	stateRecord
	stateNoReport
	stateTimedOut // the last poll timed out: the next answer is news
	stateFailed
)

// outcome is what one poll produced.
type outcome struct {
	msg       *smgv1.ReportRequest // a record or event to deliver; nil: contact only or nothing
	contact   bool                 // answered with nothing new
	answering bool
}

// outcome sends news only: a record when the load changed, an event when the
// engine's state changed; an unchanged answer is contact, and a failure that
// persists is sent again every FailureRepeat (the control plane keeps it
// until contact, which may come from elsewhere meanwhile).
func (p *poller) outcome(rep engine.Report, err error, now time.Time, m *metrics) outcome {
	if err != nil {
		switch {
		case engine.IsTransportFailure(err) || enginegrpc.IsConnectionFailure(err):
			m.polls.WithLabelValues(outcomeTransportFailure).Inc()
			if p.state == stateFailed && now.Sub(p.failedSent) < FailureRepeat {
				return outcome{}
			}
			p.state, p.failedSent = stateFailed, now
			return outcome{msg: eventMsg(p.url, smgv1.EngineEventKind_ENGINE_EVENT_KIND_TRANSPORT_FAILURE, err.Error(), now)}
		case netfail.IsTimeout(err) || enginegrpc.IsTimeout(err):
			// Slow, not gone: no report (the overload veto fails open), but
			// neither contact nor failure.
			m.polls.WithLabelValues(outcomeTimeout).Inc()
			if p.state == stateTimedOut {
				return outcome{}
			}
			p.state = stateTimedOut
			return outcome{msg: eventMsg(p.url, smgv1.EngineEventKind_ENGINE_EVENT_KIND_TIMEOUT, err.Error(), now)}
		default:
			// The engine answered without a usable load: contact, and the
			// overload veto fails open.
			m.polls.WithLabelValues(outcomeNoReport).Inc()
			if p.state == stateNoReport {
				return outcome{contact: true, answering: true}
			}
			p.state = stateNoReport
			return outcome{msg: eventMsg(p.url, smgv1.EngineEventKind_ENGINE_EVENT_KIND_NO_REPORT, err.Error(), now), answering: true}
		}
	}
	m.polls.WithLabelValues(outcomeReport).Inc()
	silence, hasSilence := p.meter.observe(rep, now)
	s := summarize(rep, silence > 0)
	if p.state == stateRecord && s.equal(p.prev) {
		return outcome{contact: true, answering: true}
	}
	p.state, p.prev = stateRecord, s
	rec := &smgv1.LoadRecord{
		WorkerUrl:  p.url,
		Load:       loadpb.FromReport(rep, now),
		StepWire:   rep.StepWire,
		ObservedAt: timestamppb.New(now),
	}
	if hasSilence {
		rec.EngineSilence = durationpb.New(silence)
	}
	return outcome{msg: &smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Record{Record: rec}}, answering: true}
}

func eventMsg(url string, kind smgv1.EngineEventKind, detail string, now time.Time) *smgv1.ReportRequest {
	return &smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Event{Event: &smgv1.EngineEvent{
		WorkerUrl: url, Kind: kind, Detail: detail, ObservedAt: timestamppb.New(now)}}}
}

// post stores a poll's outcome in the engine's slot (latest wins) and wakes
// the sender.
func (a *Agent) post(e *engineSlot, o outcome) {
	a.mu.Lock()
	if a.engines[e.url] != e {
		a.mu.Unlock()
		return // dropped by an assignment while polling
	}
	e.answering = o.answering
	switch {
	case o.msg != nil:
		e.last, e.dirty, e.contact = o.msg, true, false
	case o.contact && !e.dirty:
		e.contact = true
	}
	a.mu.Unlock()
	if o.msg != nil || o.contact {
		a.kick()
	}
}

// pending takes what is due for delivery: every undelivered latest record or
// event, then contacts. all marks every engine's latest state due (a new
// stream: the control plane may have lost it).
func (a *Agent) pending(all bool, now time.Time) []*smgv1.ReportRequest {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []*smgv1.ReportRequest
	if m := a.pods.messageLocked(all); m != nil {
		out = append(out, m) // first: registrations start before records arrive
	}
	for _, u := range slices.Sorted(maps.Keys(a.engines)) {
		e := a.engines[u]
		switch {
		case (e.dirty || all) && e.last != nil:
			out = append(out, aged(e.last, now))
		case e.contact:
			out = append(out, eventMsg(u, smgv1.EngineEventKind_ENGINE_EVENT_KIND_CONTACT, "", now))
		}
		e.dirty, e.contact = false, false
	}
	return out
}

// answering lists the engines whose latest poll got an answer.
func (a *Agent) answering() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for u, e := range a.engines {
		if e.answering {
			out = append(out, u)
		}
	}
	slices.Sort(out)
	return out
}

// aged returns msg as of now: a record's silence grows by the time it waited
// to be sent (a record is sent only when the engine's state changed, so a
// silent engine is still silent).
func aged(msg *smgv1.ReportRequest, now time.Time) *smgv1.ReportRequest {
	rec := msg.GetRecord()
	if rec == nil || rec.GetEngineSilence().AsDuration() <= 0 {
		return msg
	}
	waited := now.Sub(rec.GetObservedAt().AsTime())
	if waited <= 0 {
		return msg
	}
	cp := &smgv1.LoadRecord{WorkerUrl: rec.WorkerUrl, Load: rec.Load, StepWire: rec.StepWire,
		PrefillTokensInHand: rec.PrefillTokensInHand, ObservedAt: rec.ObservedAt,
		EngineSilence: durationpb.New(rec.GetEngineSilence().AsDuration() + waited)}
	return &smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Record{Record: cp}}
}

// Engines lists the engines the agent polls, sorted.
func (a *Agent) Engines() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Sorted(maps.Keys(a.engines))
}
