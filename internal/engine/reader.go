package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/smg-project/smg/internal/netfail"
	"github.com/smg-project/smg/internal/readbudget"
)

// RequestTimeout bounds one Read (every HTTP request it makes) when the
// caller's context has no earlier deadline: the spec's "HTTP load requests
// time out after 5 seconds".
const RequestTimeout = 5 * time.Second

const (
	pathMetrics       = "/metrics"
	pathSGLangLoads   = "/v1/loads?include=core" // core fields only: a smaller answer to decode
	pathSGLangGetLoad = "/get_load"
	pathTGIInfo       = "/info"

	// OpenMetrics fed to the text parser mis-types counters: ask for text 0.0.4.
	acceptText = "text/plain; version=0.0.4"
	acceptJSON = "application/json"
)

// StatusError is an engine answering with a status other than 200 OK.
type StatusError struct {
	Path string
	Code int
}

func (e *StatusError) Error() string {
	return "GET " + e.Path + ": HTTP " + strconv.Itoa(e.Code)
}

// Option configures a Reader.
type Option func(*Reader)

// WithClock sets the clock used to turn counters into rates (default time.Now).
func WithClock(now func() time.Time) Option { return func(r *Reader) { r.now = now } }

// WithBudget makes every answer the Reader reads wait for, and hold while it
// is parsed, its share of the process's read budget (nil: none).
func WithBudget(b *readbudget.Budget) Option { return func(r *Reader) { r.budget = b } }

// WithAPIKey sends key as the bearer token of every request ("": none).
func WithAPIKey(key string) Option { return func(r *Reader) { r.apiKey = key } }

// Reader reads one worker's load. It detects the worker's wire on the first
// usable answer and remembers it; when the remembered wire stops giving a
// usable report (an error status, an undecodable or empty answer) it is
// forgotten and detection runs again. Transport failures and timeouts keep the
// remembered wire: the engine is unreachable or slow, not replaced.
// A Reader is safe for concurrent use.
type Reader struct {
	client *http.Client
	base   string
	now    func() time.Time
	budget *readbudget.Budget
	apiKey string

	mu        sync.Mutex
	source    Source
	tgiWindow int64 // TGI's /info max_concurrent_requests, read at detection

	// Counters of the previous report, for rates over the poll interval.
	prev       []rankSample
	prevAt     time.Time
	prevSource Source
}

// NewReader returns a Reader for the engine at baseURL (scheme, host and
// port, e.g. "http://10.0.0.7:8000"). A nil client uses a plain http.Client.
func NewReader(client *http.Client, baseURL string, opts ...Option) *Reader {
	if client == nil {
		client = &http.Client{}
	}
	r := &Reader{client: client, base: strings.TrimRight(baseURL, "/"), now: time.Now}
	for _, o := range opts {
		o(r)
	}
	return r
}

// Source is the remembered wire, or "" before detection succeeds.
func (r *Reader) Source() Source {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.source
}

// Read returns the engine's current load. Any error means "no report", and
// the Report is then empty; IsTransportFailure tells a dead connection apart.
func (r *Reader) Read(ctx context.Context) (Report, error) {
	if d, ok := ctx.Deadline(); !ok || time.Until(d) > RequestTimeout {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, RequestTimeout)
		defer cancel()
	}
	// The answers read and what is parsed from them are held until the
	// read is done: so is their share of the budget.
	lease := r.budget.Lease()
	defer lease.Release()
	ctx = context.WithValue(ctx, leaseKey{}, lease)
	r.mu.Lock()
	src, window := r.source, r.tgiWindow
	r.mu.Unlock()

	if src != "" {
		rep, err := r.readSource(ctx, src, window)
		if err == nil {
			return r.withRates(rep), nil
		}
		if stops(ctx, err) {
			return Report{}, err
		}
		r.mu.Lock()
		if r.source == src {
			r.source, r.tgiWindow = "", 0
		}
		r.mu.Unlock()
	}

	rep, window, err := r.detect(ctx)
	if err != nil {
		return Report{}, err
	}
	r.mu.Lock()
	r.source, r.tgiWindow = rep.Source, window
	r.mu.Unlock()
	return r.withRates(rep), nil
}

