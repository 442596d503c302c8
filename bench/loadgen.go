package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ShedCode is the X-SMG-Error-Code of a request refused by overload shedding.
const ShedCode = "worker_overload_protection_shed"

// Config describes one load run.
type Config struct {
	URL string // base URL of the OpenAI-compatible server
	// URLs, when set, spread requests over several servers (routers), as a
	// client-side load balancer in front of them would: in turn, or by Spread.
	URLs []string
	// Spread is how requests are spread over URLs: SpreadRoundRobin (the
	// default) or SpreadLeastOutstanding.
	Spread string
	// ShedFailover sends a request shed by one router (503
	// worker_overload_protection_shed: nothing reached an engine) to the next
	// router at once, each router once, as a load balancer retrying 503 on
	// another upstream does (nginx proxy_next_upstream http_503, Envoy
	// retry_on 503 with previous_hosts). TTFT still runs from the first send.
	ShedFailover bool
	Model        string        // model field of each request
	Rate         float64       // mean arrivals per second (Poisson); ignored when Clients > 0
	Clients      int           // > 0: closed loop with this many clients instead of open-loop arrivals
	Duration     time.Duration // how long requests keep arriving
	Prompt       Dist          // prompt tokens per request
	Output       Dist          // max_tokens per request
	Timeout      time.Duration // end-to-end bound on one request, retries included
	// HonorRetryAfter makes a client that gets 503 or 429 with Retry-After wait
	// that long and try again (up to MaxRetries times) within its Timeout.
	HonorRetryAfter bool
	MaxRetries      int
	TTFTObjective   time.Duration // goodput counts requests whose TTFT is at most this
	Seed            uint64        // arrivals, prompt and output lengths
	// Priorities, when set, gives each arrival a class drawn by weight: its
	// x-smg-priority header and its API key (the tenant the router clamps by).
	Priorities []PriorityShare
}

// PriorityShare is one class of a priority mix.
type PriorityShare struct {
	Class  string  `json:"class"`   // x-smg-priority value
	Weight float64 `json:"weight"`  // relative share of arrivals
	APIKey string  `json:"api_key"` // bearer token naming the tenant ("" none)
	// Label names the share in records and per-share summaries (Class when
	// empty): two tenants sending the same class are told apart by it.
	Label string `json:"label,omitempty"`
}

// label is what records and summaries call the share.
func (p *PriorityShare) label() string {
	if p.Label != "" {
		return p.Label
	}
	return p.Class
}

// pick draws a class by weight.
func pickPriority(r *rand.Rand, mix []PriorityShare) *PriorityShare {
	if len(mix) == 0 {
		return nil
	}
	var total float64
	for _, p := range mix {
		total += p.Weight
	}
	x := r.Float64() * total
	for i := range mix {
		if x -= mix[i].Weight; x < 0 {
			return &mix[i]
		}
	}
	return &mix[len(mix)-1]
}

// refusalCodes are the router's explicit refusals a client may retry later:
// the overload shed and the admission and scheduler answers.
var refusalCodes = map[string]bool{ShedCode: true, "admission_queue_full": true, "admission_queue_timeout": true,
	"scheduler_queue_full": true, "scheduler_queue_timeout": true, "scheduler_preempted": true,
	"ttft_objective_unreachable": true, "tenant_over_fair_share": true}

// Record is what one request did. Times are seconds from the start of the run.
type Record struct {
	Start      float64   `json:"start"`
	Status     int       `json:"status"`               // last HTTP status, 0 when none came
	ErrorCode  string    `json:"error_code,omitempty"` // X-SMG-Error-Code of the last answer
	Error      string    `json:"error,omitempty"`      // why the request did not complete
	Shed       bool      `json:"shed,omitempty"`       // the final answer was an overload shed
	Attempts   int       `json:"attempts"`
	RetryAfter int       `json:"retry_after,omitempty"` // Retry-After of the last refusal, seconds
	Engine     string    `json:"engine,omitempty"`      // engine index from the simulator's response id
	Priority   string    `json:"priority,omitempty"`    // the share's label, by default the x-smg-priority sent (priority mixes only)
	TTFT       float64   `json:"ttft,omitempty"`        // first token, from Start
	E2E        float64   `json:"e2e"`                   // from Start to the end (or the failure)
	ITL        []float64 `json:"itl,omitempty"`         // gaps between token chunks, seconds
	Tokens     int       `json:"tokens"`                // output tokens received
	MaxTokens  int       `json:"max_tokens"`
	Completed  bool      `json:"completed"` // streamed to [DONE] with a finish reason
}

