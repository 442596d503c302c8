package openaigrpc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/smg-project/smg/internal/enginegrpc"
	"github.com/smg-project/smg/internal/jsonstr"
	"github.com/smg-project/smg/internal/tokenizer"
)

// Call is one OpenAI request served over Generate: one generation per
// prompt and choice (n), each its own engine request.
type Call struct {
	c       *enginegrpc.Client
	tok     *tokenizer.Tokenizer
	req     *Request
	model   string
	id      string
	created int64
	gens    []*gen
	msgs    chan msg
	cancel  context.CancelFunc
	unhook  func() bool // stops the close that the caller's context ending runs
	closed  sync.Once
	pending []msg
	live    int // generations that have not ended
	head    []byte
}

type gen struct {
	id       string // the engine request's id
	index    int    // the choice
	first    bool   // the first choice of its prompt: its prompt counts in usage
	cancel   context.CancelFunc
	dec      *tokenizer.StreamDecoder
	stop     stopper
	received int      // tokens received in chunks
	text     []byte   // a non-streamed answer's text, or /generate's text so far
	ids      []uint32 // /generate: the output ids so far
	sentIDs  int      // /generate: the ids already in an event
	matched  string   // the stop string that ended the choice
	finish   string
	ended    bool        // the answer of this choice is complete
	done     atomic.Bool // the engine finished it or was told to drop it (no abort needed)
	roleSent bool
	prompt   uint32
	complete uint32
	// lps are the logprobs of tokens whose text has not been sent yet
	// (every token's, for a non-streamed answer); offset is a completion's
	// text offset of the next token.
	lps    []lpToken
	offset int
}

type msg struct {
	g   int
	u   Update
	err error
}

// newID is a fresh random request id with prefix.
func newID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// Start sends every generation of req (its prompts, n choices each) to the
// engine behind c. model is the name the answer carries. Close ends it.
func Start(ctx context.Context, c *enginegrpc.Client, m *Model, req *Request, prompts [][]uint32, model string) *Call {
	prefix := "cmpl-"
	if req.Chat {
		prefix = "chatcmpl-"
	}
	// The streams do not end with the caller's context: when it ends (the
	// client left, a deadline, a preemption) the engine is told to Abort
	// first, then the streams are cancelled.
	gctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	call := &Call{c: c, tok: m.Tok, req: req, model: model, id: newID(prefix), created: time.Now().Unix(), cancel: cancel}
	n := req.n()
	call.msgs = make(chan msg, len(prompts)*n)
	sp := req.Sampling()
	// Every generation is in call.gens before any runs: run reads the slice.
	call.gens = make([]*gen, len(prompts)*n)
	ctxs := make([]context.Context, len(call.gens))
	for i := range call.gens {
		g := &gen{id: call.id, index: i, first: i%n == 0, dec: m.Tok.NewStreamDecoder(sp.SkipSpecial), stop: stopper{stops: sp.Stop}}
		if len(call.gens) > 1 {
			g.id += "-" + strconv.Itoa(i)
		}
		ctxs[i], g.cancel = context.WithCancel(gctx)
		call.gens[i] = g
	}
	for i := range call.gens {
		gsp := sp
		if i < len(req.Bootstraps) {
			gsp.Bootstrap = &req.Bootstraps[i]
		}
		go call.run(ctxs[i], i, prompts[i/n], gsp)
	}
	call.live = len(call.gens)
	call.unhook = context.AfterFunc(ctx, call.Close)
	return call
}

// ID is the answer's id (chatcmpl-... or cmpl-...).
func (c *Call) ID() string { return c.id }

