// Package router is smg's OpenAI-compatible reverse proxy. It routes on a
// local snapshot of the fleet that the control plane pushes (Apply): selection
// reads an atomically swapped immutable view, so the veto check costs no lock,
// no allocation and no I/O per request. The router never judges a worker; it
// reads the verdict (Worker.Veto) and applies the spec's steer / shed rules.
//
// It imports nothing of the control plane: its view of the fleet arrives
// through Apply (router/watchclient), and the window shares it may use are
// granted by the control plane.
package router

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/smg-project/smg/internal/identity"
	"github.com/smg-project/smg/router/admission"
	"github.com/smg-project/smg/router/ttft"
)

// Router proxies requests to the workers of its current snapshot.
type Router struct {
	opts     Options
	keyField string // --dispatch-key-header, canonical: looked up without canonicalising per request
	log      *slog.Logger
	metrics  *metrics
	// reportSeq numbers Observations (Observations.Seq).
	reportSeq atomic.Uint64
	// reportSoon asks for a report before the next tick (ReportSoon).
	reportSoon chan struct{}
	pdm        *pdMetrics
	wm         *windowMetrics      // the wait path of running windows
	handoff    *handoff            // rooms borrowed from and lent to peer routers
	ttm        *ttftMetrics        // TTFT predictions
	om         *objectiveMetrics   // TTFT objectives
	gatherer   prometheus.Gatherer // nil when the Registerer cannot gather
	cb         breakerConfig
	sel        selector
	upstream   *upstream
	grpc       *grpcPath // the upstream of gRPC workers
	// objectives is each class's TTFT objective (0: none; objective.go).
	objectives [admission.NumClasses]time.Duration
	// door is the first admission layer: the priority scheduler (then
	// sched too) or the token bucket, nil when neither is on.
	door  admission.Door
	sched *admission.Scheduler // the priority scheduler, when on and started
	// providers reaches external workers (provider.go).
	providers *providers
	spill     *spiller // --spill-over (spill.go), nil when off
	// schedFromFleet: the scheduler's capacity is the sum of this router's
	// window shares, updated with every snapshot (else --max-concurrent-requests).
	schedFromFleet bool
	// reservedOver: the scheduler's reservations exceed its fleet capacity
	// (warned once each time it turns true). Guarded by applyMu.
	reservedOver bool
	// completions meters answers that ended, for --retry-after-mode estimated.
	completions *completionMeter

	view atomic.Pointer[view]
	// fleet holds the control plane's settings once a snapshot brought them.
	fleet atomic.Pointer[FleetSettings]

	wlMu      sync.Mutex // guards waitlists
	waitlists map[waitlistKey]*admission.Waitlist

	applyMu   sync.Mutex // serialises Apply / FailOpen; guards the fields below
	states    map[string]*workerState
	freeSlots []uint32
	nextSlot  uint32
	fleetCap  fleetCap // the scheduler's capacity from the fleet's windows
	unpaired  string   // the models whose PD workers form no pair, as last logged

	clock func() time.Time // Options.Now
	start time.Time

	// beforeDispatch, when set (tests only), runs between selection and the
	// dispatch-time re-check.
	beforeDispatch func()

	draining atomic.Bool     // Drain: /readyz fails, new requests are refused
	stopped  context.Context // cancelled by Stop (cause errStopped): requests in flight end
	stop     func()          //
	base     context.Context // the servers' base context: stopped, marked as this router's
}

// errStopped is the cause of a context that Stop ended; a request context
// ended by another cause was ended by its client leaving (or its deadline).
var errStopped = errors.New("the router is stopping")

// baseKey marks a context derived from a router's base context: Stop
// reaches its requests with no hook of their own.
type baseKey struct{}