// Progress is a live view of a run.
type Progress struct {
	Elapsed                    time.Duration
	Sent, InFlight, Completed  int64
	Shed, Errors, OutputTokens int64
}

// Result is a finished run.
type Result struct {
	Config  ConfigJSON `json:"config"`
	Wall    float64    `json:"wall_seconds"` // until the last request ended
	Records []Record   `json:"records"`
	Summary Summary    `json:"summary"`
	// ByClass summarises each class of a priority mix apart.
	ByClass  map[string]Summary `json:"by_class,omitempty"`
	Scenario string             `json:"scenario,omitempty"`
}

// ConfigJSON is Config as written into results.
type ConfigJSON struct {
	URL             string  `json:"url"`
	Rate            float64 `json:"rate"`
	Clients         int     `json:"clients,omitempty"`
	DurationSeconds float64 `json:"duration_seconds"`
	Prompt          string  `json:"prompt_tokens"`
	Output          string  `json:"output_tokens"`
	TimeoutSeconds  float64 `json:"timeout_seconds"`
	HonorRetryAfter bool    `json:"honor_retry_after"`
	TTFTObjective   float64 `json:"ttft_objective_seconds"`
	Seed            uint64  `json:"seed"`
}

func (c Config) json() ConfigJSON {
	return ConfigJSON{URL: c.URL, Rate: c.Rate, Clients: c.Clients, DurationSeconds: c.Duration.Seconds(),
		Prompt: c.Prompt.String(), Output: c.Output.String(), TimeoutSeconds: c.Timeout.Seconds(),
		HonorRetryAfter: c.HonorRetryAfter, TTFTObjective: c.TTFTObjective.Seconds(), Seed: c.Seed}
}

func (c Config) validate() error {
	switch {
	case c.URL == "":
		return errors.New("no URL")
	case c.Clients <= 0 && c.Rate <= 0:
		return errors.New("rate must be > 0 (or clients > 0)")
	case c.Duration <= 0 || c.Timeout <= 0:
		return errors.New("duration and timeout must be > 0")
	case c.Prompt.Min < 1 || c.Output.Min < 1:
		return errors.New("prompt and output lengths must be >= 1")
	}
	return validSpread(c.Spread)
}

// NewHTTPClient returns a client for many concurrent streams to one host.
func NewHTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 4096,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}}
}

