package router

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/smg-project/smg/internal/enginegrpc"
	"github.com/smg-project/smg/internal/openaigrpc"
	"github.com/smg-project/smg/internal/tlsutil"
	"github.com/smg-project/smg/router/admission"
)

// Error codes of the gRPC data path.
const (
	// CodeInvalidRequest: a request a gRPC worker's model cannot take (its
	// chat template fails on it, a prompt over the context, token ids outside
	// the vocabulary), refused before anything is sent to the engine.
	CodeInvalidRequest = "invalid_request"
	// CodeRouteNotServed: a route gRPC workers do not serve (embeddings on
	// a prefill/decode pair).
	CodeRouteNotServed = "route_not_served_by_grpc_worker"
	// CodeWorkerNotServable: the worker's tokenizer or template cannot load.
	CodeWorkerNotServable = "worker_not_servable"
)

// grpcPath is the router's upstream for grpc:// and grpcs:// workers: it
// tokenizes and detokenizes here, behind the same selection and admission
// as HTTP workers.
type grpcPath struct {
	clients *enginegrpc.Pool
	models  *openaigrpc.Models
}

func newGRPCPath(o Options) (*grpcPath, error) {
	var gopts enginegrpc.Options
	if o.EngineTLS != nil {
		gopts.Creds = tlsutil.Credentials(*o.EngineTLS)
	}
	p := &grpcPath{clients: enginegrpc.NewPool(gopts), models: &openaigrpc.Models{Now: o.Now}}
	if o.TokenizerPath != "" {
		m, err := openaigrpc.LoadPath(o.TokenizerPath)
		if err != nil {
			return nil, err
		}
		p.models.Fixed = m
	}
	return p, nil
}

// retain drops the channels and models of workers no longer in the fleet.
func (p *grpcPath) retain(workers []Worker) {
	keep := map[string]bool{}
	for i := range workers {
		if enginegrpc.IsGRPC(workers[i].URL) {
			keep[workers[i].URL] = true
		}
	}
	p.clients.Retain(keep)
	p.models.Forget(func(u string) bool { return keep[u] })
}

// model is the worker's tokenizer and template, read on first use.
func (p *grpcPath) model(ctx context.Context, c *enginegrpc.Client) (*openaigrpc.Model, error) {
	return p.models.ForWorker(ctx, c.URL(), func(ctx context.Context) ([]byte, int, error) {
		info, err := c.Info(ctx)
		if err != nil {
			return nil, 0, err
		}
		data, err := c.Tokenizer(ctx, enginegrpc.MaxTokenizerBytes)
		return data, info.MaxContext, err
	})
}

// grpcNotServableFor is how long a worker whose tokenizer cannot load is
// left out of selection before its files are read again.
const grpcNotServableFor = 30 * time.Second