// run reads one generation's stream into c.msgs until its completion, an
// error, or the call's end.
func (c *Call) run(ctx context.Context, i int, ids []uint32, sp Sampling) {
	send := func(m msg) bool {
		select {
		case c.msgs <- m:
			return true
		case <-ctx.Done():
			return false
		}
	}
	st, err := Generate(ctx, c.c, c.gens[i].id, ids, sp, c.req.Stream)
	if err != nil {
		send(msg{g: i, err: err})
		return
	}
	for {
		u, err := st.Recv()
		if err == io.EOF {
			err = errNoComplete
		}
		if err != nil {
			send(msg{g: i, err: err})
			return
		}
		if !send(msg{g: i, u: u}) || u.Complete {
			return
		}
	}
}

// errNoComplete: the engine ended a stream without its completion.
var errNoComplete = errors.New("the engine ended the Generate stream without a completion")

// next is the next message, pending ones first.
func (c *Call) next(ctx context.Context) (msg, error) {
	if len(c.pending) > 0 {
		m := c.pending[0]
		c.pending = c.pending[1:]
		return m, nil
	}
	select {
	case m := <-c.msgs:
		return m, nil
	case <-ctx.Done():
		return msg{}, ctx.Err()
	}
}

// Wait blocks until the answer can start: the first update of any
// generation when streaming, every completion otherwise. An error here
// reached the client with nothing: the caller may retry elsewhere.
func (c *Call) Wait(ctx context.Context) error {
	ended := 0
	for {
		m, err := c.next(ctx)
		if err != nil {
			return err
		}
		if m.err != nil {
			return Classify(m.err)
		}
		c.pending = append(c.pending, m)
		if m.u.Complete {
			ended++
		}
		if c.req.Stream || ended == len(c.gens) {
			// Replay from the start of what was read.
			return nil
		}
	}
}

// Close ends every generation still running: it aborts them on the engine
// (an Abort call, as a client that went away needs) and cancels their
// streams.
func (c *Call) Close() {
	c.closed.Do(func() {
		c.unhook()
		var ids []string
		for _, g := range c.gens {
			if !g.done.Swap(true) {
				ids = append(ids, g.id)
			}
		}
		if len(ids) > 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = Abort(ctx, c.c, "the client went away or the answer ended", ids...)
			cancel()
		}
		c.cancel()
	})
}

// Progress hears of each batch of tokens that reached the client.
type Progress func(tokens int)

// Serve writes the whole answer: headers, then the SSE events or the JSON
// body. An error is the engine failing mid-answer (the stream is written
// up to it); the caller ends the client's stream with it.
func (c *Call) Serve(ctx context.Context, w http.ResponseWriter, progress Progress) error {
	if c.req.Stream {
		return c.serveStream(ctx, w, progress)
	}
	for c.live > 0 {
		m, err := c.next(ctx)
		if err != nil {
			return err
		}
		if m.err != nil {
			return Classify(m.err)
		}
		if _, err := c.apply(m, nil); err != nil {
			return err
		}
	}
	progress(c.completion())
	var body []byte
	if c.req.Native {
		body = c.finalNative()
	} else {
		body = c.final()
	}
	return writeJSON(w, body)
}

// writeJSON writes a 200 answer of body.
func writeJSON(w http.ResponseWriter, body []byte) error {
	h := w.Header()
	h["Content-Type"] = []string{"application/json"}
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	w.WriteHeader(http.StatusOK)
	_, err := w.Write(body)
	return err
}

func (c *Call) serveStream(ctx context.Context, w http.ResponseWriter, progress Progress) error {
	h := w.Header()
	h["Content-Type"] = []string{"text/event-stream"}
	h["Cache-Control"] = []string{"no-cache"}
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	buf := make([]byte, 0, 4096)
	for c.live > 0 {
		m, err := c.next(ctx)
		if err != nil {
			return err
		}
		if m.err != nil {
			return Classify(m.err)
		}
		if buf, err = c.apply(m, buf); err != nil {
			return err
		}
		if c.live == 0 {
			if c.req.IncludeUsage() && !c.req.Native {
				buf = append(buf, "data: "...)
				buf = append(buf, c.chunkHead()...)
				buf = append(buf, `,"choices":[],`...)
				buf = c.appendUsage(buf)
				buf = append(buf, "}\n\n"...)
			}
			buf = append(buf, "data: [DONE]\n\n"...)
		}
		if len(buf) > 0 {
			if _, err := w.Write(buf); err != nil {
				return err
			}
			if flusher != nil {
				flusher.Flush()
			}
			buf = buf[:0]
		}
		progress(len(m.u.Tokens))
	}
	return nil
}

