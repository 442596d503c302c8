// Package sim simulates LLM inference engines (vLLM and SGLang flavors) with a
// continuous-batching queueing model, their OpenAI and load surfaces, and the
// faults real engines show: a wedged scheduler, silent or malformed metrics,
// slow steps, reset connections and a dead process.
//
// It imports no other smg package, so an engine's behaviour in tests never
// depends on smg's code.
package sim

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"time"
)

// Flavors and roles the simulator understands.
const (
	FlavorVLLM   = "vllm"
	FlavorSGLang = "sglang"

	RoleRegular = "regular"
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)

// Options are the knobs of one simulated engine. Every DP rank of the engine
// gets its own window and KV capacity, like a real data-parallel deployment.
type Options struct {
	// TLS serves https:// when set (the command loads it from --tls-cert-file).
	TLS    *tls.Config
	Flavor string // "vllm" or "sglang": which load surfaces and metric names to serve
	Model  string // served model id
	Role   string // "regular", "prefill" or "decode" (PD disaggregation)

	MaxRunningRequests  int           // running window per rank (max-num-seqs / max-running-requests)
	KVCapacityTokens    int           // KV cache capacity per rank, in tokens
	PrefillTokensPerSec float64       // prompt tokens computed per second
	ITL                 time.Duration // decode step time with one running request
	ITLGrowth           float64       // extra step time per additional running request, as a fraction of ITL
	MaxBatchedTokens    int           // token budget of one step (chunked prefill)
	DefaultMaxTokens    int           // output length when the request names none
	EOSProbability      float64       // per-token chance of stopping early (finish_reason "stop")

	DPSize int // data-parallel ranks
	TPSize int // tensor-parallel ranks: SGLang metrics repeat every series per tp_rank

	BootstrapTimeout time.Duration // prefill role: how long KV is held waiting for a decode engine
	// SGLangMetricsInterval is how many decode steps pass between updates of the
	// sglang: gauges (SGLang's --decode-log-interval); prefill steps update them too.
	SGLangMetricsInterval int

	Seed  uint64 // makes sampled words and early stops repeatable
	Fault Fault  // faults active from the start

	// GRPC serves the flavor's engine service (SGLang scheduler or vLLM
	// engine) on GRPCPort (0: a free port; engine i of a fleet: GRPCPort+i).
	GRPC     bool
	GRPCPort int
	// GRPCExtensions is what the servicer adds to SMG's engine protocol:
	// "all" (a load record on every KV event batch, heartbeats, the
	// engine-silence figure), "load" (no silence figure, like an older
	// servicer) or "none" (plain KV event batches).
	GRPCExtensions string
	// KVHeartbeat is the quiet spell after which a KV event stream carries a
	// heartbeat record.
	KVHeartbeat time.Duration
	// APIKey, when set, is the key every request but /health and /sim/*
	// must carry as its bearer token (a provider's API key); others get 401.
	APIKey string
}

// Servicer extension levels (Options.GRPCExtensions).
const (
	ExtensionsAll  = "all"
	ExtensionsLoad = "load"
	ExtensionsNone = "none"
)

// DefaultOptions returns a vLLM-flavored engine roughly the size of an 8B
// model on one GPU.
func DefaultOptions() Options {
	return Options{
		Flavor:                FlavorVLLM,
		Model:                 "sim-model",
		Role:                  RoleRegular,
		MaxRunningRequests:    256,
		KVCapacityTokens:      65536,
		PrefillTokensPerSec:   20000,
		ITL:                   20 * time.Millisecond,
		MaxBatchedTokens:      8192,
		DefaultMaxTokens:      128,
		DPSize:                1,
		TPSize:                1,
		BootstrapTimeout:      120 * time.Second,
		SGLangMetricsInterval: 40,
		GRPCExtensions:        ExtensionsAll,
		KVHeartbeat:           time.Second,
	}
}

