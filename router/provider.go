package router

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/smg-project/smg/internal/secretref"
)

// Provider is how an external worker, an OpenAI-compatible provider, is
// reached. Its URL is the provider's base URL and the local model,
// base#model (the control plane's canonical form); the request path's
// leading /v1 is replaced by the base URL, as OpenAI clients do.
type Provider struct {
	Model   string      // the provider's model name: the request's model is rewritten to it, and back
	KeyRef  string      // where the key is (env:NAME or file:/path); resolved by this router when used
	Headers [][2]string // extra headers, sorted by name
	Timeout time.Duration
	// SpillRequestsPerSec and SpillTokensPerSec are the fleet's spill-over
	// budget on this worker (0: no limit); the router holds its part
	// (Worker.WindowShare, in millionths).
	SpillRequestsPerSec, SpillTokensPerSec float64
}

// Defaults and bounds of the provider path.
const (
	DefaultProviderTimeout = 60 * time.Second
	// keyRecheck is how long a resolved key is used before its reference is
	// read again (a rotated key file takes effect within it).
	keyRecheck = 10 * time.Second
	// maxProviderHold bounds a provider's Retry-After: a hostile or broken
	// value must not take the worker out for a day.
	maxProviderHold = 5 * time.Minute
	// maxRewrittenBody bounds a non-streaming answer read whole to rewrite
	// its model field; a larger one passes as it is.
	maxRewrittenBody = 32 << 20
)

// providers is the router's client to external workers: net/http's
// transport (HTTP/2, the environment's proxy, the system's roots), not
// the engines' lean HTTP/1.1 client, and the keys resolved from their
// references.
type providers struct {
	transport *http.Transport
	now       func() time.Time
	log       interface {
		Warn(msg string, args ...any)
	}

	mu   sync.Mutex
	keys map[string]resolvedKey

	throttled *prometheus.CounterVec // worker
	keyErrors *prometheus.CounterVec // worker
}

type resolvedKey struct {
	key string
	err error
	at  time.Time
}

func newProviders(r *Router, dialer *net.Dialer, reg prometheus.Registerer) (*providers, error) {
	p := &providers{
		transport: &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           dialer.DialContext,
			ForceAttemptHTTP2:     true,
			MaxIdleConnsPerHost:   max(r.opts.MaxIdleConnsPerWorker, 2),
			IdleConnTimeout:       90 * time.Second,
			TLSHandshakeTimeout:   10 * time.Second,
			ExpectContinueTimeout: time.Second,
		},
		now:  r.clock,
		log:  r.log,
		keys: map[string]resolvedKey{},
		throttled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "smg_router_provider_throttled_total",
			Help: "Answers 429 from external workers (providers); each holds the worker out of routing until its Retry-After.",
		}, []string{"worker"}),
		keyErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "smg_router_provider_key_errors_total",
			Help: "Requests not sent to an external worker because its API key reference could not be read (the router's log names it).",
		}, []string{"worker"}),
	}
	for _, c := range []prometheus.Collector{p.throttled, p.keyErrors} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// key resolves ref, reading it again once keyRecheck has passed.
func (p *providers) key(ref string) (string, error) {
	now := p.now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if k, ok := p.keys[ref]; ok && now.Sub(k.at) < keyRecheck && now.Sub(k.at) >= 0 {
		return k.key, k.err
	}
	key, err := secretref.Resolve(ref)
	p.keys[ref] = resolvedKey{key: key, err: err, at: now}
	return key, err
}

// errProviderKey: the key could not be read; the router's log says why.
var errProviderKey = errors.New("its API key is not available on this router")

// baseOf is the provider's base URL of an external worker's URL.
func baseOf(workerURL string) string {
	base, _, _ := strings.Cut(workerURL, "#")
	return strings.TrimSuffix(base, "/")
}

// providerHeadersForwarded are the client's headers a provider gets; the
// rest (its credentials, cookies, addresses, smg's own headers) stay here.
var providerHeadersForwarded = []string{"Accept", "Accept-Language", "User-Agent", "Idempotency-Key", "Openai-Beta"}