// stops reports whether err ends a Read at once: the connection failed, the
// deadline passed or the caller gave up. Asking other endpoints cannot help.
func stops(ctx context.Context, err error) bool {
	return ctx.Err() != nil || IsTransportFailure(err) || netfail.IsTimeout(err)
}

// readSource polls a remembered wire.
func (r *Reader) readSource(ctx context.Context, src Source, window int64) (Report, error) {
	switch src {
	case SourceSGLangLoads:
		body, err := r.get(ctx, pathSGLangLoads, acceptJSON)
		if err != nil {
			return Report{}, err
		}
		return ParseSGLangLoads(body)
	case SourceSGLangGetLoad:
		body, err := r.get(ctx, pathSGLangGetLoad, acceptJSON)
		if err != nil {
			return Report{}, err
		}
		return ParseSGLangGetLoad(body)
	}
	body, err := r.get(ctx, pathMetrics, acceptText)
	if err != nil {
		return Report{}, err
	}
	fs, err := parseFamilies(body)
	if err != nil {
		return Report{}, err
	}
	switch src {
	case SourceVLLM:
		return fromVLLM(fs)
	case SourceSGLangMetrics:
		return fromSGLangMetrics(fs)
	case SourceTokenSpeed:
		return fromTokenSpeed(fs)
	case SourceTRTLLM:
		return fromTRTLLM(fs)
	case SourceTGI:
		return fromTGI(fs, window)
	case SourceLlamaCpp:
		return fromLlamaCpp(fs)
	}
	return Report{}, fmt.Errorf("engine: unknown source %q", src)
}

// detect tries every wire in order: vLLM /metrics, SGLang /v1/loads, then
// /get_load, then the remaining /metrics wires. /metrics is fetched once and
// offered to every metrics parser.
func (r *Reader) detect(ctx context.Context) (Report, int64, error) {
	var why []string
	var causes []error
	note := func(err error) {
		var nr *noReportError
		if errors.As(err, &nr) {
			why = append(why, nr.why)
		} else {
			why = append(why, err.Error())
			causes = append(causes, err)
		}
	}

	var fs families
	body, err := r.get(ctx, pathMetrics, acceptText)
	if err == nil {
		fs, err = parseFamilies(body)
	}
	if err != nil {
		if stops(ctx, err) {
			return Report{}, 0, err
		}
		note(err)
	}
	if fs != nil {
		rep, err := fromVLLM(fs)
		if err == nil {
			return rep, 0, nil
		}
		note(err)
	}

	for _, ep := range []struct {
		path  string
		parse func([]byte) (Report, error)
	}{
		{pathSGLangLoads, ParseSGLangLoads},
		{pathSGLangGetLoad, ParseSGLangGetLoad},
	} {
		body, err := r.get(ctx, ep.path, acceptJSON)
		if err == nil {
			var rep Report
			if rep, err = ep.parse(body); err == nil {
				return rep, 0, nil
			}
		}
		if stops(ctx, err) {
			return Report{}, 0, err
		}
		note(err)
	}

	if fs != nil {
		for _, from := range []func(families) (Report, error){fromSGLangMetrics, fromTokenSpeed, fromTRTLLM} {
			rep, err := from(fs)
			if err == nil {
				return rep, 0, nil
			}
			note(err)
		}
		var window int64
		if fs.hasPrefix("tgi_") {
			var err error
			if window, err = r.tgiInfo(ctx); err != nil {
				if stops(ctx, err) {
					return Report{}, 0, err
				}
				note(err) // no window, still a report
			}
		}
		rep, err := fromTGI(fs, window)
		if err == nil {
			return rep, window, nil
		}
		note(err)
		if rep, err = fromLlamaCpp(fs); err == nil {
			return rep, 0, nil
		}
		note(err)
	}
	return Report{}, 0, &noReportError{why: strings.Join(why, "; "), causes: causes}
}

