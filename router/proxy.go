package router

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/smg-project/smg/internal/enginegrpc"
	"github.com/smg-project/smg/internal/identity"
	"github.com/smg-project/smg/internal/netfail"
	"github.com/smg-project/smg/router/admission"
)

// statusClientClosed is recorded (never sent) when the client left first.
const statusClientClosed = 499

// rawRef is a json.RawMessage that aliases the request body instead of
// copying it: the body outlives every use within the request.
type rawRef []byte

func (r *rawRef) UnmarshalJSON(b []byte) error { *r = b; return nil }

// requestFields are the few body fields the router reads. parseFields still
// validates the whole body, which gives bad JSON its clear 400.
type requestFields struct {
	Model    string `json:"model"`
	Stream   bool   `json:"stream"`
	Messages rawRef `json:"messages"`  // chat
	Prompt   rawRef `json:"prompt"`    // completions
	Input    rawRef `json:"input"`     // embeddings
	Text     rawRef `json:"text"`      // /generate
	InputIDs rawRef `json:"input_ids"` // /generate
	N        int64  `json:"n"`         // choices per prompt: PD decode rooms
	// Output bounds, read only under --worker-token-budget (raw: a value
	// the router cannot read is the engine's to refuse).
	MaxTokens           rawRef `json:"max_tokens"`
	MaxCompletionTokens rawRef `json:"max_completion_tokens"`
	SamplingParams      rawRef `json:"sampling_params"` // /generate: max_new_tokens
}

// prompt is the raw JSON the hash and affinity policies key on.
func (f *requestFields) prompt() []byte {
	for _, p := range [...]rawRef{f.Messages, f.Prompt, f.Input, f.Text, f.InputIDs} {
		if len(p) > 0 && string(p) != "null" {
			return p
		}
	}
	return nil
}

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (r *Router) proxyHandler(route int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		began := time.Now()
		status := statusClientClosed
		defer func() {
			r.metrics.requests[route][statusClass(status)].Inc()
			r.metrics.duration[route].Observe(time.Since(began).Seconds())
		}()
		status = r.serveProxy(w, req)
	})
}

// readRequest reads and parses the body into f. On failure it has answered
// and returns nil with the status sent.
func (r *Router) readRequest(w http.ResponseWriter, req *http.Request, f *requestFields) ([]byte, int) {
	body, err := r.readBody(w, req)
	if err != nil {
		var tooLarge *http.MaxBytesError
		switch {
		case errors.As(err, &tooLarge):
			writeError(w, http.StatusRequestEntityTooLarge, CodePayloadTooLarge,
				"Request body exceeds the limit of "+strconv.FormatInt(r.opts.MaxPayloadSize, 10)+" bytes", 0)
			return nil, http.StatusRequestEntityTooLarge
		case errors.Is(err, errBodyTimeout):
			r.metrics.refused.WithLabelValues(refusedBodyTimeout).Inc()
			w.Header().Set("Connection", "close")
			writeError(w, http.StatusRequestTimeout, CodeBodyTimeout,
				"The request body did not arrive within "+strconv.Itoa(r.opts.BodyReadTimeoutSecs)+" s", 0)
			return nil, http.StatusRequestTimeout
		}
		return nil, statusClientClosed
	}
	if err := parseFields(body, f); err != nil {
		writeError(w, http.StatusBadRequest, CodeInvalidJSON, "Invalid JSON body: "+err.Error(), 0)
		return nil, http.StatusBadRequest
	}
	if !isObject(body) {
		writeError(w, http.StatusBadRequest, CodeInvalidJSON, "The request body must be a JSON object", 0)
		return nil, http.StatusBadRequest
	}
	return body, 0
}

