package router

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/smg-project/smg/internal/enginegrpc"
	"github.com/smg-project/smg/internal/jsonstr"
	"github.com/smg-project/smg/router/admission"
)

// pdMetrics are the spec's PD admission counters.
type pdMetrics struct {
	waits, sheds prometheus.Counter
}

func newPDMetrics(reg prometheus.Registerer) (*pdMetrics, error) {
	m := &pdMetrics{
		waits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "smg_pd_admission_waits_total",
			Help: "PD requests that waited for a room in a decode worker's running window and were admitted.",
		}),
		sheds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "smg_pd_admission_sheds_total",
			Help: "PD requests shed because no room in a decode worker's running window freed in time.",
		}),
	}
	for _, c := range []prometheus.Collector{m.waits, m.sheds} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// pdPoolFor returns the PD pools serving model, or nil.
func (v *view) pdPoolFor(model string) *pdPools {
	if model == "" {
		return v.pdAll
	}
	return v.pd[model]
}

// servePD routes one request over a (prefill, decode) pair: both legs get the
// same body plus SGLang's bootstrap fields, the client gets the decode leg's
// answer. It returns the status sent, for metrics.
func (r *Router) servePD(ctx context.Context, w http.ResponseWriter, in *http.Request, v *view, pp *pdPools,
	body []byte, f *requestFields, q *request) int {
	q.now = r.now()
	need, prompts := batchSize(f)
	switch pp.pairs {
	case 0:
		writeError(w, http.StatusServiceUnavailable, CodeNoAvailableWorkers, pp.unpairedMessage(f.Model), 0)
		return http.StatusServiceUnavailable
	case 1 << protoHTTP:
		q.proto = protoHTTP
	case 1 << protoGRPC:
		q.proto = protoGRPC
	}
	pi, pout := r.sel.choose(v, pp.prefill, q, r.opts.WorkerOverloadShed)
	q.need = need // the decode leg takes rooms in its worker's window
	if pi >= 0 {
		q.proto = v.hot.at(pi).proto // the decode leg speaks the prefill leg's protocol
	}
	di, dout := r.sel.choose(v, pp.decode, q, r.opts.WorkerOverloadShed)
	switch {
	case pout == noneAvailable || dout == noneAvailable:
		// Mixed causes are not a shed: a leg with nothing routable is no_available_workers.
		writeError(w, http.StatusServiceUnavailable, CodeNoAvailableWorkers,
			"No available prefill/decode pair"+forModel(f.Model), 0)
		return http.StatusServiceUnavailable
	case pout == shedAll || dout == shedAll:
		r.metrics.shed.WithLabelValues(StageSelection).Inc()
		writeError(w, http.StatusServiceUnavailable, CodeShed,
			"All workers"+forModel(f.Model)+" are overloaded", r.retryAfterShed())
		return http.StatusServiceUnavailable
	case pout == overloadFallback || dout == overloadFallback:
		r.metrics.overloadFallback.WithLabelValues(StageSelection).Inc()
	case pout == livenessFallback || dout == livenessFallback:
		r.metrics.livenessFallback.WithLabelValues(StageSelection).Inc()
	}

	if r.beforeDispatch != nil {
		r.beforeDispatch()
	}
	if r.opts.WorkerOverloadShed {
		for _, i := range [...]int32{pi, di} {
			if i >= 0 && r.overloadedSince(v, v.states[i]) {
				r.metrics.shed.WithLabelValues(StageDispatch).Inc()
				writeError(w, http.StatusServiceUnavailable, CodeShed,
					"Worker '"+v.worker(i).URL+"'"+forModel(f.Model)+" became overloaded before dispatch", r.retryAfterShed())
				return http.StatusServiceUnavailable
			}
		}
	}

	pst := v.states[pi]
	if r.tooWideEverywhere(v, pp.decode, need) {
		return r.writeWindowShed(w, f.Model, StagePDAdmission, r.pdm.sheds)
	}
	g, res := r.acquireRoomAfter(ctx, v, pp.decode, di, dout, f.Model, true, q, time.Duration(r.opts.PDAdmissionWaitSecs)*time.Second)
	switch res {
	case admission.RoomWaited:
		r.pdm.waits.Inc()
	case admission.RoomShed, admission.RoomTooWide, admission.RoomQueueFull:
		return r.writeWindowShed(w, f.Model, StagePDAdmission, r.pdm.sheds)
	case admission.RoomCancelled:
		return r.waitEnded(w, in, f.Model, StagePDAdmission, r.pdm.sheds)
	}
	if g.i < 0 {
		// The decode pool emptied or went vetoed while the request waited.
		writeError(w, http.StatusServiceUnavailable, CodeNoAvailableWorkers,
			"No available prefill/decode pair"+forModel(f.Model), 0)
		return http.StatusServiceUnavailable
	}
	v, di = g.v, g.i
	dec := v.states[di]
	defer r.releaseRoom(dec, need, 0)
	pi = v.indexOfSlot(pst.slot)
	if pi < 0 {
		writeError(w, http.StatusServiceUnavailable, CodeNoAvailableWorkers,
			"No available prefill/decode pair"+forModel(f.Model), 0)
		return http.StatusServiceUnavailable
	}

	pw, dw := v.worker(pi), v.worker(di)
	if enginegrpc.IsGRPC(pw.URL) || enginegrpc.IsGRPC(dw.URL) {
		return r.sendPairGRPC(ctx, w, in, pw, v.states[pi], dw, dec, body, need, f.Model)
	}
	legBody, err := injectBootstrap(body, pw, prompts)
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeInvalidJSON, err.Error(), 0)
		return http.StatusBadRequest
	}
	return r.sendPair(ctx, w, in, pw, v.states[pi], dw, dec, legBody, f.Stream)
}