func (r *Reader) tgiInfo(ctx context.Context) (int64, error) {
	body, err := r.get(ctx, pathTGIInfo, acceptJSON)
	if err != nil {
		return 0, err
	}
	return parseTGIInfo(body)
}

// get fetches one path and returns the body of a 200 answer.
func (r *Reader) get(ctx context.Context, path, accept string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.base+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", accept)
	if r.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+r.apiKey)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		// Drain a little so the connection can be reused.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
		return nil, &StatusError{Path: path, Code: resp.StatusCode}
	}
	tooLarge := &ParseError{Wire: path, Err: fmt.Errorf("answer larger than %d bytes", maxBody)}
	n := resp.ContentLength
	if n > maxBody {
		return nil, tooLarge
	}
	if n < 0 {
		n = readbudget.Small
	}
	lease, _ := ctx.Value(leaseKey{}).(*readbudget.Lease)
	if err := lease.Reserve(ctx, n); err != nil {
		return nil, err
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, n+1))
	if err == nil && int64(len(body)) > n {
		// Longer than charged (no length was given): charged for the
		// largest answer before reading on.
		if err = lease.Reserve(ctx, maxBody-n); err != nil {
			return nil, err
		}
		var rest []byte
		rest, err = io.ReadAll(io.LimitReader(resp.Body, maxBody+1-int64(len(body))))
		body = append(body, rest...)
	}
	if err != nil {
		return nil, fmt.Errorf("GET %s: read body: %w", path, err)
	}
	if len(body) > maxBody {
		return nil, tooLarge
	}
	return body, nil
}

// leaseKey carries a Read's budget lease to the requests it makes.
type leaseKey struct{}

// withRates turns cumulative counters into rates over the interval since the
// previous report from the same wire, for wires that export no rate gauge.
// A counter that went backwards (an engine restart) gives no rate this time.
func (r *Reader) withRates(rep Report) Report {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	dt := now.Sub(r.prevAt).Seconds()
	usable := r.prevSource == rep.Source && !r.prevAt.IsZero() && dt > 0
	for i := range rep.Ranks {
		rk := &rep.Ranks[i]
		c, p := sampleOf(rep.counters, rk.DPRank), sampleOf(r.prev, rk.DPRank)
		if !usable || c == nil || p == nil {
			continue
		}
		if c.hasGen && p.hasGen && c.genTokens >= p.genTokens {
			rk.GenThroughput = rate((c.genTokens - p.genTokens) / dt)
		}
		if c.hasHitRate && p.hasHitRate {
			dq, dh := c.queries-p.queries, c.hits-p.hits
			if dq > 0 && dh >= 0 {
				rk.CacheHitRate = fraction(dh / dq)
			}
		}
	}
	r.prev = append(r.prev[:0], rep.counters...)
	r.prevAt, r.prevSource = now, rep.Source
	return rep
}

func sampleOf(samples []rankSample, dp int) *rankCounters {
	for i := range samples {
		if samples[i].dp == dp {
			return &samples[i].c
		}
	}
	return nil
}

// IsTransportFailure reports whether err is a connection-level failure
// (netfail.Connection: refused, reset, cut short, host or network unreachable
// or down, a name that did not resolve). An engine that answered, with an
// error status, garbage or no load, is not gone, whatever its body's reading
// ended with.
func IsTransportFailure(err error) bool {
	var se *StatusError
	var pe *ParseError
	if errors.As(err, &se) || errors.As(err, &pe) || errors.Is(err, ErrNoReport) {
		return false
	}
	return netfail.IsConnection(err)
}