// Validate reports the first option that cannot describe an engine.
func (o Options) Validate() error {
	var errs []error
	if o.Flavor != FlavorVLLM && o.Flavor != FlavorSGLang {
		errs = append(errs, fmt.Errorf("flavor %q: want vllm or sglang", o.Flavor))
	}
	if o.Role != RoleRegular && o.Role != RolePrefill && o.Role != RoleDecode {
		errs = append(errs, fmt.Errorf("role %q: want regular, prefill or decode", o.Role))
	}
	if o.Model == "" {
		errs = append(errs, errors.New("model must not be empty"))
	}
	positive := map[string]int{
		"max running requests": o.MaxRunningRequests, "kv capacity tokens": o.KVCapacityTokens,
		"max batched tokens": o.MaxBatchedTokens, "default max tokens": o.DefaultMaxTokens,
		"dp size": o.DPSize, "tp size": o.TPSize, "sglang metrics interval": o.SGLangMetricsInterval,
	}
	for _, name := range []string{"max running requests", "kv capacity tokens", "max batched tokens",
		"default max tokens", "dp size", "tp size", "sglang metrics interval"} {
		if positive[name] < 1 {
			errs = append(errs, fmt.Errorf("%s must be >= 1, got %d", name, positive[name]))
		}
	}
	if o.PrefillTokensPerSec <= 0 {
		errs = append(errs, errors.New("prefill tokens per second must be > 0"))
	}
	if o.ITL <= 0 {
		errs = append(errs, errors.New("itl must be > 0"))
	}
	if o.ITLGrowth < 0 {
		errs = append(errs, errors.New("itl growth must be >= 0"))
	}
	if o.EOSProbability < 0 || o.EOSProbability >= 1 {
		errs = append(errs, errors.New("eos probability must be in [0, 1)"))
	}
	if o.BootstrapTimeout <= 0 {
		errs = append(errs, errors.New("bootstrap timeout must be > 0"))
	}
	if o.Fault.Slow < 0 {
		errs = append(errs, errors.New("slow multiplier must be >= 0"))
	}
	if o.GRPC {
		if o.GRPCPort < 0 || o.GRPCPort > 65535 {
			errs = append(errs, fmt.Errorf("grpc port %d: want 0..65535", o.GRPCPort))
		}
		switch o.GRPCExtensions {
		case ExtensionsAll, ExtensionsLoad, ExtensionsNone:
		default:
			errs = append(errs, fmt.Errorf("grpc extensions %q: want all, load or none", o.GRPCExtensions))
		}
		if o.KVHeartbeat <= 0 {
			errs = append(errs, errors.New("kv heartbeat must be > 0"))
		}
	}
	return errors.Join(errs...)
}

// AddFlags registers every option as a flag of fs, with o's values as defaults.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Flavor, "flavor", o.Flavor, "engine to imitate: vllm (/metrics with vllm: names) or sglang (/v1/loads, /get_load, /server_info, sglang: metrics)")
	fs.StringVar(&o.Model, "model", o.Model, "model id served on /v1/models and expected in requests")
	fs.StringVar(&o.Role, "role", o.Role, "PD role: regular, prefill (holds KV until a decode engine admits the bootstrap room) or decode")
	fs.IntVar(&o.MaxRunningRequests, "max-running-requests", o.MaxRunningRequests, "running window per DP rank (vLLM --max-num-seqs, SGLang --max-running-requests)")
	fs.IntVar(&o.KVCapacityTokens, "kv-capacity-tokens", o.KVCapacityTokens, "KV cache capacity per DP rank, in tokens")
	fs.Float64Var(&o.PrefillTokensPerSec, "prefill-tokens-per-sec", o.PrefillTokensPerSec, "prompt tokens computed per second")
	fs.Var((*msValue)(&o.ITL), "itl-ms", "decode step time with one running request, in milliseconds as a `float` (0.5 allowed)")
	fs.Float64Var(&o.ITLGrowth, "itl-growth", o.ITLGrowth, "extra step time per additional running request, as a fraction of --itl-ms (0.01 = +1% each)")
	fs.IntVar(&o.MaxBatchedTokens, "max-batched-tokens", o.MaxBatchedTokens, "token budget of one engine step; longer prompts are prefilled in chunks")
	fs.IntVar(&o.DefaultMaxTokens, "default-max-tokens", o.DefaultMaxTokens, "output tokens when a request sets neither max_tokens nor max_completion_tokens")
	fs.Float64Var(&o.EOSProbability, "eos-probability", o.EOSProbability, "per-token chance that a request stops before max_tokens (finish_reason stop)")
	fs.IntVar(&o.DPSize, "dp-size", o.DPSize, "data-parallel ranks per engine, each with its own window and KV cache")
	fs.IntVar(&o.TPSize, "tp-size", o.TPSize, "tensor-parallel ranks: sglang metrics repeat each series per tp_rank")
	fs.Var((*secsValue)(&o.BootstrapTimeout), "bootstrap-timeout-secs", "prefill role: seconds a request's KV waits for a decode engine to admit its bootstrap room before the request fails")
	fs.IntVar(&o.SGLangMetricsInterval, "sglang-metrics-interval", o.SGLangMetricsInterval, "decode steps between updates of the sglang: gauges (SGLang's --decode-log-interval)")
	fs.Func("seed", "seed, an unsigned `integer`, for sampled words and early stops; engine i of a fleet uses seed+i (default 0)", func(s string) error {
		v, err := strconv.ParseUint(s, 10, 64)
		o.Seed = v
		return err
	})
	fs.BoolVar(&o.Fault.Freeze, "fault-freeze", o.Fault.Freeze, "start frozen: no engine steps, while /health and /metrics keep answering")
	fs.BoolVar(&o.Fault.SilentMetrics, "fault-silent-metrics", o.Fault.SilentMetrics, "start with load series missing from /metrics and /v1/loads (like vLLM --disable-log-stats)")
	fs.Float64Var(&o.Fault.Slow, "fault-slow", o.Fault.Slow, "start with every step this many times slower (0 or 1 = normal speed)")
	fs.BoolVar(&o.Fault.Reset, "fault-reset", o.Fault.Reset, "start resetting every accepted connection")
	fs.BoolVar(&o.Fault.Kill, "fault-kill", o.Fault.Kill, "start with the listener closed (revive with POST /sim/fault through a sibling or the control port)")
	fs.BoolVar(&o.Fault.GarbageMetrics, "fault-garbage-metrics", o.Fault.GarbageMetrics, "start serving malformed /metrics, /v1/loads and /get_load (over gRPC: absurd load figures)")
	fs.BoolVar(&o.Fault.StallKVEvents, "fault-stall-kv-events", o.Fault.StallKVEvents, "start with the gRPC KV event streams sending nothing (no batch, no heartbeat) while everything else answers")
	fs.Func("grpc-port", "serve the flavor's gRPC engine service (SMG's engine protocol) on this `port`; engine i on port+i, 0 picks free ports (default: no gRPC)", func(v string) error {
		p, err := strconv.Atoi(v)
		if err != nil {
			return err
		}
		o.GRPC, o.GRPCPort = true, p
		return nil
	})
	fs.StringVar(&o.GRPCExtensions, "grpc-extensions", o.GRPCExtensions, "what the gRPC servicer adds to the protocol: all (load records on KV event batches, heartbeats, engine-silence figure), load (no silence figure, like an older servicer) or none")
	fs.StringVar(&o.APIKey, "api-key", o.APIKey, "when set, every route but /health and /sim/* needs 'Authorization: Bearer <key>' (a provider's API key); others get 401 invalid_api_key")
	fs.IntVar(&o.Fault.Throttle, "fault-throttle", o.Fault.Throttle, "start answering every completion request 429 with this Retry-After in `seconds`, as a rate-limited provider does (0 = off)")
	fs.Var((*msValue)(&o.KVHeartbeat), "kv-heartbeat-ms", "quiet spell, in milliseconds, after which a gRPC KV event stream sends a heartbeat record")
}