// providerRequest builds the request for external worker wk: the path on the
// provider's base URL, the model rewritten to the provider's name, the key
// resolved from its reference, the spec's headers.
func (r *Router) providerRequest(in *http.Request, wk *Worker, body []byte) (*http.Request, error) {
	pv := wk.Provider
	u, err := url.Parse(baseOf(wk.URL) + strings.TrimPrefix(in.URL.Path, "/v1"))
	if err != nil {
		return nil, err
	}
	u.RawQuery = in.URL.RawQuery
	body = withModel(body, pv.Model)
	out := &http.Request{Method: http.MethodPost, URL: u, Host: u.Host, Header: make(http.Header, 8),
		Body: newRewindBody(body), ContentLength: int64(len(body))}
	out.GetBody = func() (io.ReadCloser, error) { return newRewindBody(body), nil }
	for _, h := range providerHeadersForwarded {
		if v := in.Header.Values(h); len(v) > 0 {
			out.Header[h] = v
		}
	}
	out.Header.Set("Content-Type", "application/json")
	for _, h := range pv.Headers {
		out.Header.Set(h[0], h[1])
	}
	if pv.KeyRef != "" {
		key, err := r.providers.key(pv.KeyRef)
		if err != nil {
			r.providers.keyErrors.WithLabelValues(wk.URL).Inc()
			r.log.Error("External worker's API key cannot be read", "worker_id", wk.ID, "url", wk.URL, "reason", err.Error())
			return nil, errProviderKey
		}
		out.Header.Set("Authorization", "Bearer "+key)
	}
	return out, nil
}

// upstreamRequest is the request of one attempt on wk: an engine gets the
// client's request on its URL (its api_key as the bearer token), a
// provider the request providerRequest builds.
func (r *Router) upstreamRequest(in *http.Request, wk *Worker, st *workerState, body []byte) (*http.Request, error) {
	if wk.Provider != nil {
		return r.providerRequest(in, wk, body)
	}
	u, err := st.upstreamURL(wk.URL, in)
	if err != nil {
		return nil, err
	}
	// Built as the client's upstream writes it: the context goes to the
	// round trip, the body is read again by a retry on a fresh connection.
	// The request, its URL and its body are one allocation.
	o := &outRequest{u: u}
	o.body.b = body
	o.body.rewind()
	o.req = http.Request{Method: http.MethodPost, URL: &o.u, Host: u.Host, Header: make(http.Header, len(in.Header)+2),
		Body: &o.body, ContentLength: int64(len(body))}
	copyRequestHeaders(o.req.Header, in.Header, wk.APIKey)
	return &o.req, nil
}

// outRequest is an engine's request with what it points to.
type outRequest struct {
	req  http.Request
	u    url.URL
	body rewindBody
}

// roundTripTo sends one attempt to wk. A provider's answer must start
// within its timeout; a 429 holds the worker out of routing until its
// Retry-After; a refused key becomes this router's 502 (the provider's
// own answer may echo part of the key); the answer's model is rewritten
// back to the local name.
func (r *Router) roundTripTo(ctx context.Context, wk *Worker, st *workerState, out *http.Request, deadline time.Time, hook cancelHook) (*http.Response, error) {
	pv := wk.Provider
	if pv == nil {
		return r.roundTripHooked(ctx, out, deadline, hook)
	}
	timeout := pv.Timeout
	if timeout <= 0 {
		timeout = DefaultProviderTimeout
	}
	ctx, cancel := context.WithCancelCause(ctx)
	silent := time.AfterFunc(timeout, func() { cancel(errProviderSilent) })
	resp, err := r.providers.transport.RoundTrip(out.WithContext(ctx))
	silent.Stop()
	if err != nil {
		if context.Cause(ctx) == errProviderSilent {
			err = fmt.Errorf("the provider's answer did not start within %s: %w", timeout, context.DeadlineExceeded)
		}
		cancel(nil)
		return nil, &url.Error{Op: "Post", URL: wk.URL, Err: err}
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: func() { cancel(nil) }}
	for _, h := range providerHeadersDropped {
		resp.Header.Del(h)
	}
	switch resp.StatusCode {
	case http.StatusTooManyRequests:
		hold := providerRetryAfter(resp.Header, r.clock())
		st.breaker.hold(r.now() + int64(hold))
		r.providers.throttled.WithLabelValues(wk.URL).Inc()
		if resp.Header.Get("Retry-After") == "" {
			resp.Header.Set("Retry-After", strconv.Itoa(int((hold+time.Second-1)/time.Second)))
		}
	case http.StatusUnauthorized, http.StatusForbidden:
		resp.Body.Close()
		return nil, &url.Error{Op: "Post", URL: wk.URL, Err: fmt.Errorf("the provider refused this router's credentials (status %d)", resp.StatusCode)}
	}
	rewriteModel(resp, wk.Model)
	return resp, nil
}

