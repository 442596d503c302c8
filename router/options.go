package router

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/smg-project/smg/internal/tlsutil"
)

// Policy names accepted by --policy.
const (
	PolicyCacheAware        = "cache_aware"
	PolicyRoundRobin        = "round_robin"
	PolicyRandom            = "random"
	PolicyPowerOfTwo        = "power_of_two"
	PolicyLeastLoad         = "least_load"
	PolicyConsistentHashing = "consistent_hashing"
	PolicyPrefixHash        = "prefix_hash"
	PolicyManual            = "manual"
)

// Retry-After modes (--retry-after-mode).
const (
	RetryAfterInterval  = "interval"
	RetryAfterEstimated = "estimated"
)

// Policies lists every accepted policy name.
var Policies = []string{PolicyCacheAware, PolicyRoundRobin, PolicyRandom, PolicyPowerOfTwo,
	PolicyLeastLoad, PolicyConsistentHashing, PolicyPrefixHash, PolicyManual}

// Options configures a Router. Field defaults come from DefaultOptions.
type Options struct {
	Policy string

	// WorkerOverloadShed rejects a request whose every candidate is overloaded
	// with 503 worker_overload_protection_shed instead of steering it.
	WorkerOverloadShed bool
	// LoadMonitorInterval (seconds) is the shed answer's Retry-After.
	LoadMonitorInterval int
	// WorkerStaleSecs bounds how long the watch client keeps the control
	// plane's vetoes once its stream is down (then it calls FailOpen). 0: never drop.
	WorkerStaleSecs int

	// PDDisaggregation routes each request over a (prefill, decode) pair.
	PDDisaggregation bool
	// PDAdmissionWaitSecs is how long a PD request waits for a room in a
	// full decode window before it is shed (0: shed as soon as full).
	PDAdmissionWaitSecs int
	// PDWindowMode: PDWindowShared (gate within the control plane's share)
	// or PDWindowPerRouter (count against the whole window alone).
	PDWindowMode string

	// WorkerAdmissionWindow gates every worker with a known running window:
	// a worker is chosen only with room in this router's share, and a
	// request that finds every eligible worker full waits for a room.
	WorkerAdmissionWindow bool
	// WorkerAdmissionWaitSecs bounds that wait in seconds, fractions allowed
	// (0: shed at once).
	WorkerAdmissionWaitSecs float64
	// WorkerAdmissionWindowMode: PDWindowShared or PDWindowPerRouter, as for
	// decode windows.
	WorkerAdmissionWindowMode string
	// WorkerTokenBudget gates every regular worker with a known token budget
	// (its KV capacity in tokens) on the tokens its requests hold: prompt
	// plus expected output, within this router's share; a request whose
	// tokens fit no worker waits as for a room, one larger than every
	// worker's whole budget is a 400.
	WorkerTokenBudget bool
	// WorkerTokenBudgetOutputTokens is the output a request is expected to
	// produce when it names no max_tokens (max_completion_tokens,
	// sampling_params.max_new_tokens).
	WorkerTokenBudgetOutputTokens int
	// PeerRouters are the base URLs of the other routers sharing the
	// control plane's windows, comma-separated: a request that finds no
	// room in this router's shares borrows a free room from one of them
	// before it is shed, and only they may borrow this router's (empty:
	// neither).
	PeerRouters string
	// TTFTObjectiveSecs is the TTFT objective of every class the scheduler
	// YAML gives none (0: off; docs/admission.md).
	TTFTObjectiveSecs float64

	// SpillOver sends a request whose every local candidate is vetoed or
	// full to an external worker of its model, within the worker's spill
	// budget (spill.go); external workers are then used for nothing else.
	// Off: external workers are ordinary candidates.
	SpillOver bool

	DisableCircuitBreaker    bool
	CBFailureThreshold       int
	CBSuccessThreshold       int
	CBTimeoutDurationSecs    int
	DisableRetries           bool
	RetryMaxRetries          int
	RetryInitialBackoffMs    int
	RetryMaxBackoffMs        int
	RetryBackoffMultiplier   float64
	RetryJitterFactor        float64
	MaxConcurrentRequests    int     // -1: no admission limit
	RateLimitTokensPerSecond float64 // token bucket refill; -1 (unset): MaxConcurrentRequests per second; 0: none
	QueueSize                int
	QueueTimeoutSecs         int

	// The priority scheduler (SMG's contract; router/admission). When it
	// cannot start (bad YAML, reservations over a static capacity) the router
	// logs an ERROR and keeps the rate limiting path.
	PrioritySchedulerEnabled          bool
	PrioritySchedulerDefaultMaxClass  string // parsed like the header: unknown -> default
	PrioritySchedulerConfig           string // YAML path, optional
	PrioritySchedulerTenantMetricTopN int

	// LeastLoadWaitingCap: inside least_load, skip a worker whose reported
	// waiting plus this router's dispatches since that report reaches it (0: off).
	LeastLoadWaitingCap int64
	// LeastLoadPrefillFirst: least_load ranks workers by the prompt tokens
	// waiting for prefill on them first, by load on a tie.
	LeastLoadPrefillFirst bool
	// RetryAfterMode: RetryAfterInterval (the spec's --load-monitor-interval)
	// or RetryAfterEstimated (when a retry would be admitted, from the
	// observed completion rate and the queue ahead, within [1, interval]).
	RetryAfterMode             string
	MaxPayloadSize             int64  // bytes
	BodyReadTimeoutSecs        int    // a request body must arrive within this
	IdleTimeoutSecs            int    // idle keep-alive client connections close after this
	MaxConnections             int    // client connections open at once; more wait in the backlog
	MaxConnectionsPerClient    int    // connections open at once from one client address (0: no per-client cap)
	HTTPServer                 string // what serves a plaintext port: HTTPServerLean or HTTPServerNet
	RequestTimeoutSecs         int
	CacheThreshold             float64 // cache_aware: prefix match ratio that keeps affinity
	BalanceAbsThreshold        int64   // cache_aware: load spread that switches to least load ...
	BalanceRelThreshold        float64 // ... when max load also exceeds min load times this
	DispatchKeyHeader          string  // header carrying the sticky routing key
	PrefixHashLoadFactor       float64 // prefix_hash: skip a ring worker loaded above mean times this
	BalanceTokenUsageThreshold float64 // cache_aware: mean KV usage of the cached worker at which affinity is dropped
	UpstreamDialTimeout        time.Duration
	// EngineTLS verifies https:// engines (nil: Go's defaults, the system's
	// roots). Set by the command from --engine-ca-file and friends.
	EngineTLS                *tlsutil.ClientOptions
	MaxIdleConnsPerWorker    int
	PromptBytesPerTokenGuess int // estimate of prompt tokens in flight from body bytes
	// TokenizerPath (--tokenizer-path) serves every gRPC worker with this
	// tokenizer and chat template instead of the worker's own (GetTokenizer).
	TokenizerPath string
	// Now is the clock of every part of the router, its scheduler and token
	// bucket included (nil: time.Now); tests inject one.
	Now func() time.Time
}