// dispatchGRPC is dispatch for a gRPC worker: the same bookkeeping (pile,
// prompt in hand, progress per token batch, breaker, retries before the
// first byte, preemption), with the request translated to Generate.
func (r *Router) dispatchGRPC(ctx context.Context, w http.ResponseWriter, in *http.Request, wk *Worker, st *workerState,
	body []byte, mayRetry bool, ticket *admission.Ticket) dispatchResult {
	job, err := parseGRPC(in.URL.Path, body)
	if err != nil {
		return dispatchResult{status: writeParseError(w, in.URL.Path, err)}
	}
	c, err := r.grpc.clients.Get(wk.URL)
	if err != nil {
		writeError(w, http.StatusBadGateway, CodeUpstreamError, "Invalid worker URL '"+wk.URL+"': "+err.Error(), 0)
		return dispatchResult{status: http.StatusBadGateway}
	}
	m, err := r.grpc.model(ctx, c)
	if err != nil {
		if ctx.Err() != nil {
			return r.endedBeforeAnswer(ctx, w, in)
		}
		st.grpcDownUntil.Store(r.now() + int64(grpcNotServableFor))
		r.log.Warn("gRPC worker not routable: its tokenizer cannot be loaded", "worker_id", wk.ID, "url", wk.URL,
			"retry_in", grpcNotServableFor, "err", err)
		if mayRetry {
			return dispatchResult{retry: true}
		}
		writeError(w, http.StatusServiceUnavailable, CodeWorkerNotServable, "Worker '"+wk.URL+"' is not routable: "+err.Error(), 0)
		return dispatchResult{status: http.StatusServiceUnavailable}
	}
	st.grpcDownUntil.Store(0)
	prompts, err := job.prompts(m)
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeInvalidRequest, err.Error(), 0)
		return dispatchResult{status: http.StatusBadRequest}
	}
	var promptTokens int64
	for _, p := range prompts {
		promptTokens += int64(len(p))
	}

	st.dispatched.Add(1)
	r.addPrompt(st, promptTokens)
	prefilling := true
	defer func() {
		if prefilling {
			r.addPrompt(st, -promptTokens)
		}
	}()
	if job.streaming() { // the pile: streaming gRPC generations
		st.streams.Add(1)
		defer st.streams.Add(-1)
	}
	sent := r.clock()
	call := job.start(ctx, c, m, prompts, wk.Model)
	defer call.Close() // aborts on the engine whatever did not finish

	if err := call.Wait(ctx); err != nil {
		if ctx.Err() != nil {
			return r.endedBeforeAnswer(ctx, w, in)
		}
		ee := openaigrpc.Classify(err)
		switch {
		case ee.Connection:
			r.metrics.upstream.WithLabelValues("connection").Inc()
			st.connFailures.Add(1)
		case ee.Timeout:
			r.metrics.upstream.WithLabelValues("timeout").Inc()
		case ee.Status >= 500:
			r.metrics.upstream.WithLabelValues("status_5xx").Inc()
		}
		if !ee.Connection && !ee.Timeout {
			st.answered(r.clock()) // the engine answered
		}
		if ee.Status >= 500 {
			r.recordFailure(wk, st)
		} else {
			r.recordSuccess(wk, st)
		}
		if mayRetry && ee.Retry && !ee.Timeout {
			return dispatchResult{retry: true}
		}
		if ee.Connection {
			ee.Message = "Worker '" + wk.URL + "' failed: " + ee.Message
		}
		writeEngineError(w, ee)
		return dispatchResult{status: ee.Status}
	}
	st.answered(r.clock())
	r.recordSuccess(wk, st)
	prefilling = false
	r.addPrompt(st, -promptTokens)
	st.notePrefill(promptTokens, r.clock().Sub(sent))
	if ticket != nil && !ticket.Start() {
		return dispatchResult{status: writePreempted(w)}
	}
	var out int64 // output tokens, for the tenant's counter (fair shares)
	defer func() { ticket.Charge(out, admission.OutputTokenWeight) }()
	err = call.Serve(ctx, w, func(n int) {
		out += int64(n)
		st.lastProgress.Store(r.clock().UnixNano())
	})
	if err != nil {
		if clientLeft(in) {
			return dispatchResult{status: statusClientClosed}
		}
		if r.stopping() {
			writeStreamError(w, CodeShuttingDown, "The router is shutting down: the stream was cut after the shutdown grace")
			panic(http.ErrAbortHandler)
		}
		ee := openaigrpc.Classify(err)
		if ee.Connection {
			r.metrics.upstream.WithLabelValues("connection").Inc()
			st.connFailures.Add(1)
		} else {
			r.metrics.upstream.WithLabelValues("other").Inc()
		}
		r.recordFailure(wk, st)
		// The client reads an explicit error event before the cut.
		writeStreamError(w, CodeUpstreamError, "Worker '"+wk.URL+"' broke off the stream: "+ee.Message)
		panic(http.ErrAbortHandler)
	}
	now := r.clock()
	st.lastProgress.Store(now.UnixNano())
	r.completions.add(now)
	return dispatchResult{status: http.StatusOK}
}

// endedBeforeAnswer answers a request whose context ended before anything
// reached the client: preempted, the router stopping, or the client gone.
func (r *Router) endedBeforeAnswer(ctx context.Context, w http.ResponseWriter, in *http.Request) dispatchResult {
	switch {
	case preempted(ctx):
		return dispatchResult{status: writePreempted(w)}
	case r.stopping():
		writeError(w, http.StatusServiceUnavailable, CodeShuttingDown, "The router is shutting down; retry on another router", 1)
		return dispatchResult{status: http.StatusServiceUnavailable}
	case clientLeft(in):
		return dispatchResult{status: statusClientClosed}
	}
	writeError(w, http.StatusGatewayTimeout, CodeUpstreamError, "The request timed out", 0)
	return dispatchResult{status: http.StatusGatewayTimeout}
}

// writeEngineError answers with an engine's error in OpenAI's shape. It is
// the engine's answer, not this router's decision: no X-SMG-Error-Code.
func writeEngineError(w http.ResponseWriter, e *openaigrpc.EngineError) {
	body := e.AppendErrorBody(make([]byte, 0, 128+len(e.Message)))
	h := w.Header()
	h["Content-Type"] = []string{"application/json"}
	w.WriteHeader(e.Status)
	_, _ = w.Write(body)
}