// retryable reports whether an answer is one to try elsewhere: the spec's
// retryable statuses, but never a provider's 429 (the worker is held until
// its Retry-After; the client gets the answer, so a throttled provider is
// not retried into a storm).
func retryable(wk *Worker, code int) bool {
	return retryableStatus(code) && (wk.Provider == nil || code != http.StatusTooManyRequests)
}

var errProviderSilent = errors.New("provider silent past its timeout")

// providerHeadersDropped are a provider's answer headers a client does not
// get: cookies and the operator's account.
var providerHeadersDropped = []string{"Set-Cookie", "Openai-Organization", "Openai-Project"}

// providerRetryAfter is how long a 429 holds the worker: its Retry-After
// (seconds or a date), 1 s when absent or unreadable, at most maxProviderHold.
func providerRetryAfter(h http.Header, now time.Time) time.Duration {
	d := time.Second
	v := strings.TrimSpace(h.Get("Retry-After"))
	if secs, err := strconv.ParseFloat(v, 64); err == nil && secs > 0 {
		d = time.Duration(min(secs, maxProviderHold.Seconds()) * float64(time.Second))
	} else if t, err := http.ParseTime(v); err == nil && t.After(now) {
		d = t.Sub(now)
	}
	return min(max(d, time.Second), maxProviderHold)
}