// DefaultOptions returns the spec's defaults.
func DefaultOptions() Options {
	return Options{
		Policy:                            PolicyCacheAware,
		LoadMonitorInterval:               10,
		WorkerStaleSecs:                   15,
		PDAdmissionWaitSecs:               30,
		PDWindowMode:                      PDWindowShared,
		WorkerAdmissionWaitSecs:           30,
		WorkerAdmissionWindowMode:         PDWindowShared,
		CBFailureThreshold:                10,
		CBSuccessThreshold:                3,
		CBTimeoutDurationSecs:             60,
		RetryMaxRetries:                   5,
		RetryInitialBackoffMs:             50,
		RetryMaxBackoffMs:                 30000,
		RetryBackoffMultiplier:            1.5,
		RetryJitterFactor:                 0.2,
		MaxConcurrentRequests:             -1,
		RateLimitTokensPerSecond:          -1,
		PrioritySchedulerDefaultMaxClass:  "default",
		PrioritySchedulerTenantMetricTopN: 32,
		RetryAfterMode:                    RetryAfterInterval,
		QueueSize:                         100,
		QueueTimeoutSecs:                  60,
		MaxPayloadSize:                    512 << 20,
		BodyReadTimeoutSecs:               30,
		IdleTimeoutSecs:                   60,
		MaxConnections:                    4096,
		MaxConnectionsPerClient:           1024,
		HTTPServer:                        HTTPServerLean,
		RequestTimeoutSecs:                1800,
		CacheThreshold:                    0.3,
		BalanceAbsThreshold:               64,
		BalanceRelThreshold:               1.5,
		DispatchKeyHeader:                 "x-smg-routing-key",
		PrefixHashLoadFactor:              1.25,
		BalanceTokenUsageThreshold:        0.95,
		UpstreamDialTimeout:               5 * time.Second,
		MaxIdleConnsPerWorker:             256,
		PromptBytesPerTokenGuess:          4,
		WorkerTokenBudgetOutputTokens:     DefaultOutputTokens,
	}
}