// Run offers load as c describes until c.Duration has passed, waits for the
// requests still running (each is bounded by c.Timeout) and returns every
// record. onProgress, when set, is called about once a second.
func Run(ctx context.Context, client *http.Client, c Config, onProgress func(Progress)) (*Result, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	if c.Model == "" {
		c.Model = "sim-model"
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x5eed))
	var (
		mu      sync.Mutex
		records []Record
		wg      sync.WaitGroup
		live    liveCounters
	)
	start := time.Now()
	lb := newSpreader(c.URLs, c.Spread)
	issue := func(prompt string, maxTokens int, prio *PriorityShare) {
		rec := doRequest(ctx, client, c, start, prompt, maxTokens, prio, &live, lb)
		live.finish(rec)
		mu.Lock()
		records = append(records, rec)
		mu.Unlock()
	}
	stopProgress := make(chan struct{})
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-stopProgress:
				return
			case <-t.C:
				if onProgress != nil {
					onProgress(live.snapshot(time.Since(start)))
				}
			}
		}
	}()

	end := start.Add(c.Duration)
	if c.Clients > 0 {
		for i := range c.Clients {
			r := rand.New(rand.NewPCG(c.Seed, uint64(i)+1))
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(end) && ctx.Err() == nil {
					issue(makePrompt(r, c.Prompt.Sample(r)), c.Output.Sample(r), pickPriority(r, c.Priorities))
				}
			}()
		}
	} else {
		next := start
		for ctx.Err() == nil {
			next = next.Add(time.Duration(rng.ExpFloat64() / c.Rate * float64(time.Second)))
			if next.After(end) {
				break
			}
			prompt, maxTokens := makePrompt(rng, c.Prompt.Sample(rng)), c.Output.Sample(rng)
			prio := pickPriority(rng, c.Priorities)
			if d := time.Until(next); d > 0 {
				select {
				case <-time.After(d):
				case <-ctx.Done():
				}
			}
			// Arrivals keep their schedule whatever the server does: a slow
			// server must not slow the offered load.
			wg.Add(1)
			go func() { defer wg.Done(); issue(prompt, maxTokens, prio) }()
		}
	}
	wg.Wait()
	close(stopProgress)
	<-progressDone
	wall := time.Since(start)
	if onProgress != nil {
		onProgress(live.snapshot(wall))
	}
	res := &Result{Config: c.json(), Wall: wall.Seconds(), Records: records}
	res.Summary = Summarize(records, c.Duration, c.TTFTObjective)
	if len(c.Priorities) > 0 {
		res.ByClass = map[string]Summary{}
		for _, p := range c.Priorities {
			var mine []Record
			for _, r := range records {
				if r.Priority == p.label() {
					mine = append(mine, r)
				}
			}
			res.ByClass[p.label()] = Summarize(mine, c.Duration, c.TTFTObjective)
		}
	}
	if c.Clients > 0 {
		res.Summary.OfferedRate = 0
	}
	return res, ctx.Err()
}

type liveCounters struct {
	sent, inFlight, completed, shed, errors, tokens atomic.Int64
}

func (l *liveCounters) finish(r Record) {
	l.inFlight.Add(-1)
	switch {
	case r.Completed:
		l.completed.Add(1)
	case r.Shed:
		l.shed.Add(1)
	default:
		l.errors.Add(1)
	}
}

func (l *liveCounters) snapshot(elapsed time.Duration) Progress {
	return Progress{Elapsed: elapsed, Sent: l.sent.Load(), InFlight: l.inFlight.Load(), Completed: l.completed.Load(),
		Shed: l.shed.Load(), Errors: l.errors.Load(), OutputTokens: l.tokens.Load()}
}

