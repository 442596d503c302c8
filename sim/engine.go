package sim

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Errors a request can end with.
var (
	errBootstrapTimeout = errors.New("bootstrap timeout: no decode engine admitted the bootstrap room in time")
	errEngineStopped    = errors.New("engine stopped")
	errRoomInUse        = errors.New("bootstrap room already in use")
)

type reqState int

const (
	stateWaiting  reqState = iota // in the FIFO queue
	statePrefill                  // admitted; prompt being computed
	stateTransfer                 // decode role: admitted; waiting for the prefill engine's KV
	stateDecode                   // one token per step
	stateHolding                  // prefill role: prompt done; KV held until a decode engine admits the room
	stateDone
)

// request is one generation inside the model. Fields above the line belong to
// the scheduler (guarded by rank.mu); the handler reads only the atomics, the
// finish fields after done is set, and notify.
type request struct {
	promptTokens int
	maxTokens    int
	seed         uint64 // seeds the words the handler writes
	ctx          context.Context
	pd           *pdInfo
	rank         *rank
	stream       bool     // streaming: counts toward the engine-silence figure
	ids          []uint32 // prompt token ids, when the request carried them (KV block hashes)
	blocks       []int64  // KV blocks announced as stored (gRPC KV events)

	state    reqState
	need     int // tokens to compute before decoding: prompt, plus output on recompute
	computed int
	kv       int       // KV tokens this request holds
	deadline time.Time // prefill role: bootstrap deadline
	room     *room     // prefill role
	ready    bool      // decode role: the prefill engine's KV arrived

	generated atomic.Int64
	done      atomic.Bool
	cancelled atomic.Bool
	finish    string // "length" or "stop"; valid once done
	err       error  // valid once done
	notify    chan struct{}
}

// pdInfo carries SGLang's disaggregation fields.
type pdInfo struct {
	host    string
	port    int
	hasPort bool // bootstrap_port was given (not null)
	room    uint64
}

// cancel frees the request at the scheduler's next look (client went away).
func (r *request) cancel() {
	if r.done.Load() || r.cancelled.Swap(true) {
		return
	}
	r.rank.cancels.Add(1)
	r.rank.signal()
}