// New builds a Router. Metrics go to reg; if reg is also a prometheus.Gatherer
// (a *prometheus.Registry is), /metrics serves it.
func New(opts Options, log *slog.Logger, reg prometheus.Registerer) (*Router, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("router metrics: %w", err)
	}
	pdm, err := newPDMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("router metrics: %w", err)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	stopped, stop := context.WithCancelCause(context.Background())
	r := &Router{
		pdm:        pdm,
		stopped:    stopped,
		stop:       func() { stop(errStopped) },
		opts:       opts,
		log:        log,
		metrics:    m,
		states:     make(map[string]*workerState),
		clock:      opts.Now,
		reportSoon: make(chan struct{}, 1),

		waitlists: make(map[waitlistKey]*admission.Waitlist),
		cb: breakerConfig{
			disabled:         opts.DisableCircuitBreaker,
			failureThreshold: int32(opts.CBFailureThreshold),
			successThreshold: int32(opts.CBSuccessThreshold),
			timeout:          int64(time.Duration(opts.CBTimeoutDurationSecs) * time.Second),
		},
	}
	r.start = r.clock()
	r.base = context.WithValue(stopped, baseKey{}, r)
	// Registered whatever the flag, so dashboards and alerts find the
	// families (at zero); the per-worker gauges appear only for gated workers.
	if r.wm, err = newWindowMetrics(r, reg); err != nil {
		return nil, fmt.Errorf("router metrics: %w", err)
	}
	peers, err := parsePeers(opts.PeerRouters)
	if err != nil {
		return nil, fmt.Errorf("--peer-routers: %w", err)
	}
	if r.handoff, err = newHandoff(peers, opts, reg); err != nil {
		return nil, fmt.Errorf("router metrics: %w", err)
	}
	if r.ttm, err = newTTFTMetrics(r, reg); err != nil {
		return nil, fmt.Errorf("router metrics: %w", err)
	}
	if opts.WorkerAdmissionWindow || opts.WorkerTokenBudget {
		m.shed.WithLabelValues(StageAdmissionWindow)
		m.overloadFallback.WithLabelValues(StageAdmissionWindow)
		m.livenessFallback.WithLabelValues(StageAdmissionWindow)
	}
	if g, ok := reg.(prometheus.Gatherer); ok {
		r.gatherer = g
	}
	r.sel = selector{
		policy:          opts.Policy,
		cb:              &r.cb,
		cacheThreshold:  opts.CacheThreshold,
		balanceAbs:      opts.BalanceAbsThreshold,
		balanceRel:      opts.BalanceRelThreshold,
		hotTokenUsage:   opts.BalanceTokenUsageThreshold,
		prefixLoadLimit: opts.PrefixHashLoadFactor,
		waitingCap:      opts.LeastLoadWaitingCap,
		prefillFirst:    opts.LeastLoadPrefillFirst,
	}
	switch opts.Policy {
	case PolicyCacheAware:
		r.sel.affinity = newAffinityTable(18)
	case PolicyManual:
		r.sel.sticky = newAffinityTable(18)
	}
	r.completions = newCompletionMeter(completionTau)
	r.keyField = http.CanonicalHeaderKey(opts.DispatchKeyHeader)
	if r.om, err = newObjectiveMetrics(reg); err != nil {
		return nil, fmt.Errorf("router metrics: %w", err)
	}
	r.setObjectives(true) // the flag's, for the door's queue timeout
	r.startDoor(reg)
	r.setObjectives(false) // and the scheduler YAML's
	dialer := &net.Dialer{Timeout: opts.UpstreamDialTimeout, KeepAlive: 30 * time.Second}
	r.upstream = newUpstream(dialer, opts.EngineTLS.DialTLS(dialer), opts.MaxIdleConnsPerWorker, 90*time.Second)
	if r.grpc, err = newGRPCPath(opts); err != nil {
		return nil, fmt.Errorf("--tokenizer-path: %w", err)
	}
	if r.providers, err = newProviders(r, dialer, reg); err != nil {
		return nil, fmt.Errorf("router metrics: %w", err)
	}
	if opts.SpillOver {
		if r.spill, err = newSpiller(r.clock, reg); err != nil {
			return nil, fmt.Errorf("router metrics: %w", err)
		}
	}
	return r, nil
}

// roundTrip sends one upstream request. Redirects are the client's
// business, as with any reverse proxy. Errors read as an http.Client's do
// (`Post "URL": ...`).
func (r *Router) roundTrip(ctx context.Context, out *http.Request) (*http.Response, error) {
	deadline, _ := ctx.Deadline()
	return r.roundTripHooked(ctx, out, deadline, nil)
}