// sendPairGRPC serves a PD request over a pair of gRPC workers: the prefill
// leg's Generate runs beside the decode leg's, both with the prefill
// engine's bootstrap host and port and a fresh room, and the client gets
// the decode leg's tokens. A leg that fails cancels the other and fails the
// request with an explicit error. PD legs form no pile.
func (r *Router) sendPairGRPC(ctx context.Context, w http.ResponseWriter, in *http.Request,
	pw *Worker, pst *workerState, dw *Worker, dst *workerState, body []byte, rooms int64, model string) int {
	if !enginegrpc.IsGRPC(pw.URL) || !enginegrpc.IsGRPC(dw.URL) {
		writeError(w, http.StatusBadGateway, CodeUpstreamError, "A prefill/decode pair must be both gRPC or both HTTP workers: prefill '"+
			pw.URL+"', decode '"+dw.URL+"'", 0)
		return http.StatusBadGateway
	}
	job, err := parseGRPC(in.URL.Path, body)
	if err == nil && job.gen == nil {
		err = errRouteNotServed
	}
	if err != nil {
		return writeParseError(w, in.URL.Path, err)
	}
	req := job.gen
	pc, err := r.grpc.clients.Get(pw.URL)
	if err == nil {
		var dc *enginegrpc.Client
		if dc, err = r.grpc.clients.Get(dw.URL); err == nil {
			return r.servePairGRPC(ctx, w, in, req, pw, pst, pc, dw, dst, dc, rooms, model)
		}
	}
	writeError(w, http.StatusBadGateway, CodeUpstreamError, err.Error(), 0)
	return http.StatusBadGateway
}

func (r *Router) servePairGRPC(ctx context.Context, w http.ResponseWriter, in *http.Request, req *openaigrpc.Request,
	pw *Worker, pst *workerState, pc *enginegrpc.Client, dw *Worker, dst *workerState, dc *enginegrpc.Client,
	rooms int64, model string) int {
	m, err := r.grpc.model(ctx, dc)
	if err != nil {
		if ctx.Err() != nil {
			return r.endedBeforeAnswer(ctx, w, in).status
		}
		writeError(w, http.StatusServiceUnavailable, CodeWorkerNotServable, "Worker '"+dw.URL+"' is not routable: "+err.Error(), 0)
		return http.StatusServiceUnavailable
	}
	prompts, err := m.Prompts(req)
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeInvalidRequest, err.Error(), 0)
		return http.StatusBadRequest
	}
	host := pw.URL
	if u, err := url.Parse(pw.URL); err == nil && u.Hostname() != "" {
		host = u.Hostname()
	}
	// Each generation (a prompt's choice) is its own engine request on each
	// leg, so each gets its own room: DisaggregatedParams names one room per
	// GenerateRequest. The decode window took one room per generation.
	n := req.Choices()
	if extra := int64(len(prompts)*n) - rooms; extra > 0 {
		// More generations than the rooms taken before the body was read
		// in full (/generate's n is inside sampling_params): the rest now,
		// or the window's shed.
		if !dst.gate.TryAcquire(extra, 0) {
			return r.writeWindowShed(w, model, StagePDAdmission, r.pdm.sheds)
		}
		defer r.releaseRoom(dst, extra, 0)
	}
	req.Bootstraps = make([]openaigrpc.Bootstrap, len(prompts)*n)
	for i := range req.Bootstraps {
		req.Bootstraps[i] = openaigrpc.Bootstrap{Host: host, Port: pw.BootstrapPort, Room: newBootstrapRoom() & 0x7fffffff}
	}

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	pst.dispatched.Add(1)
	dst.dispatched.Add(1)
	var prefills sync.WaitGroup
	var prefillFailed atomic.Bool
	var prefilled atomic.Int64
	for i := range req.Bootstraps {
		sp := req.Sampling()
		sp.Bootstrap = &req.Bootstraps[i]
		prefills.Go(func() {
			err := openaigrpc.Prefill(ctx, pc, "prefill-"+strconv.FormatUint(sp.Bootstrap.Room, 16), prompts[i/n], sp)
			if err == nil {
				prefilled.Add(1)
			} else if ctx.Err() == nil && !prefillFailed.Swap(true) {
				r.recordFailure(pw, pst)
				cancel(&legError{leg: "prefill", url: pw.URL, err: openaigrpc.Classify(err)})
			}
		})
	}
	// The prefill legs end before the decode legs in a healthy pair; if not,
	// the deferred cancel stops them and this waits for their goroutines.
	defer func() {
		cancel(nil)
		prefills.Wait()
		if prefilled.Load() > 0 {
			pst.answered(r.clock())
			r.recordSuccess(pw, pst)
		}
	}()

	call := openaigrpc.Start(ctx, dc, m, req, prompts, dw.Model)
	defer call.Close()
	if err := call.Wait(ctx); err != nil {
		if clientLeft(in) {
			return statusClientClosed
		}
		var le *legError
		if errors.As(context.Cause(ctx), &le) {
			writeError(w, http.StatusBadGateway, CodeUpstreamError, le.Error(), 0)
			return http.StatusBadGateway
		}
		if ctx.Err() != nil {
			return r.endedBeforeAnswer(ctx, w, in).status
		}
		ee := openaigrpc.Classify(err)
		if ee.Status >= 500 {
			r.recordFailure(dw, dst)
		}
		ee.Message = "decode worker '" + dw.URL + "' failed: " + ee.Message
		writeEngineError(w, ee)
		return ee.Status
	}
	dst.answered(r.clock())
	r.recordSuccess(dw, dst)
	if err := call.Serve(ctx, w, func(int) { dst.lastProgress.Store(r.clock().UnixNano()) }); err != nil {
		if clientLeft(in) {
			return statusClientClosed
		}
		msg := "Worker '" + dw.URL + "' broke off the stream: " + openaigrpc.Classify(err).Message
		var le *legError
		if errors.As(context.Cause(ctx), &le) {
			msg = le.Error()
		}
		r.recordFailure(dw, dst)
		writeStreamError(w, CodeUpstreamError, msg)
		panic(http.ErrAbortHandler)
	}
	now := r.clock()
	dst.lastProgress.Store(now.UnixNano())
	r.completions.add(now)
	return http.StatusOK
}