func (r *request) wake() {
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

// bootstrapper asks the prefill engine at host:port to hand over room's KV;
// it returns once the transfer is done or has failed.
type bootstrapper func(ctx context.Context, host string, port int, room uint64) error

// modelConfig is the part of Options the scheduler reads.
type modelConfig struct {
	role             string
	window           int
	capacity         int
	prefillRate      float64
	itl              time.Duration
	itlGrowth        float64
	maxBatched       int
	eosProb          float64
	bootstrapTimeout time.Duration
	publishEvery     int
	kvEvents         bool // log KV block events for SubscribeKvEvents (gRPC on)
	stepWire         bool // the silence figure is of scheduler steps, not of tokens
}

func configFrom(o Options) modelConfig {
	return modelConfig{
		role: o.Role, window: o.MaxRunningRequests, capacity: o.KVCapacityTokens,
		prefillRate: o.PrefillTokensPerSec, itl: o.ITL, itlGrowth: o.ITLGrowth,
		maxBatched: o.MaxBatchedTokens, eosProb: o.EOSProbability,
		bootstrapTimeout: o.BootstrapTimeout, publishEvery: o.SGLangMetricsInterval,
		kvEvents: o.GRPC, stepWire: o.Flavor == FlavorVLLM,
	}
}

// engine is one simulated engine: DP ranks, each with its own scheduler
// goroutine, plus the bootstrap rooms of a prefill engine.
type engine struct {
	cfg       modelConfig
	ranks     []*rank
	rooms     roomTable
	bootstrap bootstrapper
	ids       atomic.Uint64
	kvLog     *kvLog
	stop      chan struct{}
	stopOnce  sync.Once
	wg        sync.WaitGroup
}

func newEngine(cfg modelConfig, dp int, seed uint64, bs bootstrapper) *engine {
	e := &engine{cfg: cfg, bootstrap: bs, stop: make(chan struct{}), rooms: roomTable{m: map[uint64]*room{}},
		kvLog: newKVLog(dp)}
	for i := range dp {
		e.ranks = append(e.ranks, &rank{
			id: i, eng: e, slow: 1,
			rng:      rand.New(rand.NewPCG(seed, uint64(i))),
			wake:     make(chan struct{}, 1),
			finished: map[string]uint64{},
			buckets:  make([]uint64, len(iterationBuckets)),
			thrAt:    time.Now(),
		})
	}
	return e
}

func (e *engine) start() {
	for _, r := range e.ranks {
		e.wg.Add(1)
		go r.loop()
	}
}

// close stops the schedulers and fails everything still in flight, so that
// every handler waiting on a request returns.
func (e *engine) close() {
	e.stopOnce.Do(func() {
		close(e.stop)
		e.wg.Wait()
		for _, r := range e.ranks {
			r.mu.Lock()
			for _, q := range [][]*request{r.waiting, r.running, r.holding} {
				for _, req := range q {
					r.end(req, "", errEngineStopped)
				}
			}
			r.waiting, r.running, r.holding = nil, nil, nil
			r.mu.Unlock()
		}
		e.rooms.failAll(errEngineStopped)
	})
}

func (e *engine) setFault(f Fault) {
	for _, r := range e.ranks {
		r.mu.Lock()
		r.frozen = f.Freeze
		r.slow = f.slowFactor()
		r.mu.Unlock()
		r.signal()
	}
}

// submitSpec is what a request asks of the engine.
type submitSpec struct {
	promptTokens int
	maxTokens    int
	dpRank       int // -1: the engine picks the least-loaded rank
	pd           *pdInfo
	stream       bool
	ids          []uint32
}

// errTooLong is returned for a request that could never fit the KV cache.
var errTooLong = errors.New("prompt plus max_tokens exceeds the KV cache capacity")

func (e *engine) submit(ctx context.Context, s submitSpec) (*request, error) {
	if s.promptTokens+s.maxTokens+1 > e.cfg.capacity {
		return nil, errTooLong
	}
	select {
	case <-e.stop:
		return nil, errEngineStopped
	default:
	}
	r := e.pickRank(s.dpRank)
	req := &request{
		promptTokens: s.promptTokens, maxTokens: s.maxTokens, need: s.promptTokens,
		ctx: ctx, pd: s.pd, rank: r, notify: make(chan struct{}, 1), stream: s.stream, ids: s.ids,
	}
	if e.cfg.role == RolePrefill {
		rm, err := e.rooms.attach(s.pd.room, req)
		if err != nil {
			return nil, err
		}
		req.room = rm
		req.deadline = time.Now().Add(e.cfg.bootstrapTimeout)
	}
	r.mu.Lock()
	r.accountIdle(time.Now())
	req.seed = r.rng.Uint64()
	r.waiting = append(r.waiting, req)
	if req.stream {
		r.hold(time.Now())
	}
	r.mu.Unlock()
	r.signal()
	return req, nil
}

func (e *engine) pickRank(want int) *rank {
	if want >= 0 && want < len(e.ranks) {
		return e.ranks[want]
	}
	best, bestLoad := e.ranks[0], -1
	for _, r := range e.ranks {
		r.mu.Lock()
		load := len(r.waiting) + len(r.running)
		r.mu.Unlock()
		if bestLoad < 0 || load < bestLoad {
			best, bestLoad = r, load
		}
	}
	return best
}

// Bootstrap is the prefill side of a KV handover: a decode engine has admitted
// room; wait until its prefill finished and the KV is handed over.
func (e *engine) Bootstrap(ctx context.Context, id uint64) error {
	rm := e.rooms.admit(id)
	t := time.NewTimer(e.cfg.bootstrapTimeout)
	defer t.Stop()
	select {
	case <-rm.done:
		return rm.err
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		e.rooms.forget(rm)
		return errBootstrapTimeout
	case <-e.stop:
		return errEngineStopped
	}
}

// room pairs a prefill request with the decode engine that admits it; either
// side may arrive first.
type room struct {
	id       uint64
	admitted atomic.Bool
	req      *request
	done     chan struct{}
	err      error
	closed   bool
}

type roomTable struct {
	mu sync.Mutex
	m  map[uint64]*room
}

func (t *roomTable) get(id uint64) *room {
	rm := t.m[id]
	if rm == nil {
		rm = &room{id: id, done: make(chan struct{})}
		t.m[id] = rm
	}
	return rm
}

func (t *roomTable) attach(id uint64, req *request) (*room, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	rm := t.get(id)
	if rm.req != nil {
		return nil, errRoomInUse
	}
	rm.req = req
	return rm, nil
}

func (t *roomTable) admit(id uint64) *room {
	t.mu.Lock()
	rm := t.get(id)
	rm.admitted.Store(true)
	req := rm.req
	t.mu.Unlock()
	if req != nil {
		req.rank.signal()
	}
	return rm
}

// settle ends a room with the prefill request's outcome.
func (t *roomTable) settle(rm *room, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if rm.closed {
		return
	}
	rm.closed, rm.err = true, err
	close(rm.done)
	if t.m[rm.id] == rm {
		delete(t.m, rm.id)
	}
}

func (t *roomTable) forget(rm *room) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m[rm.id] == rm && rm.req == nil {
		delete(t.m, rm.id)
	}
}