// roundTripHooked is roundTrip bounded by deadline (zero: none) and, with a
// hook, cut by it rather than by ctx.
func (r *Router) roundTripHooked(ctx context.Context, out *http.Request, deadline time.Time, hook cancelHook) (*http.Response, error) {
	resp, err := r.upstream.RoundTrip(ctx, out, deadline, hook)
	if err != nil {
		var tlsErr tls.RecordHeaderError
		if errors.As(err, &tlsErr) && string(tlsErr.RecordHeader[:]) == "HTTP/" {
			err = http.ErrSchemeMismatch // a plain-HTTP engine behind an https:// URL
		}
		return nil, &url.Error{Op: "Post", URL: out.URL.Redacted(), Err: err}
	}
	return resp, nil
}

// now is monotonic nanoseconds since the router started.
func (r *Router) now() int64 { return int64(r.clock().Sub(r.start)) }

// Apply atomically replaces the fleet snapshot. Readiness turns on with the
// first call. The router owns s from now on.
func (r *Router) Apply(s *Snapshot) {
	r.applyMu.Lock()
	defer r.applyMu.Unlock()
	if s.Settings != nil {
		r.fleet.Store(s.Settings)
	}
	r.install(s, s.Workers, false)
	r.metrics.revision.Set(float64(s.Revision))
}

// loadMonitorInterval is the control plane's --load-monitor-interval once a
// snapshot brought it, the router's own flag before that.
func (r *Router) loadMonitorInterval() int {
	if f := r.fleet.Load(); f != nil && f.LoadMonitorIntervalSecs > 0 {
		return f.LoadMonitorIntervalSecs
	}
	return r.opts.LoadMonitorInterval
}

// ApplyDelta applies a change to the snapshot held. A change that leaves
// every index as it was (verdicts, loads, windows: no worker joins, leaves,
// or changes its URL, model or type) is patched into a copy-on-write
// successor of the view in time proportional to the change; any other
// rebuilds the view as Apply does, the workers kept in ID order (a joining
// worker takes its place in that order). After FailOpen the delta applies to
// the workers as sent, so verdicts come back. The router owns d from now on.
func (r *Router) ApplyDelta(d *Delta) {
	r.applyMu.Lock()
	defer r.applyMu.Unlock()
	cur := r.view.Load()
	if cur == nil || cur.failOpen || !r.patch(cur, d) {
		var base []Worker
		if cur != nil {
			base = cur.sent.flat()
		}
		r.install(&Snapshot{Epoch: d.Epoch, Revision: d.Revision}, withDelta(base, d), false)
	}
	r.metrics.revision.Set(float64(d.Revision))
}

// withDelta is base (in ID order) with d applied, still in ID order.
func withDelta(base []Worker, d *Delta) []Worker {
	at := make(map[string]int, len(base))
	for i := range base {
		at[base[i].ID] = i
	}
	gone := make(map[string]bool, len(d.Removed))
	for _, id := range d.Removed {
		gone[id] = true
	}
	var joins []Worker
	for _, w := range d.Upserts {
		switch i, ok := at[w.ID]; {
		case !ok:
			at[w.ID] = len(base) + len(joins)
			joins = append(joins, w)
		case i < len(base):
			base[i] = w
		default:
			joins[i-len(base)] = w
		}
	}
	slices.SortFunc(joins, func(a, b Worker) int { return cmp.Compare(a.ID, b.ID) })
	out := make([]Worker, 0, len(base)+len(joins))
	for i := range base {
		for len(joins) > 0 && joins[0].ID < base[i].ID {
			out, joins = appendUnless(out, joins[0], gone), joins[1:]
		}
		out = appendUnless(out, base[i], gone)
	}
	for i := range joins {
		out = appendUnless(out, joins[i], gone)
	}
	return out
}

func appendUnless(out []Worker, w Worker, gone map[string]bool) []Worker {
	if gone[w.ID] {
		return out
	}
	return append(out, w)
}