type chatRequest struct {
	Model         string        `json:"model"`
	Messages      []chatMessage `json:"messages"`
	MaxTokens     int           `json:"max_tokens"`
	Stream        bool          `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// doRequest sends one streaming chat completion, retrying refusals when the
// config honours Retry-After, and records what happened.
func doRequest(ctx context.Context, client *http.Client, c Config, runStart time.Time, prompt string, maxTokens int,
	prio *PriorityShare, live *liveCounters, lb *spreader) Record {
	url := c.URL
	live.sent.Add(1)
	first, done := lb.pick()
	defer done()
	if first >= 0 {
		url = c.URLs[first]
	}
	hops := 0 // routers tried after the first (ShedFailover)
	live.inFlight.Add(1)
	t0 := time.Now()
	rec := Record{Start: t0.Sub(runStart).Seconds(), MaxTokens: maxTokens}
	var header http.Header
	if prio != nil {
		rec.Priority = prio.label()
		header = http.Header{"X-Smg-Priority": {prio.Class}}
		if prio.APIKey != "" {
			header.Set("Authorization", "Bearer "+prio.APIKey)
		}
	}
	ctx, cancel := context.WithDeadline(ctx, t0.Add(c.Timeout))
	defer cancel()
	body := chatRequest{Model: c.Model, Messages: []chatMessage{{Role: "user", Content: prompt}}, MaxTokens: maxTokens, Stream: true}
	body.StreamOptions.IncludeUsage = true
	payload, _ := json.Marshal(body)
	for {
		rec.Attempts++
		retryAfter, err := attempt(ctx, client, url, payload, header, t0, &rec, live)
		rec.E2E = time.Since(t0).Seconds()
		if err == nil {
			return rec
		}
		rec.Error = err.Error()
		if ctx.Err() != nil {
			rec.Error = "timeout"
			return rec
		}
		if c.ShedFailover && first >= 0 && rec.ErrorCode == ShedCode && hops+1 < len(c.URLs) {
			hops++
			url = c.URLs[(first+hops)%len(c.URLs)]
			continue
		}
		if !c.HonorRetryAfter || retryAfter < 0 || rec.Attempts-hops > c.MaxRetries {
			return rec
		}
		select {
		case <-time.After(time.Duration(retryAfter) * time.Second):
		case <-ctx.Done():
			rec.E2E = time.Since(t0).Seconds()
			return rec // the last answer (a shed, say) stands
		}
	}
}

// errRefused marks an answer that Retry-After may turn into another try.
var errRefused = errors.New("refused")

// attempt makes one HTTP call. It returns the Retry-After of a retryable
// refusal (-1 when there is none) and an error when the request did not complete.
func attempt(ctx context.Context, client *http.Client, url string, payload []byte, header http.Header, t0 time.Time,
	rec *Record, live *liveCounters) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(url, "/")+"/v1/chat/completions", bytes.NewReader(payload))
	if err != nil {
		return -1, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		rec.Status = 0
		return -1, fmt.Errorf("transport: %s", rootCause(err))
	}
	defer resp.Body.Close()
	rec.Status = resp.StatusCode
	rec.ErrorCode = resp.Header.Get("X-SMG-Error-Code")
	rec.Shed = refusalCodes[rec.ErrorCode]
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		ra := -1
		if v, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && v >= 0 {
			ra = v
			rec.RetryAfter = v
		}
		if resp.StatusCode != http.StatusServiceUnavailable && resp.StatusCode != http.StatusTooManyRequests &&
			resp.StatusCode != http.StatusRequestTimeout {
			ra = -1
		}
		if rec.Shed {
			return ra, fmt.Errorf("%w: shed", errRefused)
		}
		return ra, fmt.Errorf("http %d %s", resp.StatusCode, rec.ErrorCode)
	}
	return -1, readStream(resp.Body, t0, rec, live)
}

// chunk is the part of a streamed chat completion chunk the bench reads.
type chunk struct {
	ID      string `json:"id"`
	Choices []struct {
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// readStream consumes an SSE stream, timing each chunk that carries text.
func readStream(body io.Reader, t0 time.Time, rec *Record, live *liveCounters) error {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var last time.Time
	finished, usage := false, -1
	for sc.Scan() {
		line := sc.Bytes()
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue
		}
		data = bytes.TrimSpace(data)
		if string(data) == "[DONE]" {
			if !finished {
				return errors.New("stream ended without a finish reason")
			}
			if usage >= 0 {
				rec.Tokens = usage
			}
			rec.Completed = true
			return nil
		}
		now := time.Now()
		var ch chunk
		if err := json.Unmarshal(data, &ch); err != nil {
			return fmt.Errorf("bad chunk: %v", err)
		}
		if len(ch.Error) > 0 {
			return fmt.Errorf("stream error: %s", truncate(string(ch.Error), 120))
		}
		if rec.Engine == "" && ch.ID != "" {
			rec.Engine = engineOf(ch.ID)
		}
		if ch.Usage != nil {
			usage = ch.Usage.CompletionTokens
		}
		for _, c := range ch.Choices {
			if c.Delta.Content != "" || c.Text != "" {
				if last.IsZero() {
					rec.TTFT = now.Sub(t0).Seconds()
				} else {
					rec.ITL = append(rec.ITL, now.Sub(last).Seconds())
				}
				last = now
				rec.Tokens++
				live.tokens.Add(1)
			}
			if c.FinishReason != nil {
				finished = true
			}
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("stream cut: %s", rootCause(err))
	}
	return errors.New("stream cut before [DONE]")
}

// engineOf reads the engine index out of a simulator response id
// ("chatcmpl-<engine>-<n>"); other servers' ids give "".
func engineOf(id string) string {
	parts := strings.Split(id, "-")
	if len(parts) != 3 {
		return ""
	}
	if _, err := strconv.Atoi(parts[1]); err != nil {
		return ""
	}
	return parts[1]
}

func rootCause(err error) string {
	for {
		u := errors.Unwrap(err)
		if u == nil {
			return truncate(err.Error(), 120)
		}
		err = u
	}
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