func (t *roomTable) failAll(err error) {
	t.mu.Lock()
	rooms := make([]*room, 0, len(t.m))
	for _, rm := range t.m {
		rooms = append(rooms, rm)
	}
	t.mu.Unlock()
	for _, rm := range rooms {
		t.settle(rm, err)
	}
}

// iterationBuckets are vLLM's buckets for vllm:iteration_tokens_total.
var iterationBuckets = []float64{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384}

// rank is one DP rank: a FIFO queue, a running window and a KV cache, stepped
// by one goroutine.
type rank struct {
	id      int
	eng     *engine
	wake    chan struct{}
	cancels atomic.Int64 // cancellations not yet swept

	mu      sync.Mutex
	waiting []*request
	running []*request
	holding []*request
	kvUsed  int
	frozen  bool
	slow    float64
	rng     *rand.Rand

	// Counters, as the engines export them.
	steps, promptTokens, genTokens, preemptions uint64
	finished                                    map[string]uint64
	buckets                                     []uint64 // per bucket, not cumulative
	iterSum                                     float64
	decodeSteps                                 uint64
	published                                   rankLoad // SGLang's lagging gauges
	thr                                         float64
	thrAt                                       time.Time
	thrTokens                                   uint64
	// High-water marks of the queue and the running batch after each
	// scheduling pass (GET /sim/stats), for benchmarks and tests that check
	// what a router let through.
	peakWaiting, peakRunning int
	// Free rooms of the running window integrated over time (room-seconds,
	// since start): all of them, and those while a request waited in the
	// queue (for the next scheduling pass, or KV). What benchmarks read to
	// tell a room idle because nothing was sent from one idle at the engine.
	idleRooms, idleRoomsQueued float64
	idleAt                     time.Time

	// The engine-silence figure: streaming requests held, and when the rank
	// last produced for them (a token, or a step on a step wire).
	streamHeld int
	lastOut    time.Time
}

func (r *rank) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

type chunk struct {
	req *request
	n   int
}

type stepPlan struct {
	decode   []*request
	prefill  []chunk
	tokens   int
	duration time.Duration
}

func (r *rank) loop() {
	defer r.eng.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var plan stepPlan
	var lastEnd time.Time
	for {
		r.mu.Lock()
		var next time.Time
		ok := false
		if !r.frozen {
			now := time.Now()
			r.accountIdle(now)
			next = r.sweep(now)
			r.eng.kvLog.flush(r.id, now) // blocks freed by cancellations and deadlines
			ok = r.plan(&plan)
		}
		if !ok && !r.frozen {
			r.published = r.liveLoad() // an idle engine's gauges settle
		}
		r.mu.Unlock()
		if !ok {
			var deadline <-chan time.Time
			if !next.IsZero() {
				timer.Reset(time.Until(next))
				deadline = timer.C
			}
			select {
			case <-r.wake:
			case <-deadline:
			case <-r.eng.stop:
				return
			}
			timer.Stop()
			continue
		}
		// Back-to-back steps keep their cadence: a step starts when the last
		// one ended, not when this goroutine got the CPU back.
		start := time.Now()
		if gap := start.Sub(lastEnd); gap >= 0 && gap < plan.duration {
			start = lastEnd
		}
		lastEnd = start.Add(plan.duration)
		timer.Reset(time.Until(lastEnd))
		select {
		case <-timer.C:
		case <-r.eng.stop:
			return
		}
		r.mu.Lock()
		if !r.frozen { // a freeze mid-step discards the step
			r.apply(&plan, time.Now())
		}
		r.mu.Unlock()
	}
}