// patch publishes cur with d applied when d changes no index of the view,
// copying only the chunks of the workers it changes, and reports whether it
// could. Caller holds applyMu.
func (r *Router) patch(cur *view, d *Delta) bool {
	for _, id := range d.Removed {
		if _, ok := r.states[id]; ok {
			return false
		}
	}
	// The entries to write: an upsert equal to the entry held (a resync
	// snapshot lists every worker) changes nothing.
	type change struct {
		i int32
		w *Worker
	}
	var changes []change
	seen := make(map[int32]bool, len(d.Upserts))
	for k := len(d.Upserts) - 1; k >= 0; k-- { // the last upsert of a worker wins
		w := &d.Upserts[k]
		st, ok := r.states[w.ID]
		if !ok {
			return false
		}
		i := cur.indexOfSlot(st.slot)
		if i < 0 || !sameIndexes(cur.worker(i), w) {
			return false
		}
		if !seen[i] && *cur.worker(i) != *w {
			changes = append(changes, change{i, w})
		}
		seen[i] = true
	}
	next := *cur
	next.epoch, next.revision = d.Epoch, d.Revision
	if len(changes) > 0 {
		workers, hot := newCow(cur.workers), newCow(cur.hot)
		for _, c := range changes {
			workers.set(c.i, *c.w)
			hot.set(c.i, hotOf(c.w, cur.states[c.i]))
		}
		next.workers, next.hot = workers.chunked, hot.chunked
		next.sent = next.workers
	}
	v := &next
	r.view.Store(v)
	for _, c := range changes {
		st := v.states[c.i]
		r.noteLoad(st, c.w)
		r.fleetCap.add(c.w, st.gate.Limit(), st.gate.Window(), -1) // its type is unchanged
		r.setWindow(st, c.w)
		r.fleetCap.add(c.w, st.gate.Limit(), st.gate.Window(), 1)
	}
	r.pokeAll() // a share that grew has room for waiters
	r.setSchedCapacity()
	return true
}

// noteLoad resets the dispatches counted since the last report when w
// brings a new one, and half-opens w's breaker if open: the engine
// answered a poll since. Caller holds applyMu.
func (r *Router) noteLoad(st *workerState, w *Worker) {
	if st.loadRevision != w.LoadRevision {
		st.loadRevision = w.LoadRevision
		st.dispatched.Store(0) // the new report already counts those dispatches
		if st.breaker.evidence(&r.cb, r.now()) {
			r.metrics.breakers.WithLabelValues("half_open").Inc()
			r.log.Info("Circuit breaker half-open: the worker answered the control plane since it opened", "worker_id", w.ID)
		}
	}
}

// setWindow gates st on w's window as this router holds it. Caller holds
// applyMu.
func (r *Router) setWindow(st *workerState, w *Worker) {
	tokens := r.tokenBudget(w)
	st.gate.SetTokens(admission.GateLimit(tokens, w.TokenShare, r.opts.WorkerAdmissionWindowMode == PDWindowPerRouter), tokens)
	if rooms, mode := r.windowRooms(w); rooms > 0 || w.Type == TypeDecode || tokens > 0 {
		st.gate.Set(admission.GateLimit(rooms, w.WindowShare, mode == PDWindowPerRouter), rooms)
		decode := w.Type == TypeDecode
		wls := []*admission.Waitlist{r.waitlistFor(waitlistKey{decode, w.Model}), r.waitlistFor(waitlistKey{decode, ""})}
		st.wls.Store(&wls)
	} else {
		st.gate.Set(admission.Unlimited, 0)
		st.wls.Store(nil)
	}
}

// FailOpen drops every veto of the current snapshot and keeps routing on it:
// the watch client calls it once the control plane has been lost for longer
// than --worker-stale-secs. The next Apply brings verdicts back.
func (r *Router) FailOpen() {
	r.applyMu.Lock()
	defer r.applyMu.Unlock()
	cur := r.view.Load()
	if cur == nil || cur.failOpen {
		return
	}
	workers := cur.sent.flat()
	dropped := 0
	for i := range workers {
		if workers[i].Veto != VetoNone {
			dropped++
		}
		workers[i].Veto, workers[i].VetoReason = VetoNone, ""
		workers[i].Overloaded, workers[i].OverloadReason = false, ""
	}
	r.install(&Snapshot{Epoch: cur.epoch, Revision: cur.revision}, workers, true)
	r.metrics.failOpen.Inc()
	r.log.Warn("Control plane lost past the stale bound: dropped its vetoes, routing on the last snapshot",
		"revision", cur.revision, "vetoes_dropped", dropped)
}