// apply runs one update through its choice: detokenized token by token,
// stop strings cut, and (streaming) appended to buf as SSE events.
func (c *Call) apply(m msg, buf []byte) ([]byte, error) {
	buf, err := c.applyTokens(m, buf)
	if g := c.gens[m.g]; err == nil && c.req.Native && c.req.Stream && !g.ended && len(g.ids) > g.sentIDs {
		buf = c.appendNativeEvent(buf, g, false) // /generate: one event per token batch
	}
	return buf, err
}

func (c *Call) applyTokens(m msg, buf []byte) ([]byte, error) {
	g := c.gens[m.g]
	if g.ended {
		return buf, nil // tokens after a stop string this side matched
	}
	u := m.u
	tokens := u.Tokens
	if u.Complete && g.received > 0 {
		// A completion lists every output id or only those not streamed.
		if len(tokens) > g.received {
			tokens = tokens[g.received:]
		} else {
			tokens = nil
		}
	}
	if !u.Complete {
		g.received += len(tokens)
	}
	var lps []TokenLogprob
	if c.req.WantsLogprobs() {
		var err error
		if lps, err = logprobsFor(u, tokens); err != nil {
			return buf, err
		}
	}
	g.prompt, g.complete = u.Prompt, u.Completion
	if c.req.Stream && c.req.Chat && !g.roleSent {
		buf = c.appendEvent(buf, g, roleDelta, "")
		g.roleSent = true
	}
	for i, id := range tokens {
		text, err := g.dec.Next(id)
		if err != nil {
			return buf, engineSent(err)
		}
		if lps != nil {
			t, err := newLPToken(c.tok, id, lps[i])
			if err != nil {
				return buf, err
			}
			g.lps = append(g.lps, t)
		}
		if c.req.Native {
			g.ids = append(g.ids, id)
		}
		out, stopped := g.stop.feed(text)
		buf = c.emit(buf, g, out)
		if stopped {
			g.finish, g.matched = "stop", g.stop.matched
			return c.end(buf, g), nil
		}
	}
	if !u.Complete {
		return buf, nil
	}
	g.done.Store(true)
	out, stopped := g.stop.feed(g.dec.Flush())
	buf = c.emit(buf, g, out)
	if stopped {
		g.finish, g.matched = "stop", g.stop.matched
	} else {
		buf = c.emit(buf, g, g.stop.rest())
		g.finish = u.Finish
	}
	return c.end(buf, g), nil
}

// end closes a choice: its finish chunk when streaming. A choice this side
// stopped is aborted on the engine.
func (c *Call) end(buf []byte, g *gen) []byte {
	g.ended = true
	c.live--
	if !g.done.Swap(true) {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = Abort(ctx, c.c, "stop string matched", g.id)
			g.cancel()
		}()
	}
	switch {
	case c.req.Stream && c.req.Native:
		buf = c.appendNativeEvent(buf, g, true)
	case c.req.Stream:
		buf = c.appendEvent(buf, g, finishDelta, "")
	}
	return buf
}

// emit adds text to the choice: an SSE event when streaming.
func (c *Call) emit(buf []byte, g *gen, text string) []byte {
	if text == "" {
		return buf
	}
	if !c.req.Stream || c.req.Native {
		g.text = append(g.text, text...)
		return buf
	}
	return c.appendEvent(buf, g, contentDelta, text)
}

func (c *Call) completion() int {
	n := 0
	for _, g := range c.gens {
		n += int(g.complete)
	}
	return n
}