// sweep drops cancelled requests, fails expired bootstrap deadlines and hands
// over KV whose room a decode engine admitted. It returns the next deadline.
func (r *rank) sweep(now time.Time) (next time.Time) {
	pd := r.eng.cfg.role == RolePrefill
	if r.cancels.Swap(0) == 0 && !pd {
		return time.Time{}
	}
	keep := func(q []*request) []*request {
		out := q[:0]
		for _, req := range q {
			switch {
			case req.cancelled.Load():
				r.finished["abort"]++
				r.end(req, "", context.Canceled)
			case pd && req.state == stateHolding && req.room.admitted.Load():
				r.end(req, "length", nil)
			case pd && !req.room.admitted.Load() && !now.Before(req.deadline):
				r.finished["abort"]++
				r.end(req, "", errBootstrapTimeout)
			default:
				if pd && !req.room.admitted.Load() && (next.IsZero() || req.deadline.Before(next)) {
					next = req.deadline
				}
				out = append(out, req)
			}
		}
		clear(q[len(out):])
		return out
	}
	r.waiting, r.running, r.holding = keep(r.waiting), keep(r.running), keep(r.holding)
	return next
}

// end finishes req (err == nil) or fails it, freeing its KV.
func (r *rank) end(req *request, finish string, err error) {
	if req.state == stateDone {
		return
	}
	r.kvUsed -= req.kv
	req.kv = 0
	r.dropBlocks(req)
	if req.stream {
		r.streamHeld--
	}
	req.state = stateDone
	req.finish, req.err = finish, err
	if err == nil {
		r.finished[finish]++
	}
	if req.room != nil {
		r.eng.rooms.settle(req.room, err)
	}
	req.done.Store(true)
	req.wake()
}

// plan picks what the next step computes: one token for every decoding
// request (preempting the newest when the KV cache cannot take them), then
// FIFO admission into the window, then prefill chunks within the step budget.
func (r *rank) plan(p *stepPlan) bool {
	cfg := &r.eng.cfg
	clear(p.decode)
	clear(p.prefill)
	p.decode, p.prefill, p.tokens = p.decode[:0], p.prefill[:0], 0
	for {
		decoding := 0
		for _, req := range r.running {
			if req.state == stateDecode {
				decoding++
			}
		}
		if r.kvUsed+decoding <= cfg.capacity || len(r.running) <= 1 || !r.preemptNewest() {
			break
		}
	}
	for len(r.waiting) > 0 && len(r.running) < cfg.window {
		head := r.waiting[0]
		if r.kvUsed+head.need+1 > cfg.capacity {
			break // FCFS: the head blocks the queue until KV frees
		}
		r.waiting[0] = nil
		r.waiting = r.waiting[1:]
		head.kv = head.need + 1 // the prompt plus the slot of its first token
		r.kvUsed += head.kv
		head.computed = 0
		head.state = statePrefill
		if cfg.role == RoleDecode && !head.ready {
			head.state = stateTransfer
			go r.fetchKV(head)
		}
		r.running = append(r.running, head)
	}
	r.peakWaiting = max(r.peakWaiting, len(r.waiting))
	r.peakRunning = max(r.peakRunning, len(r.running))
	budget := cfg.maxBatched
	for _, req := range r.running {
		if req.state == stateDecode {
			p.decode = append(p.decode, req)
		}
	}
	budget -= len(p.decode)
	prefillTokens := 0
	for _, req := range r.running {
		if req.state != statePrefill || budget <= 0 {
			continue
		}
		n := min(req.need-req.computed, budget)
		budget -= n
		prefillTokens += n
		p.prefill = append(p.prefill, chunk{req, n})
	}
	if len(p.decode) == 0 && len(p.prefill) == 0 {
		return false
	}
	p.tokens = len(p.decode) + prefillTokens
	var d float64
	if len(p.decode) > 0 {
		d = float64(cfg.itl) * (1 + cfg.itlGrowth*float64(len(r.running)-1))
	}
	d += float64(prefillTokens) / cfg.prefillRate * float64(time.Second)
	p.duration = max(time.Duration(d*r.slow), time.Microsecond)
	return true
}