// AddFlags registers the router's flags on fs, bound to o. A flag that another
// component already defined on fs (smg launch shares --load-monitor-interval
// and --worker-stale-secs with the control plane) is not redefined: its value
// is fed to both owners.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	str := func(p *string, name, usage string) { define(fs, (*stringValue)(p), name, usage) }
	boolean := func(p *bool, name, usage string) { define(fs, (*boolValue)(p), name, usage) }
	integer := func(p *int, name, usage string) { define(fs, (*intValue)(p), name, usage) }
	float := func(p *float64, name, usage string) { define(fs, (*floatValue)(p), name, usage) }

	str(&o.Policy, "policy", "routing policy: "+strings.Join(Policies, ", "))
	boolean(&o.WorkerOverloadShed, "worker-overload-shed",
		"reject with 503 worker_overload_protection_shed when every candidate is overloaded, instead of steering to the least loaded")
	integer(&o.LoadMonitorInterval, "load-monitor-interval",
		"load monitor interval in seconds; also the Retry-After of a shed answer (must be > 0); a router uses its control plane's value once connected, this one before")
	integer(&o.WorkerStaleSecs, "worker-stale-secs",
		"seconds without the control plane after which the router drops its vetoes and routes on (0 keeps them); a router uses its control plane's value once connected, this one before")
	boolean(&o.PDDisaggregation, "pd-disaggregation",
		"route each request over a prefill/decode pair (workers of type prefill and decode) with SGLang's bootstrap fields")
	integer(&o.PDAdmissionWaitSecs, "pd-admission-wait-secs",
		"seconds a PD request waits for room in a full decode running window before 503 worker_overload_protection_shed (0 sheds at once)")
	str(&o.PDWindowMode, "pd-window-mode",
		"how a decode window is counted: shared (within the share the control plane grants this router, bounded fleet-wide) or per-router (each router counts the whole window alone)")
	boolean(&o.WorkerAdmissionWindow, "worker-admission-window",
		"gate every worker on its running window (within this router's share): choose only workers with room; with none, wait for a room up to --worker-admission-wait-secs (off: as the spec)")
	float(&o.WorkerAdmissionWaitSecs, "worker-admission-wait-secs",
		"seconds (a `float`: fractions allowed, e.g. 0.05) a request waits for room in its pool's running windows before 503 worker_overload_protection_shed (0 sheds at once); under a TTFT objective it bounds the objective's wait too (0: refused at once with ttft_objective_unreachable)")
	str(&o.WorkerAdmissionWindowMode, "worker-admission-window-mode",
		"how a worker's running window is counted: shared (within the share the control plane grants this router) or per-router (each router counts the whole window alone)")
	boolean(&o.WorkerTokenBudget, "worker-token-budget",
		"gate every worker with a known token budget (its KV capacity in tokens, split into per-router shares by the control plane) on the tokens its requests hold, prompt plus expected output: a request whose tokens fit no worker waits as for a room, one larger than every worker's budget is a 400 context_length_exceeded (off: as the spec)")
	integer(&o.WorkerTokenBudgetOutputTokens, "worker-token-budget-output-tokens",
		"output tokens expected of a request that names no max_tokens (nor max_completion_tokens, sampling_params.max_new_tokens) under --worker-token-budget")
	boolean(&o.SpillOver, "spill-over",
		"send a request whose every local candidate is vetoed or has no room to an external worker (provider) of its model, within the provider's spill budget, instead of steering, waiting or shedding; external workers then serve spill-over only (off: they are ordinary candidates)")
	str(&o.PeerRouters, "peer-routers",
		"comma-separated base URLs of the other routers that share this control plane's windows: a request that finds no room in this router's shares (--worker-admission-window) borrows a room free now from one of them (POST /smg/lend) before it is shed, and only they may borrow this router's rooms (empty: neither)")
	boolean(&o.DisableCircuitBreaker, "disable-circuit-breaker", "turn off the per-worker circuit breaker")
	integer(&o.CBFailureThreshold, "cb-failure-threshold", "consecutive failures that open a worker's circuit breaker")
	integer(&o.CBSuccessThreshold, "cb-success-threshold", "consecutive successes in half-open that close the breaker")
	integer(&o.CBTimeoutDurationSecs, "cb-timeout-duration-secs", "seconds an open breaker waits before letting a request through (half-open), unless the worker's next load report comes first")
	boolean(&o.DisableRetries, "disable-retries", "never retry a failed upstream attempt")
	integer(&o.RetryMaxRetries, "retry-max-retries", "retries after the first attempt, only before the first byte reaches the client")
	integer(&o.RetryInitialBackoffMs, "retry-initial-backoff-ms", "backoff before the first retry, in milliseconds")
	integer(&o.RetryMaxBackoffMs, "retry-max-backoff-ms", "upper bound of the retry backoff, in milliseconds")
	float(&o.RetryBackoffMultiplier, "retry-backoff-multiplier", "growth of the backoff between retries")
	float(&o.RetryJitterFactor, "retry-jitter-factor", "random spread of each backoff, as a fraction (0 to 1)")
	integer(&o.MaxConcurrentRequests, "max-concurrent-requests", "requests proxied at once; more wait in the admission queue (-1: no limit)")
	float(&o.RateLimitTokensPerSecond, "rate-limit-tokens-per-second",
		"token bucket refill rate: admissions per second sustained, bursting up to --max-concurrent-requests (-1: refill at --max-concurrent-requests per second; 0: concurrency limit only)")
	boolean(&o.PrioritySchedulerEnabled, "priority-scheduler-enabled",
		"admit through the priority scheduler (x-smg-priority classes, per-class queues, reservations, preemption) instead of the rate limiting path")
	str(&o.PrioritySchedulerDefaultMaxClass, "priority-scheduler-default-max-class",
		"highest class a tenant without a policy may use: system, interactive, default or bulk (parsed like the header)")
	str(&o.PrioritySchedulerConfig, "priority-scheduler-config",
		"YAML file with per-class settings (classes), tenant ceilings and weights (tenant_policies), fair shares (fair_share), api_keys and tenant header trust; see docs/admission.md")
	integer(&o.PrioritySchedulerTenantMetricTopN, "priority-scheduler-tenant-metric-top-n",
		"tenants labelled by name in scheduler metrics; later ones are labelled \"other\"")
	define(fs, (*int64Value)(&o.LeastLoadWaitingCap), "least-load-waiting-cap",
		"least_load: skip a worker whose reported waiting requests plus this router's dispatches since that report reach this cap (0: off)")
	boolean(&o.LeastLoadPrefillFirst, "least-load-prefill-first",
		"least_load: rank workers first by the prompt tokens waiting for prefill on them (this router's in flight, plus the other routers' as the control plane last sent them), then by load")
	float(&o.TTFTObjectiveSecs, "ttft-objective-secs",
		"time to first token objective in `seconds` (fractions allowed, e.g. 0.5) of every priority class without ttft_objective_secs in the scheduler YAML: a request goes only to a worker predicted to meet it, waits (at most --worker-admission-wait-secs) only while one would once it has a room and a room is expected in time, else is refused at once with 503 ttft_objective_unreachable (0: off)")
	str(&o.RetryAfterMode, "retry-after-mode",
		"Retry-After of shed and queue answers: interval (the load monitor interval) or estimated (from the observed completion rate and the queue ahead, within [1, interval])")
	integer(&o.QueueSize, "queue-size", "requests that may wait for admission; beyond it the answer is 429 admission_queue_full")
	integer(&o.QueueTimeoutSecs, "queue-timeout-secs", "seconds a request may wait for admission before 503 admission_queue_timeout")
	define(fs, (*int64Value)(&o.MaxPayloadSize), "max-payload-size", "largest request body accepted, in bytes (larger: 413)")
	integer(&o.BodyReadTimeoutSecs, "body-read-timeout-secs",
		"seconds a request body may take to arrive in full; a slower body is cut with 408 request_body_timeout")
	integer(&o.IdleTimeoutSecs, "idle-timeout-secs",
		"seconds a client connection may stay silent, before its first request or between keep-alive requests, before the router closes it")
	integer(&o.MaxConnections, "max-connections",
		"client connections the router holds open at once; at the cap a new client takes the place of the oldest idle keep-alive connection, and waits in the listen backlog only while every connection is busy")
	integer(&o.MaxConnectionsPerClient, "max-connections-per-client",
		"client connections open at once from one client (an IPv4 address, an IPv6 /64); past it the client's oldest idle connection is closed, or the new one when none is idle (0: no per-client cap; raise it behind a proxy or NAT that funnels many users through one address)")
	str(&o.HTTPServer, "http-server",
		"what serves the router's plaintext HTTP port: lean (its own HTTP/1.1 server, cheaper per request) or net/http (Go's, which also speaks HTTP/2 over TLS); a TLS port is always served by net/http")
	integer(&o.RequestTimeoutSecs, "request-timeout-secs", "upper bound on one proxied request, in seconds")
	float(&o.CacheThreshold, "cache-threshold", "cache_aware: prefix match ratio (0 to 1) that keeps a request on its cached worker")
	define(fs, (*int64Value)(&o.BalanceAbsThreshold), "balance-abs-threshold",
		"cache_aware: load spread (max - min) above which affinity gives way to least load")
	float(&o.BalanceRelThreshold, "balance-rel-threshold", "cache_aware: ... when the max load also exceeds the min load times this")
	float(&o.BalanceTokenUsageThreshold, "balance-token-usage-threshold",
		"cache_aware: mean KV token usage (0 to 1] of the worker holding a prompt's prefix at or above which that prompt's affinity is dropped for least load; nothing is refused")
	str(&o.TokenizerPath, "tokenizer-path",
		"gRPC workers: tokenize and render chat templates with this tokenizer (a folder with tokenizer.json and tokenizer_config.json, a tokenizer.json, or a zip of them) instead of each worker's own (GetTokenizer)")
}