type cancelOnClose struct {
	io.ReadCloser
	cancel func()
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

// rewriteModel rewrites the top-level model field of a provider's answer
// to the local name: every event of a stream as it passes, a JSON answer
// whole.
func rewriteModel(resp *http.Response, local string) {
	ct := resp.Header.Get("Content-Type")
	switch {
	case strings.HasPrefix(ct, "text/event-stream"):
		resp.Body = &sseModelRewriter{src: resp.Body, local: local}
	case strings.Contains(ct, "json") && resp.ContentLength <= maxRewrittenBody:
		b, err := io.ReadAll(io.LimitReader(resp.Body, maxRewrittenBody+1))
		if err != nil || len(b) > maxRewrittenBody {
			resp.Body = readCloser{io.MultiReader(bytes.NewReader(b), &errReader{err}), resp.Body}
			return
		}
		b = replaceModel(b, local)
		resp.Body = readCloser{bytes.NewReader(b), resp.Body}
		resp.ContentLength = int64(len(b))
		resp.Header.Set("Content-Length", strconv.Itoa(len(b)))
	}
}

type readCloser struct {
	io.Reader
	io.Closer
}

type errReader struct{ err error }

func (e *errReader) Read([]byte) (int, error) {
	if e.err == nil {
		return 0, io.EOF
	}
	return 0, e.err
}

// sseModelRewriter passes a server-sent event stream line by line, each
// "data: {...}" line with its model rewritten; a line is passed on as soon
// as it is complete, so the stream keeps its pace.
type sseModelRewriter struct {
	src     io.ReadCloser
	local   string
	buf     []byte // bytes read, not yet split into lines
	out     []byte // rewritten bytes not yet returned
	readBuf []byte
	err     error
}

// maxSSELine bounds a line held back for rewriting; a longer one passes as
// it comes.
const maxSSELine = 4 << 20

func (s *sseModelRewriter) Read(p []byte) (int, error) {
	for len(s.out) == 0 {
		if s.err != nil {
			if len(s.buf) > 0 { // a last line without its newline
				s.out, s.buf = rewriteSSELine(s.buf, s.local), nil
				break
			}
			return 0, s.err
		}
		if s.readBuf == nil {
			s.readBuf = make([]byte, 32<<10)
		}
		n, err := s.src.Read(s.readBuf)
		s.buf = append(s.buf, s.readBuf[:n]...)
		s.err = err
		start := 0
		for {
			i := bytes.IndexByte(s.buf[start:], '\n')
			if i < 0 {
				break
			}
			s.out = append(s.out, rewriteSSELine(s.buf[start:start+i+1], s.local)...)
			start += i + 1
		}
		if len(s.buf)-start > maxSSELine {
			s.out, start = append(s.out, s.buf[start:]...), len(s.buf)
		}
		s.buf = append(s.buf[:0], s.buf[start:]...)
	}
	n := copy(p, s.out)
	s.out = s.out[n:]
	if len(s.out) == 0 {
		s.out = nil
	}
	return n, nil
}

func (s *sseModelRewriter) Close() error { return s.src.Close() }

// rewriteSSELine rewrites the model of a "data:" line holding a JSON object.
func rewriteSSELine(line []byte, local string) []byte {
	rest, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok {
		return line
	}
	payload := bytes.TrimSpace(rest)
	if len(payload) == 0 || payload[0] != '{' {
		return line
	}
	at := len(line) - len(rest) + bytes.Index(rest, payload)
	rewritten := replaceModel(payload, local)
	if &rewritten[0] == &payload[0] && len(rewritten) == len(payload) {
		return line
	}
	out := make([]byte, 0, len(line)+len(local))
	out = append(out, line[:at]...)
	out = append(out, rewritten...)
	return append(out, line[at+len(payload):]...)
}

// replaceModel returns obj with the value of its top-level "model" key
// replaced by name, or obj itself when it is not a JSON object or has no
// such key (or one the quick walk cannot take: an escaped key).
func replaceModel(obj []byte, name string) []byte {
	start, end, ok := modelSpan(obj)
	if !ok || start < 0 {
		return obj
	}
	q, _ := json.Marshal(name)
	out := make([]byte, 0, len(obj)-(end-start)+len(q))
	out = append(out, obj[:start]...)
	out = append(out, q...)
	return append(out, obj[end:]...)
}

// withModel is a request body (a valid JSON object) with its model set to
// name: replaced, or added first when absent.
func withModel(body []byte, name string) []byte {
	start, _, ok := modelSpan(body)
	if !ok {
		return body
	}
	if start >= 0 {
		return replaceModel(body, name)
	}
	i := skipSpace(body, 0) + 1 // past '{'
	q, _ := json.Marshal(name)
	out := make([]byte, 0, len(body)+len(q)+10)
	out = append(out, body[:i]...)
	out = append(out, `"model":`...)
	out = append(out, q...)
	if j := skipSpace(body, i); j < len(body) && body[j] != '}' {
		out = append(out, ',')
	}
	return append(out, body[i:]...)
}

// modelSpan finds the value of the top-level "model" key of a JSON object:
// its bytes [start, end), start -1 when absent; ok false when obj is not a
// valid object or a key has escapes.
func modelSpan(obj []byte) (start, end int, ok bool) {
	start, end = -1, -1
	ok = walkTop(obj, func(key []byte, s, e int) bool {
		if string(key) == "model" {
			start, end = s, e
			return true
		}
		return false
	})
	return start, end, ok
}

// walkTop calls fn with each top-level key of a JSON object and the span
// of its value, until fn returns true; false when obj is not a valid
// object or a key has escapes (the quick walk does not unescape).
func walkTop(obj []byte, fn func(key []byte, start, end int) bool) bool {
	if !json.Valid(obj) {
		return false
	}
	i := skipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return false
	}
	i = skipSpace(obj, i+1)
	if obj[i] == '}' {
		return true
	}
	for {
		kend := stringEnd(obj, i)
		if kend < 0 {
			return false
		}
		key := obj[i+1 : kend-1]
		i = skipSpace(obj, kend)
		i = skipSpace(obj, i+1) // the colon
		vend := valueEnd(obj, i)
		if fn(key, i, vend) {
			return true
		}
		i = skipSpace(obj, vend)
		if obj[i] == '}' {
			return true
		}
		i = skipSpace(obj, i+1) // the comma
	}
}