// serveProxy admits, parses, selects, dispatches (with retries) and streams
// the answer back. It returns the status sent, for metrics.
func (r *Router) serveProxy(w http.ResponseWriter, req *http.Request) int {
	arrived := r.now() // a TTFT objective counts from here
	if _, looped := req.Header[hopHeader]; looped {
		r.metrics.refused.WithLabelValues(refusedLoop).Inc()
		writeError(w, http.StatusLoopDetected, CodeLoopDetected,
			"The request has already passed through an smg router: a worker URL points at a router (routing loop)", 0)
		return http.StatusLoopDetected
	}
	if r.draining.Load() {
		writeError(w, http.StatusServiceUnavailable, CodeShuttingDown, "The router is shutting down; retry on another router", 1)
		return http.StatusServiceUnavailable
	}
	// Under the scheduler with fleet capacity the door admits by model, so
	// the body is read first; otherwise a refusal at the door reads none.
	var body []byte
	var f requestFields
	byModel := r.sched != nil && r.schedFromFleet
	if byModel {
		var status int
		if body, status = r.readRequest(w, req, &f); body == nil {
			return status
		}
	}
	var ticket *admission.Ticket
	var lent *loan // a peer's room the door borrowed (pooled headroom)
	defer func() {
		if lent != nil {
			lent.release()
		}
	}()
	if r.door != nil {
		var borrow func(admission.Class, string) bool
		if byModel && r.gating() && len(r.handoff.peers) > 0 {
			borrow = func(class admission.Class, tenant string) bool {
				need, tokens := r.roomClaim(&f)
				lent = r.handoff.borrowFor(req.Context(), f.Model, need, tokens, tenant, class)
				return lent != nil
			}
		}
		var status int
		var ok bool
		if ticket, status, ok = r.admit(w, req, f.Model, borrow); !ok {
			return status
		}
		defer r.door.Release(ticket)
	}
	if !byModel {
		var status int
		if body, status = r.readRequest(w, req, &f); body == nil {
			return status
		}
	}

	rc := r.newReqCtx(req.Context())
	defer rc.end()
	roomWait := time.Duration(r.opts.WorkerAdmissionWaitSecs * float64(time.Second))
	if ticket != nil {
		var stop context.CancelFunc
		rc.ctx, stop = watchPreemption(rc.get(), ticket)
		defer stop()
		// Under the scheduler a request that still finds no room in its
		// pool waits by its class's rules.
		roomWait = r.sched.Config().Classes[ticket.Class()].QueueTimeout
	}
	q := request{model: f.Model, prompt: f.prompt(), class: ticket.Class(), pack: ticket.Packed()}
	if vv := req.Header[r.keyField]; len(vv) > 0 {
		q.key = vv[0]
	}
	streaming := f.Stream
	promptTokens := int64(len(q.prompt) / r.opts.PromptBytesPerTokenGuess)
	ticket.Charge(promptTokens, admission.PromptTokenWeight) // the tenant's counter (fair shares)
	if o := r.objectives[q.class]; o > 0 {
		q.own, q.ttftBy = promptTokens, arrived+int64(o)
	}

	maxRetries := r.opts.RetryMaxRetries
	if r.opts.DisableRetries {
		maxRetries = 0
	}
	backoff := time.Duration(r.opts.RetryInitialBackoffMs) * time.Millisecond
	for attempt := 0; ; attempt++ {
		v := r.view.Load()
		if v == nil {
			writeError(w, http.StatusServiceUnavailable, CodeNoAvailableWorkers,
				"No fleet snapshot from the control plane yet", 0)
			return http.StatusServiceUnavailable
		}
		if r.opts.PDDisaggregation {
			if pp := v.pdPoolFor(f.Model); pp != nil {
				if ticket != nil && !ticket.Start() {
					return writePreempted(w) // PD requests are not preempted once routed
				}
				return r.servePD(rc.get(), w, req, v, pp, body, &f, &q)
			}
		}
		p := v.all
		if f.Model != "" {
			var ok bool
			if p, ok = v.pools[f.Model]; !ok {
				writeError(w, http.StatusNotFound, CodeModelNotFound, "The model '"+f.Model+"' does not exist", 0)
				return http.StatusNotFound
			}
		}
		q.now = r.now()
		if r.gating() {
			q.need, _ = batchSize(&f)
			if r.tooWideEverywhere(v, p, q.need) {
				return r.writeWindowShed(w, f.Model, StageAdmissionWindow, r.wm.sheds)
			}
		}
		if r.opts.WorkerTokenBudget {
			output := expectedOutput(&f, int64(r.opts.WorkerTokenBudgetOutputTokens))
			q.tokens = requestTokens(promptTokens, output, q.need)
			if budget, ok := r.tooManyTokensEverywhere(v, p, q.tokens); ok {
				return r.refuseContextLength(w, f.Model, promptTokens, output, q.tokens, budget)
			}
		}
		wait, objWait := roomWait, false // objWait: the objective ends the wait
		if q.ttftBy != 0 {
			verdict, bound, retry := r.objectiveGate(v, p, &q)
			if verdict == admission.ObjectiveRefuse {
				return r.refuseObjective(w, &q, f.Model, retry)
			}
			// The operator's wait bounds the objective's too: with 0 a
			// request no worker with room meets now is refused at once.
			wait, objWait = min(roomWait, bound), true
		}
		var held *workerState // the worker whose room this attempt holds
		var borrowed *loan    // or the peer router that lent the room
		var i int32
		var out outcome
		if lent != nil { // the door's loan serves the first attempt
			g, l := r.loanGrant(f.Model, lent)
			lent = nil
			if l != nil { // else given back (a worker this router does not know): select here
				v, i, out, borrowed = g.v, g.i, g.out, l
			}
		}
		spilled := false
		if borrowed == nil {
			i, out = r.sel.choose(v, p, &q, r.opts.WorkerOverloadShed)
			if r.spill != nil {
				i, out, spilled = r.spillOver(v, p, i, out, &q, body, promptTokens)
			}
		}
		if out == full && q.need == 0 && !spilled { // no window to wait in: only an objective leaves none that meets it
			_, _, retry := r.objectiveGate(v, p, &q)
			return r.refuseObjective(w, &q, f.Model, retry)
		}
		if q.need > 0 && !spilled && borrowed == nil {
			waitFrom := r.clock()
			g, res := r.acquireRoomAfter(rc.get(), v, p, i, out, f.Model, false, &q, wait)
			if res != admission.RoomAtOnce {
				r.wm.wait.Observe(r.clock().Sub(waitFrom).Seconds())
			}
			switch res {
			case admission.RoomWaited:
				r.wm.waits.Inc()
				if objWait {
					r.om.waits[q.class].Inc()
				}
			case admission.RoomShed, admission.RoomQueueFull:
				if objWait {
					q.now = r.now()
					_, _, retry := r.objectiveGate(v, p, &q)
					return r.refuseObjective(w, &q, f.Model, retry)
				}
				if g, borrowed = r.borrowRoom(rc.get(), f.Model, &q); borrowed == nil {
					r.noteBudgetShed(f.Model, &q)
					return r.writeWindowShed(w, f.Model, StageAdmissionWindow, r.wm.sheds)
				}
			case admission.RoomTooWide:
				return r.writeWindowShed(w, f.Model, StageAdmissionWindow, r.wm.sheds)
			case admission.RoomCancelled:
				return r.waitEnded(w, req, f.Model, StageAdmissionWindow, r.wm.sheds)
			}
			v, i, out = g.v, g.i, g.out
			if i >= 0 && borrowed == nil {
				held = v.states[i]
			}
		}
		switch out {
		case shedAll:
			r.metrics.shed.WithLabelValues(StageSelection).Inc()
			writeError(w, http.StatusServiceUnavailable, CodeShed,
				"All workers"+forModel(f.Model)+" are overloaded", r.retryAfterShed())
			return http.StatusServiceUnavailable
		case noneAvailable:
			writeError(w, http.StatusServiceUnavailable, CodeNoAvailableWorkers,
				"No available workers"+forModel(f.Model), 0)
			return http.StatusServiceUnavailable
		case overloadFallback:
			r.metrics.overloadFallback.WithLabelValues(StageSelection).Inc()
		case livenessFallback:
			r.metrics.livenessFallback.WithLabelValues(StageSelection).Inc()
		}
		wk, st := v.worker(i), v.states[i]

		if r.beforeDispatch != nil {
			r.beforeDispatch()
		}
		if r.opts.WorkerOverloadShed && r.overloadedSince(v, st) {
			// Shed rather than re-select: the flag only changes when a
			// report arrives, so this window is rare.
			if held != nil {
				r.releaseRoom(held, q.need, q.tokens)
			}
			if borrowed != nil {
				borrowed.release()
			}
			r.metrics.shed.WithLabelValues(StageDispatch).Inc()
			writeError(w, http.StatusServiceUnavailable, CodeShed,
				"Worker '"+wk.URL+"'"+forModel(f.Model)+" became overloaded before dispatch", r.retryAfterShed())
			return http.StatusServiceUnavailable
		}

		res := func() dispatchResult {
			if held != nil {
				// The answer ended (a stream cut mid-way too): the room frees now.
				defer r.releaseRoom(held, q.need, q.tokens)
			}
			if borrowed != nil {
				defer borrowed.release() // the lender's room, likewise
			}
			return r.dispatch(rc, w, req, wk, st, body, streaming, promptTokens, attempt < maxRetries, ticket)
		}()
		if !res.retry {
			return res.status
		}
		r.metrics.retries.Inc()
		q.avoid = st
		if !sleepCtx(rc.get(), r.jitter(backoff)) {
			if preempted(rc.get()) {
				return writePreempted(w)
			}
			return statusClientClosed
		}
		backoff = min(time.Duration(float64(backoff)*r.opts.RetryBackoffMultiplier),
			time.Duration(r.opts.RetryMaxBackoffMs)*time.Millisecond)
	}
}