// Validate rejects option values the router cannot run with.
func (o Options) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	known := false
	for _, p := range Policies {
		known = known || p == o.Policy
	}
	if !known {
		bad("--policy %q: must be one of %s", o.Policy, strings.Join(Policies, ", "))
	}
	if o.LoadMonitorInterval <= 0 {
		bad("--load-monitor-interval must be greater than 0, got %d", o.LoadMonitorInterval)
	}
	if o.WorkerStaleSecs < 0 {
		bad("--worker-stale-secs must be >= 0, got %d", o.WorkerStaleSecs)
	}
	if o.PDAdmissionWaitSecs < 0 {
		bad("--pd-admission-wait-secs must be >= 0, got %d", o.PDAdmissionWaitSecs)
	}
	if o.PDWindowMode != PDWindowShared && o.PDWindowMode != PDWindowPerRouter {
		bad("--pd-window-mode %q: must be %s or %s", o.PDWindowMode, PDWindowShared, PDWindowPerRouter)
	}
	const maxWaitSecs = 86400 // a day: far past any request timeout, and no Duration overflow (NaN fails too)
	if !(o.WorkerAdmissionWaitSecs >= 0 && o.WorkerAdmissionWaitSecs <= maxWaitSecs) {
		bad("--worker-admission-wait-secs must be within [0, %d], got %v", maxWaitSecs, o.WorkerAdmissionWaitSecs)
	}
	if o.WorkerAdmissionWindowMode != PDWindowShared && o.WorkerAdmissionWindowMode != PDWindowPerRouter {
		bad("--worker-admission-window-mode %q: must be %s or %s", o.WorkerAdmissionWindowMode, PDWindowShared, PDWindowPerRouter)
	}
	if o.WorkerTokenBudgetOutputTokens < 1 || o.WorkerTokenBudgetOutputTokens > maxRequestTokens {
		bad("--worker-token-budget-output-tokens must be within [1, %d], got %d", maxRequestTokens, o.WorkerTokenBudgetOutputTokens)
	}
	if _, err := parsePeers(o.PeerRouters); err != nil {
		bad("--peer-routers: %v", err)
	}
	if o.CBFailureThreshold < 1 || o.CBSuccessThreshold < 1 || o.CBTimeoutDurationSecs < 1 {
		bad("--cb-failure-threshold, --cb-success-threshold and --cb-timeout-duration-secs must be >= 1")
	}
	if o.RetryMaxRetries < 0 || o.RetryInitialBackoffMs < 0 || o.RetryMaxBackoffMs < o.RetryInitialBackoffMs {
		bad("--retry-max-retries and --retry-initial-backoff-ms must be >= 0 and --retry-max-backoff-ms >= the initial backoff")
	}
	if o.RetryBackoffMultiplier < 1 {
		bad("--retry-backoff-multiplier must be >= 1, got %v", o.RetryBackoffMultiplier)
	}
	if o.RetryJitterFactor < 0 || o.RetryJitterFactor > 1 {
		bad("--retry-jitter-factor must be within [0, 1], got %v", o.RetryJitterFactor)
	}
	if o.MaxConcurrentRequests == 0 || o.MaxConcurrentRequests < -1 {
		bad("--max-concurrent-requests must be -1 (no limit) or >= 1, got %d", o.MaxConcurrentRequests)
	}
	if !(o.RateLimitTokensPerSecond >= 0) && o.RateLimitTokensPerSecond != -1 {
		bad("--rate-limit-tokens-per-second must be -1 (unset) or >= 0, got %v", o.RateLimitTokensPerSecond)
	}
	if o.PrioritySchedulerTenantMetricTopN < 0 {
		bad("--priority-scheduler-tenant-metric-top-n must be >= 0, got %d", o.PrioritySchedulerTenantMetricTopN)
	}
	if o.LeastLoadWaitingCap < 0 {
		bad("--least-load-waiting-cap must be >= 0 (0: off), got %d", o.LeastLoadWaitingCap)
	}
	if o.RetryAfterMode != RetryAfterInterval && o.RetryAfterMode != RetryAfterEstimated {
		bad("--retry-after-mode %q: must be %s or %s", o.RetryAfterMode, RetryAfterInterval, RetryAfterEstimated)
	}
	if o.QueueSize < 0 || o.QueueTimeoutSecs < 1 {
		bad("--queue-size must be >= 0 and --queue-timeout-secs >= 1")
	}
	if o.MaxPayloadSize < 1 || o.RequestTimeoutSecs < 1 {
		bad("--max-payload-size and --request-timeout-secs must be >= 1")
	}
	if o.BodyReadTimeoutSecs < 1 || o.IdleTimeoutSecs < 1 || o.MaxConnections < 1 {
		bad("--body-read-timeout-secs, --idle-timeout-secs and --max-connections must be >= 1")
	}
	if o.HTTPServer != HTTPServerLean && o.HTTPServer != HTTPServerNet {
		bad("--http-server %q: must be %s or %s", o.HTTPServer, HTTPServerLean, HTTPServerNet)
	}
	if o.MaxConnectionsPerClient < 0 {
		bad("--max-connections-per-client must be >= 0 (0: no per-client cap), got %d", o.MaxConnectionsPerClient)
	}
	if o.CacheThreshold < 0 || o.CacheThreshold > 1 {
		bad("--cache-threshold must be within [0, 1], got %v", o.CacheThreshold)
	}
	if o.BalanceAbsThreshold < 0 || o.BalanceRelThreshold < 1 {
		bad("--balance-abs-threshold must be >= 0 and --balance-rel-threshold >= 1")
	}
	if !(o.BalanceTokenUsageThreshold > 0 && o.BalanceTokenUsageThreshold <= 1) {
		bad("--balance-token-usage-threshold must be in (0, 1], got %v", o.BalanceTokenUsageThreshold)
	}
	if o.DispatchKeyHeader == "" || o.PrefixHashLoadFactor < 1 || o.PromptBytesPerTokenGuess < 1 ||
		o.UpstreamDialTimeout <= 0 || o.MaxIdleConnsPerWorker < 1 {
		bad("internal router options out of range")
	}
	return errors.Join(errs...)
}