// grpcAnswer is one request being served over the engine protocol.
type grpcAnswer interface {
	// Wait blocks until the answer can start; an error reached the client
	// with nothing.
	Wait(context.Context) error
	// Serve writes the answer.
	Serve(context.Context, http.ResponseWriter, openaigrpc.Progress) error
	// Close ends what the engine still runs.
	Close()
}

// grpcJob is a request parsed for a gRPC worker: a generation (chat, text
// completion, /generate) or embeddings.
type grpcJob struct {
	gen   *openaigrpc.Request
	embed *openaigrpc.EmbedRequest
}

// errRouteNotServed: a route a gRPC worker (or pair) does not serve.
var errRouteNotServed = errors.New("route not served")

func parseGRPC(path string, body []byte) (grpcJob, error) {
	var j grpcJob
	var err error
	switch path {
	case "/v1/chat/completions":
		j.gen, err = openaigrpc.ParseRequest(body, true)
	case "/v1/completions":
		j.gen, err = openaigrpc.ParseRequest(body, false)
	case "/generate":
		j.gen, err = openaigrpc.ParseGenerate(body)
	case "/v1/embeddings":
		j.embed, err = openaigrpc.ParseEmbed(body)
	default:
		err = errRouteNotServed
	}
	return j, err
}

// writeParseError answers a request parseGRPC refused.
func writeParseError(w http.ResponseWriter, path string, err error) int {
	if errors.Is(err, errRouteNotServed) {
		msg := path + " is not served by gRPC workers"
		if path == "/v1/embeddings" {
			msg = "/v1/embeddings is not served by a prefill/decode pair"
		}
		writeError(w, http.StatusNotImplemented, CodeRouteNotServed, msg, 0)
		return http.StatusNotImplemented
	}
	writeError(w, http.StatusBadRequest, CodeInvalidRequest, err.Error(), 0)
	return http.StatusBadRequest
}

func (j grpcJob) prompts(m *openaigrpc.Model) ([][]uint32, error) {
	if j.embed != nil {
		return m.EmbedPrompts(j.embed)
	}
	return m.Prompts(j.gen)
}

// streaming: the answer is a stream, whose generations form the pile.
func (j grpcJob) streaming() bool { return j.gen != nil && j.gen.Stream }

func (j grpcJob) start(ctx context.Context, c *enginegrpc.Client, m *openaigrpc.Model, prompts [][]uint32, model string) grpcAnswer {
	if j.embed != nil {
		return openaigrpc.StartEmbed(ctx, c, j.embed, prompts, model)
	}
	return openaigrpc.Start(ctx, c, m, j.gen, prompts, model)
}