// msValue is a time.Duration flag written in (fractional) milliseconds.
type msValue time.Duration

func (v *msValue) String() string {
	return strconv.FormatFloat(float64(time.Duration(*v))/float64(time.Millisecond), 'f', -1, 64)
}

func (v *msValue) Set(s string) error {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return err
	}
	*v = msValue(time.Duration(f * float64(time.Millisecond)))
	return nil
}

// secsValue is a time.Duration flag written in whole seconds, like the spec's flags.
type secsValue time.Duration

func (v *secsValue) String() string { return strconv.Itoa(int(time.Duration(*v) / time.Second)) }

func (v *secsValue) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return err
	}
	*v = secsValue(time.Duration(n) * time.Second)
	return nil
}

// Fault is the set of failures an engine is showing. The zero value is healthy.
type Fault struct {
	// Freeze stops the scheduler: no step, no token, no abort processed, while
	// /health and /metrics keep answering (a wedged engine).
	Freeze bool `json:"freeze"`
	// SilentMetrics drops every load series, like vLLM with --disable-log-stats.
	SilentMetrics bool `json:"silent_metrics"`
	// Slow multiplies every step's duration; 0 and 1 mean normal speed.
	Slow float64 `json:"slow"`
	// Reset resets (RST) every accepted connection, and the open ones when set.
	Reset bool `json:"reset"`
	// Kill closes the listener and cuts every open stream; clearing it listens
	// again on the same address with a fresh engine (a restarted process).
	Kill bool `json:"kill"`
	// GarbageMetrics serves malformed /metrics exposition and load JSON
	// (over gRPC: absurd load figures).
	GarbageMetrics bool `json:"garbage_metrics"`
	// StallKVEvents stops the gRPC KV event streams (no batch, no heartbeat)
	// while every other surface keeps answering.
	StallKVEvents bool `json:"stall_kv_events"`
	// Throttle answers every completion request 429 with this Retry-After
	// in seconds (a provider's rate limit; 0: off).
	Throttle int `json:"throttle_retry_after"`
}

// slowFactor is the step-time multiplier the fault asks for.
func (f Fault) slowFactor() float64 {
	if f.Slow <= 0 {
		return 1
	}
	return f.Slow
}