// preemptNewest evicts the newest running request back to the head of the
// queue, as vLLM's recompute preemption does: its KV is freed and later
// recomputed (prompt plus output so far). A request still waiting for a KV
// handover is never the victim: its handover is already under way.
func (r *rank) preemptNewest() bool {
	for i := len(r.running) - 1; i >= 0; i-- {
		req := r.running[i]
		if req.state == stateTransfer {
			continue
		}
		r.running = removeReq(r.running, req)
		r.kvUsed -= req.kv
		r.dropBlocks(req)
		req.kv, req.computed = 0, 0
		req.need = req.promptTokens + int(req.generated.Load())
		req.ready = true // a decode engine recomputes locally what it already received
		req.state = stateWaiting
		r.waiting = append([]*request{req}, r.waiting...)
		r.preemptions++
		return true
	}
	return false
}

// fetchKV runs the decode side of a handover for one admitted request.
func (r *rank) fetchKV(req *request) {
	err := r.eng.bootstrap(req.ctx, req.pd.host, req.pd.port, req.pd.room)
	r.mu.Lock()
	r.accountIdle(time.Now())
	if req.state == stateTransfer {
		if err != nil {
			r.finished["abort"]++
			r.end(req, "", err)
			r.running = removeReq(r.running, req)
		} else {
			req.ready = true
			req.state = stateDecode
			r.promptTokens += uint64(req.promptTokens)
		}
	}
	r.mu.Unlock()
	r.signal()
}

func removeReq(q []*request, req *request) []*request {
	for i, x := range q {
		if x == req {
			copy(q[i:], q[i+1:])
			q[len(q)-1] = nil
			return q[:len(q)-1]
		}
	}
	return q
}

// apply lands a finished step: tokens, prefill progress, completions, counters.
func (r *rank) apply(p *stepPlan, now time.Time) {
	cfg := &r.eng.cfg
	r.accountIdle(now)
	genBefore := r.genTokens
	for _, req := range p.decode {
		if req.state != stateDecode {
			continue // cancelled or preempted meanwhile
		}
		req.kv++
		r.kvUsed++
		r.emit(req)
	}
	prefilled := 0
	for _, c := range p.prefill {
		req := c.req
		if req.state != statePrefill {
			continue
		}
		req.computed += c.n
		prefilled += c.n
		if req.computed < req.need {
			continue
		}
		if req.generated.Load() == 0 {
			r.promptTokens += uint64(req.promptTokens)
		}
		r.storeBlocks(req)
		if cfg.role == RolePrefill {
			// The first token comes out of prefill; the KV stays until handover.
			req.generated.Store(1)
			r.genTokens++
			req.state = stateHolding
			r.holding = append(r.holding, req)
			req.wake()
			if req.room.admitted.Load() {
				r.end(req, "length", nil)
			}
			continue
		}
		req.state = stateDecode
		r.emit(req)
	}
	{
		out := r.running[:0]
		for _, req := range r.running {
			if req.state == statePrefill || req.state == stateTransfer || req.state == stateDecode {
				out = append(out, req)
			}
		}
		clear(r.running[len(out):])
		r.running = out
		if cfg.role == RolePrefill {
			out := r.holding[:0]
			for _, req := range r.holding {
				if req.state == stateHolding {
					out = append(out, req)
				}
			}
			clear(r.holding[len(out):])
			r.holding = out
		}
	}
	r.steps++
	if cfg.stepWire || r.genTokens != genBefore {
		r.lastOut = now
	}
	r.eng.kvLog.flush(r.id, now)
	r.iterSum += float64(p.tokens)
	for i, ub := range iterationBuckets {
		if float64(p.tokens) <= ub {
			r.buckets[i]++
			break
		}
	}
	if prefilled == 0 {
		r.decodeSteps++
	}
	if prefilled > 0 || r.decodeSteps%uint64(cfg.publishEvery) == 0 {
		r.published = r.liveLoad()
	}
	if el := now.Sub(r.thrAt); el >= time.Second {
		r.thr = float64(r.genTokens-r.thrTokens) / el.Seconds()
		r.thrAt, r.thrTokens = now, r.genTokens
	}
}