// overloadedSince reports whether the chosen worker's entry in a snapshot
// published after selection carries the overload flag.
func (r *Router) overloadedSince(selected *view, st *workerState) bool {
	cur := r.view.Load()
	if cur == selected || cur == nil {
		return false
	}
	j := cur.indexOfSlot(st.slot)
	return j >= 0 && cur.states[j] == st && cur.worker(j).Veto == VetoOverload
}

type dispatchResult struct {
	status int
	retry  bool // nothing reached the client and another attempt may follow
}

// dispatch sends one attempt to wk and, unless it is to be retried, streams
// the answer to the client. With a scheduler ticket, nothing reaches the
// client before the ticket's first-byte compare-and-swap wins: the status
// line and headers wait for the first body bytes, so a request preempted
// while the engine queues or prefills it is answered with the preemption
// alone, and its upstream request is cancelled.
func (r *Router) dispatch(rc *reqCtx, w http.ResponseWriter, in *http.Request, wk *Worker, st *workerState,
	body []byte, streaming bool, promptTokens int64, mayRetry bool, ticket *admission.Ticket) dispatchResult {
	if enginegrpc.IsGRPC(wk.URL) {
		return r.dispatchGRPC(rc.get(), w, in, wk, st, body, mayRetry, ticket)
	}
	out, err := r.upstreamRequest(in, wk, st, body)
	if err != nil {
		if errors.Is(err, errProviderKey) {
			r.recordFailure(wk, st)
			if mayRetry {
				return dispatchResult{retry: true}
			}
			writeError(w, http.StatusBadGateway, CodeUpstreamError, "Worker '"+wk.URL+"': "+err.Error(), 0)
			return dispatchResult{status: http.StatusBadGateway}
		}
		writeError(w, http.StatusBadGateway, CodeUpstreamError, "Invalid worker URL '"+wk.URL+"'", 0)
		return dispatchResult{status: http.StatusBadGateway}
	}

	st.dispatched.Add(1)
	tt := r.startTTFT(wk, st, promptTokens)
	r.addPrompt(st, promptTokens)
	prefilling := true // until the first byte: the prompt is still in hand
	defer func() {
		if prefilling {
			r.addPrompt(st, -promptTokens)
		}
	}()
	// An HTTP stream is no pile: the spec counts streaming gRPC generations
	// only (dispatchGRPC), though every chunk still counts as progress.
	sent := r.clock()

	// A plain engine behind the lean server needs no context of the
	// request's own: the request's bound is the connection's deadline, and
	// the server's hook cuts it when the client leaves or at Stop.
	ctx, hook := rc.parent, rc.hook(w)
	if hook == nil || wk.Provider != nil {
		ctx = rc.get()
	}
	resp, err := r.roundTripTo(ctx, wk, st, out, rc.deadline, hook)
	if err != nil {
		if preempted(ctx) {
			return dispatchResult{status: writePreempted(w)}
		}
		if r.stopping() {
			writeError(w, http.StatusServiceUnavailable, CodeShuttingDown, "The router is shutting down; retry on another router", 1)
			return dispatchResult{status: http.StatusServiceUnavailable}
		}
		if clientLeft(in) {
			return dispatchResult{status: statusClientClosed} // the client left: not the worker's fault
		}
		kind := r.recordUpstreamError(st, err)
		r.recordFailure(wk, st)
		if mayRetry && kind != "timeout" {
			return dispatchResult{retry: true}
		}
		status := http.StatusBadGateway
		if kind == "timeout" {
			status = http.StatusGatewayTimeout
		}
		writeError(w, status, CodeUpstreamError, "Worker '"+wk.URL+"' failed: "+err.Error(), 0)
		return dispatchResult{status: status}
	}
	defer resp.Body.Close()
	st.answered(r.clock())
	if ticket.Fair() {
		oc := &outputCounter{r: resp.Body, sse: strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream"),
			bytesPerToken: int64(r.opts.PromptBytesPerTokenGuess)}
		resp.Body = oc
		defer func() { ticket.Charge(oc.tokens(), admission.OutputTokenWeight) }()
	}

	if resp.StatusCode >= 500 {
		r.metrics.upstream.WithLabelValues("status_5xx").Inc()
		r.recordFailure(wk, st)
	} else {
		r.recordSuccess(wk, st)
	}
	// A worker's (or a nested gateway's) shed is never retried internally.
	wasShed := resp.Header.Get(canonicalErrorCodeHeader) == CodeShed
	if mayRetry && retryable(wk, resp.StatusCode) && !wasShed {
		_, _ = io.CopyN(io.Discard, resp.Body, 4<<10) // lets a small answer reuse its connection
		return dispatchResult{retry: true}
	}

	headSent := false
	sendHead := func() bool {
		if ticket != nil && !ticket.Start() {
			return false // preempted first: the client gets the preemption answer
		}
		copyResponseHeaders(w.Header(), resp.Header)
		w.WriteHeader(resp.StatusCode)
		headSent = true
		return true
	}
	if ticket == nil {
		sendHead()
	}
	sse := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	firstByte := func(now time.Time) bool {
		if prefilling {
			prefilling = false
			r.addPrompt(st, -promptTokens)
			if resp.StatusCode == http.StatusOK {
				st.notePrefill(promptTokens, now.Sub(sent))
				tt.firstByte(now, now.Sub(sent))
			}
		} else if streaming || sse {
			tt.chunk(now)
		}
		return headSent || sendHead()
	}
	err = r.copyBody(w, resp.Body, st, streaming || sse, firstByte)
	if err == nil && !headSent && !sendHead() {
		err = errPreempted // an empty answer, preempted as it ended
	}
	if err != nil {
		if !headSent && preempted(ctx) {
			return dispatchResult{status: writePreempted(w)}
		}
		if r.stopping() && !clientLeft(in) {
			if sse {
				writeStreamError(w, CodeShuttingDown, "The router is shutting down: the stream was cut after the shutdown grace")
			}
			panic(http.ErrAbortHandler)
		}
		if !clientLeft(in) {
			r.recordUpstreamError(st, err)
			r.recordFailure(wk, st)
			if sse {
				// The client reads an explicit error event before the cut.
				writeStreamError(w, CodeUpstreamError, "Worker '"+wk.URL+"' broke off the stream: "+err.Error())
			}
			// Cut the connection: the client never sees a clean end.
			panic(http.ErrAbortHandler)
		}
		return dispatchResult{status: statusClientClosed}
	}
	now := r.clock()
	st.lastProgress.Store(now.UnixNano()) // completion counts as progress
	r.completions.add(now)
	return dispatchResult{status: resp.StatusCode}
}