// define registers v under name, or feeds an existing flag of that name to v as well.
func define(fs *flag.FlagSet, v flag.Value, name, usage string) {
	if f := fs.Lookup(name); f != nil {
		_ = v.Set(f.Value.String()) // start from the other owner's default
		f.Value = teeValue{f.Value, v}
		return
	}
	fs.Var(v, name, usage)
}

// teeValue sets two flag values from one command-line flag.
type teeValue struct{ first, second flag.Value }

func (t teeValue) String() string { return t.first.String() }
func (t teeValue) Set(s string) error {
	if err := t.first.Set(s); err != nil {
		return err
	}
	return t.second.Set(s)
}
func (t teeValue) IsBoolFlag() bool {
	b, ok := t.first.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

type (
	stringValue string
	boolValue   bool
	intValue    int
	int64Value  int64
	floatValue  float64
)

func (v *stringValue) Set(s string) error { *v = stringValue(s); return nil }
func (v *stringValue) String() string     { return string(*v) }
func (v *boolValue) Set(s string) error {
	b, err := strconv.ParseBool(s)
	*v = boolValue(b)
	return err
}
func (v *boolValue) String() string   { return strconv.FormatBool(bool(*v)) }
func (v *boolValue) IsBoolFlag() bool { return true }
func (v *intValue) Set(s string) error {
	n, err := strconv.Atoi(s)
	*v = intValue(n)
	return err
}
func (v *intValue) String() string { return strconv.Itoa(int(*v)) }
func (v *int64Value) Set(s string) error {
	n, err := strconv.ParseInt(s, 10, 64)
	*v = int64Value(n)
	return err
}
func (v *int64Value) String() string { return strconv.FormatInt(int64(*v), 10) }
func (v *floatValue) Set(s string) error {
	f, err := strconv.ParseFloat(s, 64)
	*v = floatValue(f)
	return err
}
func (v *floatValue) String() string { return strconv.FormatFloat(float64(*v), 'g', -1, 64) }