// install compiles and publishes a view. Caller holds applyMu.
func (r *Router) install(s *Snapshot, workers []Worker, failOpen bool) {
	prev := r.view.Load()
	states := make([]*workerState, 0, len(workers))
	seen := make(map[string]bool, len(workers))
	kept := workers[:0:0]
	for i := range workers {
		w := &workers[i]
		if seen[w.ID] {
			r.log.Warn("Snapshot lists a worker twice; keeping the first entry", "worker_id", w.ID)
			continue
		}
		seen[w.ID] = true
		st, ok := r.states[w.ID]
		if !ok {
			st = &workerState{id: w.ID, rank: packRank(w.ID), slot: r.allocSlot(), loadRevision: w.LoadRevision, ttft: ttft.New(r.clock)}
			r.states[w.ID] = st
		}
		r.noteLoad(st, w)
		states = append(states, st)
		kept = append(kept, *w)
	}
	if len(kept) == len(workers) {
		kept = workers // no duplicates: no copy
	}
	for id, st := range r.states {
		if !seen[id] {
			delete(r.states, id)
			r.freeSlots = append(r.freeSlots, st.slot)
		}
	}
	v := buildView(s, kept, states, prev, r.nextSlot, r.opts.SpillOver)
	v.failOpen = failOpen
	if failOpen {
		v.sent = prev.sent // the verdicts the next delta applies to
	}
	for model, p := range v.pools {
		p.wl = r.waitlistFor(waitlistKey{false, model})
	}
	v.all.wl = r.waitlistFor(waitlistKey{false, ""})
	for model, pp := range v.pd {
		pp.decode.wl = r.waitlistFor(waitlistKey{true, model})
	}
	if v.pdAll != nil {
		v.pdAll.decode.wl = r.waitlistFor(waitlistKey{true, ""})
	}
	r.view.Store(v)
	if u := v.unpaired(); u != r.unpaired {
		r.unpaired = u
		if u != "" {
			r.log.Warn("Prefill/decode workers form no pair: both legs of a pair must speak one protocol (HTTP or gRPC)",
				"models", u)
		}
	}
	r.grpc.retain(kept)
	r.fleetCap = fleetCap{spillApart: r.opts.SpillOver}
	for i := range kept {
		r.setWindow(states[i], &kept[i])
		r.fleetCap.add(&kept[i], states[i].gate.Limit(), states[i].gate.Window(), 1)
	}
	r.pokeAll() // a share that grew, or a new worker, has room for waiters
	r.setSchedCapacity()
}

func (r *Router) allocSlot() uint32 {
	if n := len(r.freeSlots); n > 0 {
		slot := r.freeSlots[n-1]
		r.freeSlots = r.freeSlots[:n-1]
		return slot
	}
	r.nextSlot++
	return r.nextSlot - 1
}

// Ready reports whether a snapshot is held.
func (r *Router) Ready() bool { return r.view.Load() != nil }

// ContactSeen tells the router the control plane heard from the worker: its
// circuit breaker closes at once, so re-admission is not held up by the
// breaker's timeout.
func (r *Router) ContactSeen(workerID string) {
	v := r.view.Load()
	if v == nil {
		return
	}
	r.applyMu.Lock()
	st, ok := r.states[workerID]
	r.applyMu.Unlock()
	if !ok {
		return
	}
	if st.breaker.state.Load() != breakerClosed {
		st.breaker.reset()
		r.metrics.breakers.WithLabelValues("closed").Inc()
		r.log.Info("Circuit breaker closed by control plane contact", "worker_id", workerID)
	}
}

// Observations is what the router reports back to the control plane: what
// only it can see about the workers it sends to.
type Observations struct {
	// Seq numbers the call, from 1 up: the control plane acknowledges each
	// report it folds into its sums, and the router subtracts its own part
	// of a sum ahead by the report the sum holds.
	Seq     uint64
	Workers []WorkerObservation
	// Demand is this router's use of each gated worker's window: the
	// control plane moves window shares toward the routers that wait.
	Demand []WindowDemand
	// Tenants is each active tenant's use of the scheduler's slots (fair
	// shares on): the control plane relays the other routers' to each.
	Tenants []admission.TenantDemand
}