func (c *Call) appendUsage(b []byte) []byte {
	prompt, completion := 0, 0
	for _, g := range c.gens {
		if g.first {
			prompt += int(g.prompt)
		}
		completion += int(g.complete)
	}
	b = append(b, `"usage":{"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(prompt), 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, int64(completion), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(prompt+completion), 10)
	return append(b, '}')
}

// object is the answer's object type.
func (c *Call) object() string {
	if c.req.Chat {
		return "chat.completion"
	}
	return "text_completion"
}

// chunkHead is every chunk's opening: id, object, created and model.
func (c *Call) chunkHead() []byte {
	if c.head == nil {
		obj := c.object()
		if c.req.Chat {
			obj += ".chunk"
		}
		c.head = c.appendHead(nil, obj)
	}
	return c.head
}

func (c *Call) appendHead(b []byte, object string) []byte {
	b = append(b, `{"id":`...)
	b = jsonstr.Append(b, c.id)
	b = append(b, `,"object":"`...)
	b = append(b, object...)
	b = append(b, `","created":`...)
	b = strconv.AppendInt(b, c.created, 10)
	b = append(b, `,"model":`...)
	return jsonstr.Append(b, c.model)
}

type delta uint8

const (
	roleDelta delta = iota
	contentDelta
	finishDelta
)

// appendEvent appends one SSE chunk of choice g.
func (c *Call) appendEvent(b []byte, g *gen, kind delta, text string) []byte {
	b = append(b, "data: "...)
	b = append(b, c.chunkHead()...)
	b = append(b, `,"choices":[{"index":`...)
	b = strconv.AppendInt(b, int64(g.index), 10)
	switch {
	case kind == roleDelta:
		b = append(b, `,"delta":{"role":"assistant","content":""}`...)
	case c.req.Chat:
		b = append(b, `,"delta":{"content":`...)
		b = jsonstr.Append(b, text)
		b = append(b, '}')
	default:
		b = append(b, `,"text":`...)
		b = jsonstr.Append(b, text)
	}
	// A token's logprobs go with the event that carries its text, or with
	// the finish when its text never came.
	b = append(b, `,"logprobs":`...)
	if kind != roleDelta && len(g.lps) > 0 {
		b = c.appendLogprobs(b, g)
		g.lps = g.lps[:0]
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"finish_reason":`...)
	if kind == finishDelta {
		b = jsonstr.Append(b, g.finish)
	} else {
		b = append(b, "null"...)
	}
	return append(b, "}]}\n\n"...)
}

// appendLogprobs writes the logprobs object of g's tokens in g.lps.
func (c *Call) appendLogprobs(b []byte, g *gen) []byte {
	if c.req.Chat {
		return appendChatLogprobs(b, g.lps)
	}
	b, g.offset = appendCompletionLogprobs(b, g.lps, g.offset)
	return b
}

// final is a non-streamed answer.
func (c *Call) final() []byte {
	b := c.appendHead(make([]byte, 0, 256), c.object())
	b = append(b, `,"choices":[`...)
	for i, g := range c.gens {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"index":`...)
		b = strconv.AppendInt(b, int64(g.index), 10)
		if c.req.Chat {
			b = append(b, `,"message":{"role":"assistant","content":`...)
			b = jsonstr.Append(b, string(g.text))
			b = append(b, '}')
		} else {
			b = append(b, `,"text":`...)
			b = jsonstr.Append(b, string(g.text))
		}
		b = append(b, `,"logprobs":`...)
		if c.req.WantsLogprobs() {
			b = c.appendLogprobs(b, g)
		} else {
			b = append(b, "null"...)
		}
		b = append(b, `,"finish_reason":`...)
		b = jsonstr.Append(b, g.finish)
		b = append(b, '}')
	}
	b = append(b, `],`...)
	b = c.appendUsage(b)
	return append(b, '}')
}