// copyBody forwards the answer, flushing after every read when streaming so
// each SSE event reaches the client as it arrives; the last bytes, read
// with the body's end, go out with the answer's end instead (one write,
// not two). Every chunk is progress, stamped once for firstByte and st.
func (r *Router) copyBody(w http.ResponseWriter, body io.Reader, st *workerState, flush bool, firstByte func(time.Time) bool) error {
	bp := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(bp)
	buf := *bp
	flusher, _ := w.(http.Flusher)
	if !flush {
		flusher = nil
	}
	for {
		n, err := body.Read(buf)
		if n > 0 {
			now := r.clock()
			if !firstByte(now) {
				return errPreempted
			}
			st.lastProgress.Store(now.UnixNano())
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
			if flusher != nil && err != io.EOF {
				flusher.Flush()
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

func (r *Router) recordFailure(wk *Worker, st *workerState) {
	if st.breaker.failure(&r.cb, r.now()) {
		r.metrics.breakers.WithLabelValues("open").Inc()
		r.log.Warn("Circuit breaker opened", "worker_id", wk.ID, "url", wk.URL)
	}
}

func (r *Router) recordSuccess(wk *Worker, st *workerState) {
	if st.breaker.success(&r.cb, r.now()) {
		r.metrics.breakers.WithLabelValues("closed").Inc()
		r.log.Info("Circuit breaker closed", "worker_id", wk.ID, "url", wk.URL)
	}
}

// recordUpstreamError counts a failed attempt by kind; connection-level
// failures are also kept for the control plane's unreachable rule.
func (r *Router) recordUpstreamError(st *workerState, err error) string {
	kind := classifyUpstreamError(err)
	r.metrics.upstream.WithLabelValues(kind).Inc()
	if kind == "connection" {
		st.connFailures.Add(1)
	}
	return kind
}

// classifyUpstreamError separates "the worker is gone" (connection) from
// "the worker is slow" (timeout) with the classifier the agent and the
// control plane use, since only the former may arm the unreachable veto. A
// client that left says nothing about the worker: other.
func classifyUpstreamError(err error) string {
	switch k := netfail.Classify(err); k {
	case netfail.Connection, netfail.Timeout:
		return k.String()
	}
	return "other"
}

// retryableStatus: answers that say "try elsewhere or later". 508 is a
// routing loop (the worker's URL leads back to an smg router, through a proxy
// that hides /smg/identity): that worker can never answer, another can.
func retryableStatus(code int) bool {
	switch code {
	case http.StatusRequestTimeout, http.StatusTooManyRequests, http.StatusInternalServerError,
		http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout, http.StatusLoopDetected:
		return true
	}
	return false
}

// jitter spreads d by ±RetryJitterFactor.
func (r *Router) jitter(d time.Duration) time.Duration {
	j := r.opts.RetryJitterFactor
	if j == 0 || d <= 0 {
		return d
	}
	return time.Duration(float64(d) * (1 + j*(2*rand.Float64()-1)))
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// errBodyTimeout: the body did not arrive within --body-read-timeout-secs.
var errBodyTimeout = errors.New("request body timeout")

// readBody reads the body against --max-payload-size, growing its buffer
// with the bytes that arrive, never from what Content-Length claims: a header
// alone costs the router nothing. The whole body must arrive within
// --body-read-timeout-secs, so a body that trickles or stalls is cut.
func (r *Router) readBody(w http.ResponseWriter, req *http.Request) ([]byte, error) {
	limit := r.opts.MaxPayloadSize
	if req.ContentLength > limit {
		return nil, &http.MaxBytesError{Limit: limit}
	}
	// A body the server already holds whole (the lean server's, which came
	// with its head) is read at once: no deadline to arm, no buffer to grow.
	if bb, ok := req.Body.(interface{ Buffered() int64 }); ok && req.ContentLength > 0 && bb.Buffered() == req.ContentLength {
		body := make([]byte, req.ContentLength)
		if _, err := io.ReadFull(req.Body, body); err != nil {
			return nil, err
		}
		return body, nil
	}
	rc := http.NewResponseController(w)
	if rc.SetReadDeadline(time.Now().Add(time.Duration(r.opts.BodyReadTimeoutSecs)*time.Second)) == nil {
		// Cleared before the server's background read (which watches for
		// the client leaving) could trip on it.
		defer func() { _ = rc.SetReadDeadline(time.Time{}) }()
	}
	var buf bytes.Buffer
	_, err := buf.ReadFrom(http.MaxBytesReader(w, req.Body, limit))
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return nil, errBodyTimeout
	}
	return buf.Bytes(), err
}

// isObject reports whether a valid JSON body is an object (not null, an
// array, a string or a number).
func isObject(body []byte) bool {
	b := bytes.TrimLeft(body, " \t\r\n")
	return len(b) > 0 && b[0] == '{'
}

func upstreamURL(base string, in *http.Request) string {
	u := strings.TrimSuffix(base, "/") + in.URL.Path
	if in.URL.RawQuery != "" {
		u += "?" + in.URL.RawQuery
	}
	return u
}

// Hop-by-hop headers (RFC 9110 7.6.1) are not forwarded in either direction.
var hopHeaders = map[string]bool{
	"Connection": true, "Proxy-Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
}

// copyRequestHeaders forwards the client's headers; a worker registered with
// an api_key gets it as the bearer token instead of the client's.
func copyRequestHeaders(dst, src http.Header, apiKey string) {
	for k, vv := range src {
		if hopHeaders[k] || k == "Content-Length" || k == "Host" {
			continue
		}
		dst[k] = vv
	}
	if apiKey != "" {
		dst["Authorization"] = []string{"Bearer " + apiKey}
	}
	dst[hopHeader] = hopValue // a router that receives it refuses it: a loop
}

var hopHeader = http.CanonicalHeaderKey(identity.HopHeader)

// hopValue is shared by every request's header: nothing writes to it.
var hopValue = []string{"1"}

// copyResponseHeaders forwards a worker's headers, minus hop-by-hop ones and
// X-SMG-Error-Code: that header marks only this router's own decisions.
func copyResponseHeaders(dst, src http.Header) {
	for k, vv := range src {
		if hopHeaders[k] || k == canonicalErrorCodeHeader || strings.EqualFold(k, ErrorCodeHeader) {
			continue
		}
		dst[k] = vv
	}
}