// WorkerObservation is one worker's share of Observations.
type WorkerObservation struct {
	WorkerID string
	// StreamsInFlight is this router's streaming requests in flight on the
	// worker (the pile).
	StreamsInFlight int64
	// LastProgress is when the last chunk or completion arrived from the
	// worker; zero if never.
	LastProgress time.Time
	// PromptTokensInFlight estimates the prompt tokens of this router's
	// requests in flight on the worker (body bytes / 4).
	PromptTokensInFlight int64
	// ConnectionFailures counts connection-level upstream failures (refused,
	// reset, EOF) since the previous call; deadlines and 5xx are not counted.
	ConnectionFailures uint64
	// Contact: an answer arrived from the worker since the previous call.
	Contact bool
	// LastContact is when the latest answer arrived; zero if never.
	LastContact time.Time
	// PrefillTokensPerSec is the prefill rate measured from prompt tokens
	// over the time to the first byte (0: not measured yet).
	PrefillTokensPerSec float64
}

// Observations returns per-worker observations for the current snapshot and
// resets the connection failure counts.
func (r *Router) Observations() Observations {
	v := r.view.Load()
	if v == nil {
		return Observations{}
	}
	out := Observations{Seq: r.reportSeq.Add(1), Workers: make([]WorkerObservation, len(v.states))}
	for i, st := range v.states {
		o := WorkerObservation{
			WorkerID:             st.id,
			StreamsInFlight:      st.streams.Load(),
			PromptTokensInFlight: st.promptTokens.Load(),
			ConnectionFailures:   st.connFailures.Swap(0),
			Contact:              st.contacts.Swap(0) > 0,
			PrefillTokensPerSec:  math.Float64frombits(st.prefillRate.Load()),
		}
		if ns := st.lastProgress.Load(); ns != 0 {
			o.LastProgress = time.Unix(0, ns)
		}
		if ns := st.lastContact.Load(); o.Contact && ns != 0 {
			o.LastContact = time.Unix(0, ns)
		}
		st.reported.record(out.Seq, o.PromptTokensInFlight)
		out.Workers[i] = o
	}
	out.Demand = r.windowDemand(v)
	if r.sched != nil {
		out.Tenants = r.sched.Tenants()
	}
	return out
}