// emit hands one token to req and ends it at its length or an early stop.
func (r *rank) emit(req *request) {
	n := req.generated.Add(1)
	r.genTokens++
	switch {
	case int(n) >= req.maxTokens:
		r.end(req, "length", nil)
	case r.eng.cfg.eosProb > 0 && r.rng.Float64() < r.eng.cfg.eosProb:
		r.end(req, "stop", nil)
	default:
		req.wake()
	}
}

// rankLoad is one rank's load, as the engines report it.
type rankLoad struct {
	Waiting, Running, KVUsed, Capacity, Window int
}

func (l rankLoad) usage() float64 { return float64(l.KVUsed) / float64(l.Capacity) }

func (r *rank) liveLoad() rankLoad {
	return rankLoad{Waiting: len(r.waiting), Running: len(r.running), KVUsed: r.kvUsed,
		Capacity: r.eng.cfg.capacity, Window: r.eng.cfg.window}
}

// rankStats is a consistent copy of one rank's gauges and counters.
type rankStats struct {
	rankLoad
	Published                               rankLoad
	Steps, PromptTokens, GenTokens, Preempt uint64
	Finished                                map[string]uint64
	Buckets                                 []uint64 // cumulative
	IterSum                                 float64
	Throughput                              float64
	IdleRooms, IdleRoomsQueued              float64 // room-seconds since start
}

func (r *rank) stats(now time.Time) rankStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.accountIdle(now)
	s := rankStats{rankLoad: r.liveLoad(), Published: r.published, Steps: r.steps,
		PromptTokens: r.promptTokens, GenTokens: r.genTokens, Preempt: r.preemptions,
		IdleRooms: r.idleRooms, IdleRoomsQueued: r.idleRoomsQueued,
		Finished: make(map[string]uint64, len(r.finished)), Buckets: make([]uint64, len(r.buckets)),
		IterSum: r.iterSum, Throughput: r.thr}
	for k, v := range r.finished {
		s.Finished[k] = v
	}
	var cum uint64
	for i, n := range r.buckets {
		cum += n
		s.Buckets[i] = cum
	}
	if el := now.Sub(r.thrAt); el > 2*time.Second { // idle: let the figure decay
		s.Throughput = float64(r.genTokens-r.thrTokens) / el.Seconds()
	}
	if s.Published.Capacity == 0 {
		s.Published = rankLoad{Capacity: r.eng.cfg.capacity, Window: r.eng.cfg.window}
	}
	return s
}

// accountIdle integrates the free rooms up to now; r.mu is held, and every
// change to the queue or the running batch calls it first.
func (r *rank) accountIdle(now time.Time) {
	if !r.idleAt.IsZero() {
		if dt := now.Sub(r.idleAt).Seconds(); dt > 0 {
			free := max(0, r.eng.cfg.window-len(r.running))
			r.idleRooms += float64(free) * dt
			r.idleRoomsQueued += float64(min(free, len(r.waiting))) * dt
		}
	}
	if now.After(r.idleAt) {
		r.idleAt = now
	}
}

// peaks returns the rank's high-water marks, resetting them when reset.
func (r *rank) peaks(reset bool) (waiting, running int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	waiting, running = r.peakWaiting, r.peakRunning
	if reset {
		r.peakWaiting, r.peakRunning = len(r.waiting), len(r.running)
	}
	return waiting, running
}