// batchSize returns the number of decode rooms a request takes (one per
// prompt of a batched request, times n) and its number of prompts when it is
// a batch (0: a single prompt). The rooms are at most maxRooms: a client's
// n cannot wrap the product around to a request that takes no room.
func batchSize(f *requestFields) (rooms, prompts int64) {
	for _, p := range [...]rawRef{f.Text, f.Prompt, f.InputIDs} {
		if prompts = jsonBatchLen(p); prompts > 0 {
			break
		}
	}
	return min(min(max(1, prompts), maxRooms)*min(max(1, f.N), maxRooms), maxRooms), prompts
}

// maxRooms bounds the rooms one request claims: far past any window, so
// such a request is shed as too wide.
const maxRooms = 1 << 30

// jsonBatchLen returns the length of a JSON array of prompts (strings or token
// lists), or 0 for a single prompt. A list of numbers is one tokenized prompt.
func jsonBatchLen(raw []byte) int64 {
	raw = bytes.TrimSpace(raw)
	if len(raw) < 2 || raw[0] != '[' {
		return 0
	}
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil || len(items) == 0 {
		return 0
	}
	if first := bytes.TrimSpace(items[0]); len(first) > 0 && first[0] != '"' && first[0] != '[' {
		return 0 // token ids of one prompt
	}
	return int64(len(items))
}

// injectBootstrap adds SGLang's bootstrap fields to the body's JSON object:
// the prefill worker's host and bootstrap port (null when it has none: the
// engine's default) and a fresh random 63-bit room; a batch of prompts gets
// lists, one entry per prompt, as SGLang expects.
func injectBootstrap(body []byte, prefill *Worker, prompts int64) ([]byte, error) {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) < 2 || trimmed[0] != '{' || trimmed[len(trimmed)-1] != '}' {
		//lint:ignore ST1005 the message is sent to the client as it is, worded like the router's other answers
		return nil, errors.New("Invalid JSON body: a prefill/decode request must be a JSON object")
	}
	host := prefill.URL
	if u, err := url.Parse(prefill.URL); err == nil && u.Hostname() != "" {
		host = u.Hostname()
	}
	port := "null"
	if prefill.BootstrapPort > 0 {
		port = strconv.Itoa(int(prefill.BootstrapPort))
	}
	out := make([]byte, 0, len(trimmed)+96)
	out = append(out, trimmed[:len(trimmed)-1]...)
	if len(bytes.TrimSpace(trimmed[1:len(trimmed)-1])) > 0 {
		out = append(out, ',')
	}
	one := func(b []byte, field string, val func([]byte) []byte) []byte {
		b = append(b, '"')
		b = append(b, field...)
		b = append(b, `":`...)
		if prompts == 0 {
			return val(b)
		}
		b = append(b, '[')
		for k := range prompts {
			if k > 0 {
				b = append(b, ',')
			}
			b = val(b)
		}
		return append(b, ']')
	}
	out = one(out, "bootstrap_host", func(b []byte) []byte { return jsonstr.Append(b, host) })
	out = append(out, ',')
	out = one(out, "bootstrap_port", func(b []byte) []byte { return append(b, port...) })
	out = append(out, ',')
	out = one(out, "bootstrap_room", func(b []byte) []byte { return strconv.AppendUint(b, newBootstrapRoom(), 10) })
	return append(out, '}'), nil
}

// newBootstrapRoom is a random room id in SGLang's range (a 63-bit int).
func newBootstrapRoom() uint64 { return rand.Uint64() >> 1 }

// legError is a failed leg, for the client's explicit error.
type legError struct {
	leg, url string
	err      error
}

func (e *legError) Error() string {
	return fmt.Sprintf("%s worker '%s' failed: %v", e.leg, e.url, e.err)
}