// Handler serves every route: the OpenAI-compatible API, /generate,
// /v1/models, /health, /readyz, /metrics and /loads.
func (r *Router) Handler() http.Handler {
	mux := http.NewServeMux()
	proxied := make(map[string]http.Handler, len(proxiedRoutes))
	for path, route := range proxiedRoutes {
		proxied[path] = r.proxyHandler(route)
		mux.Handle("POST "+path, proxied[path])
	}
	mux.HandleFunc("GET /v1/models", r.serveModels)
	mux.HandleFunc("GET /loads", r.serveLoads)
	mux.HandleFunc("POST "+LendPath, r.serveLend)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"ok"}`))
	})
	mux.HandleFunc("GET /readyz", r.serveReadyz)
	mux.Handle("GET /metrics", r.metricsHandler())
	mux.Handle("GET "+identity.Path, identity.Handler(identity.Router))
	mux.HandleFunc("/", func(w http.ResponseWriter, req *http.Request) {
		if allow, ok := routeMethods[req.URL.Path]; ok {
			w.Header().Set("Allow", allow)
			writeError(w, http.StatusMethodNotAllowed, CodeMethodNotAllowed,
				req.Method+" is not allowed on "+req.URL.Path+"; use "+allow, 0)
			return
		}
		writeError(w, http.StatusNotFound, CodeNotFound, "No route for "+req.Method+" "+req.URL.Path, 0)
	})
	// The proxied routes skip the mux's matching (its allocations), as
	// the mux would route them: POST on the exact path.
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if Proxied(req) {
			proxied[req.URL.Path].ServeHTTP(w, req)
			return
		}
		mux.ServeHTTP(w, req)
	})
}

// Proxied reports whether req is for one of the proxied routes (POST on
// the exact path), which a mux in front of Handler may hand over without
// its matching.
func Proxied(req *http.Request) bool {
	if req.Method != http.MethodPost || req.URL.RawPath != "" {
		return false
	}
	_, ok := proxiedRoutes[req.URL.Path]
	return ok
}

// proxiedRoutes are the routes proxied to the workers, by path.
var proxiedRoutes = map[string]int{
	"/v1/chat/completions": routeChat, "/v1/completions": routeCompletions,
	"/v1/embeddings": routeEmbeddings, "/generate": routeGenerate,
}

// routeMethods is the Allow header of each route, for the 405 of a wrong
// method (the catch-all route would otherwise answer 404).
var routeMethods = map[string]string{
	"/v1/chat/completions": "POST", "/v1/completions": "POST", "/v1/embeddings": "POST", "/generate": "POST",
	"/v1/models": "GET, HEAD", "/loads": "GET, HEAD", "/health": "GET, HEAD", "/readyz": "GET, HEAD",
	"/metrics": "GET, HEAD", identity.Path: "GET, HEAD", LendPath: "POST",
}

func (r *Router) serveReadyz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if r.draining.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"ready":false,"reason":"draining: the router is shutting down"}`))
		return
	}
	if !r.Ready() {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"ready":false,"reason":"no fleet snapshot from the control plane yet"}`))
		return
	}
	_, _ = w.Write([]byte(`{"ready":true}`))
}

// reqCtx is a proxied request's context: bounded by --request-timeout-secs
// and ended at Stop. Its context with a timer is made only for what waits
// on it (a room, a retry's backoff, gRPC, PD, providers, preemption): a
// plain engine's answer behind the lean server is bounded by its
// connection's deadline and cut by the server's hook instead.
type reqCtx struct {
	r        *Router
	parent   context.Context // the server's: ends when the client leaves
	deadline time.Time
	ctx      context.Context // nil until get
	cancel   context.CancelFunc
}

func (r *Router) newReqCtx(parent context.Context) *reqCtx {
	return &reqCtx{r: r, parent: parent, deadline: time.Now().Add(time.Duration(r.opts.RequestTimeoutSecs) * time.Second)}
}

// get is the request's context, made at the first call.
func (c *reqCtx) get() context.Context {
	if c.ctx == nil {
		c.ctx, c.cancel = c.r.requestContext(c.parent, c.deadline)
	}
	return c.ctx
}

// hook is the lean server's cancel hook when it alone can cut the
// request: no context made (get not called), Stop reaching the server's
// context (Listener hooked the server); nil otherwise.
func (c *reqCtx) hook(w http.ResponseWriter) cancelHook {
	if c.ctx != nil || c.parent.Value(baseKey{}) != c.r {
		return nil
	}
	h, _ := w.(cancelHook)
	return h
}

func (c *reqCtx) end() {
	if c.cancel != nil {
		c.cancel()
	}
}

// cancelHook is the lean server's ResponseWriter: f runs once when the
// request's context is cancelled (the client left, or Stop through the base
// context), as with context.AfterFunc, without a context per request.
type cancelHook interface {
	OnCancel(f func())
	StopOnCancel() bool
}

// requestContext bounds one proxied request by its deadline and ends it at
// Stop: through the server's base context when the request came through a
// server hooked by Listener, else by a hook of its own.
func (r *Router) requestContext(parent context.Context, deadline time.Time) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithDeadline(parent, deadline)
	if parent.Value(baseKey{}) == r {
		return ctx, cancel
	}
	unhook := context.AfterFunc(r.stopped, cancel)
	return ctx, func() { unhook(); cancel() }
}

// clientLeft reports whether in's client left (or its context ended for
// any reason but Stop, which ends it through the base context too).
func clientLeft(in *http.Request) bool {
	ctx := in.Context()
	return ctx.Err() != nil && context.Cause(ctx) != errStopped
}

// Drain starts a graceful shutdown: /readyz fails so load balancers move
// on, and new requests are refused with 503 router_shutting_down, while
// requests in flight go on.
func (r *Router) Drain() { r.draining.Store(true) }

// Stop ends the requests still in flight (after the shutdown grace): each
// gets an explicit router_shutting_down error, streams as an error event.
func (r *Router) Stop() { r.stop() }

// stopping reports whether Stop ended the request.
func (r *Router) stopping() bool { return r.stopped.Err() != nil }