// sendPair sends both legs at once and answers from the decode leg. A leg
// that fails cancels the other and fails the request with an explicit error.
func (r *Router) sendPair(ctx context.Context, w http.ResponseWriter, in *http.Request,
	pw *Worker, pst *workerState, dw *Worker, dst *workerState, body []byte, streaming bool) int {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	prefillDone := make(chan error, 1)
	go func() {
		err := r.prefillLeg(ctx, in, pw, pst, body)
		if err != nil {
			cancel(err) // the decode leg cannot finish without the prefill's KV
		}
		prefillDone <- err
	}()
	// The prefill leg ends before the decode leg in a healthy pair; if not,
	// the deferred cancel stops it and this waits for its goroutine.
	defer func() { cancel(nil); <-prefillDone }()

	out, err := http.NewRequestWithContext(ctx, http.MethodPost, upstreamURL(dw.URL, in), bytes.NewReader(body))
	if err != nil {
		writeError(w, http.StatusBadGateway, CodeUpstreamError, "Invalid worker URL '"+dw.URL+"'", 0)
		return http.StatusBadGateway
	}
	copyRequestHeaders(out.Header, in.Header, dw.APIKey)
	dst.dispatched.Add(1)
	resp, err := r.roundTrip(ctx, out)
	if err != nil {
		if clientLeft(in) {
			return statusClientClosed
		}
		var le *legError
		if cause := context.Cause(ctx); errors.As(cause, &le) {
			writeError(w, http.StatusBadGateway, CodeUpstreamError, le.Error(), 0)
			return http.StatusBadGateway
		}
		kind := r.recordUpstreamError(dst, err)
		r.recordFailure(dw, dst)
		status := http.StatusBadGateway
		if kind == "timeout" {
			status = http.StatusGatewayTimeout
		}
		writeError(w, status, CodeUpstreamError, (&legError{"Decode", dw.URL, err}).Error(), 0)
		return status
	}
	defer resp.Body.Close()
	dst.answered(r.clock())
	if resp.StatusCode >= 500 {
		r.metrics.upstream.WithLabelValues("status_5xx").Inc()
		r.recordFailure(dw, dst)
	} else {
		r.recordSuccess(dw, dst)
	}
	if resp.StatusCode >= 400 {
		// The decode leg refused or failed: stop the prefill leg now rather
		// than let it hold KV until its bootstrap deadline.
		cancel(nil)
	}
	copyResponseHeaders(w.Header(), resp.Header)
	w.WriteHeader(resp.StatusCode)
	sse := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	if err := r.copyBody(w, resp.Body, dst, streaming || sse, func(time.Time) bool { return true }); err != nil {
		if clientLeft(in) {
			return statusClientClosed
		}
		msg := (&legError{"Decode", dw.URL, err}).Error()
		var le *legError
		if cause := context.Cause(ctx); errors.As(cause, &le) {
			msg = le.Error()
		} else {
			r.recordUpstreamError(dst, err)
			r.recordFailure(dw, dst)
		}
		if sse {
			writeStreamError(w, CodeUpstreamError, msg)
		}
		panic(http.ErrAbortHandler) // the client never sees a clean end
	}
	now := r.clock()
	dst.lastProgress.Store(now.UnixNano())
	r.completions.add(now)
	return resp.StatusCode
}

// prefillLeg sends the prefill leg and reads its answer to the end. It
// returns a *legError when the leg failed (transport, status, or an error
// event in a stream), nil when it succeeded or was cancelled by the pair.
func (r *Router) prefillLeg(ctx context.Context, in *http.Request, pw *Worker, pst *workerState, body []byte) error {
	out, err := http.NewRequestWithContext(ctx, http.MethodPost, upstreamURL(pw.URL, in), bytes.NewReader(body))
	if err != nil {
		return &legError{"Prefill", pw.URL, err}
	}
	copyRequestHeaders(out.Header, in.Header, pw.APIKey)
	pst.dispatched.Add(1)
	resp, err := r.roundTrip(ctx, out)
	if err != nil {
		if ctx.Err() != nil {
			return nil // the pair ended first
		}
		r.recordUpstreamError(pst, err)
		r.recordFailure(pw, pst)
		return &legError{"Prefill", pw.URL, err}
	}
	defer resp.Body.Close()
	pst.answered(r.clock())
	if resp.StatusCode >= 400 {
		if resp.StatusCode >= 500 {
			r.metrics.upstream.WithLabelValues("status_5xx").Inc()
			r.recordFailure(pw, pst)
		}
		snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return &legError{"Prefill", pw.URL, fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(snippet))}
	}
	// A stream that fails after its start carries a data: {"error":…} event.
	br := bufio.NewReaderSize(resp.Body, 4096)
	for {
		line, err := br.ReadSlice('\n')
		if bytes.HasPrefix(line, []byte(`data: {"error"`)) {
			r.recordFailure(pw, pst)
			return &legError{"Prefill", pw.URL, fmt.Errorf("%s", bytes.TrimSpace(line[len("data: "):]))}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			r.recordUpstreamError(pst, err)
			r.recordFailure(pw, pst)
			return &legError{"Prefill", pw.URL, err}
		}
	}
	r.recordSuccess(pw, pst)
	pst.lastProgress.Store(r.clock().UnixNano())
	return nil
}
