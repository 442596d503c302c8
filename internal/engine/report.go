// Package engine reads an inference engine's load: the one code path shared by
// the control plane's built-in poller and the per-node agent.
//
// Each wire (vLLM, SGLang's three endpoints, TokenSpeed, Triton TRT-LLM, TGI,
// llama.cpp) has a pure parser that turns one answer into a Report. A Reader
// detects which wire a worker speaks, remembers it, and polls it.
//
// Overload protection fails open, so every failure here — an unsupported
// backend, a timeout, an error, an empty answer — means "no report": an empty
// Report and a non-nil error. Callers never have to tell a zero load from a
// missing one by looking at the numbers.
//
// It imports nothing of the control plane or the agent and judges nothing.
package engine

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// Source names the wire a report was read from.
type Source string

// The wires this package reads, in detection order.
const (
	SourceVLLM          Source = "vllm"
	SourceSGLangLoads   Source = "sglang_loads"
	SourceSGLangGetLoad Source = "sglang_get_load"
	SourceSGLangMetrics Source = "sglang_metrics"
	SourceTokenSpeed    Source = "tokenspeed"
	SourceTRTLLM        Source = "trtllm"
	SourceTGI           Source = "tgi"
	SourceLlamaCpp      Source = "llamacpp"

	// gRPC workers' GetLoads (internal/enginegrpc), never detected over HTTP.
	SourceGRPCSGLang Source = "grpc_sglang"
	SourceGRPCVLLM   Source = "grpc_vllm"
)

// ErrNoReport is wrapped by every error that means the engine answered but the
// answer carries no usable load (no load series, an empty list).
var ErrNoReport = errors.New("no load report")

// Rank is one data-parallel rank's load. A field the engine leaves out reads as 0.
type Rank struct {
	DPRank           int
	Waiting, Running int64   // requests
	TokenUsage       float64 // KV token usage, 0..1
	GenThroughput    float64 // generated tokens per second
	CacheHitRate     float64 // prefix cache hit rate, 0..1
	MaxRunning       int64   // the running window if the engine reports it, else 0
	KVCapacity       int64   // KV cache capacity in tokens if the engine reports it, else 0
}

// rankCounters are cumulative counters some wires export instead of a rate;
// a Reader turns their movement between two polls into GenThroughput and
// CacheHitRate.
type rankCounters struct {
	genTokens          float64
	hits, queries      float64
	hasGen, hasHitRate bool
}

type rankSample struct {
	dp int
	c  rankCounters
}

// Report is one answer from one engine.
type Report struct {
	Source Source
	Ranks  []Rank // sorted by DPRank, one entry per rank; len 0 means "no report"

	// StepCount is a progress counter for engine silence, summed over ranks.
	// StepWire is true only for wires whose counter moves on every scheduler
	// step (vLLM and TokenSpeed iteration_tokens_total, TGI
	// tgi_batch_inference_count, llama.cpp n_decode_total). A counter that
	// moves only when a request completes never sets StepWire: it says nothing
	// about progress between completions.
	StepCount float64
	StepWire  bool
	// BatchWire is true for wires whose StepCount moves with token batches
	// only (SGLang: prompt and generation token counters, or the KV tokens in
	// use), so a long prefill is silent too: the control plane stretches the
	// silence it allows on such a wire (the spec's token-batch rule).
	BatchWire bool
	// StartTime is the engine process's start time in seconds since the
	// Unix epoch (process_start_time_seconds on a /metrics page), or 0 when
	// the wire carries none: a later one says the engine restarted.
	StartTime float64

	counters []rankSample // by DP rank, for wires that export counters
}

// Empty reports whether r carries no load ("no report").
func (r Report) Empty() bool { return len(r.Ranks) == 0 }

// Waiting is the number of waiting requests summed over DP ranks.
func (r Report) Waiting() int64 {
	var n int64
	for _, rk := range r.Ranks {
		n += rk.Waiting
	}
	return n
}

// Running is the number of running requests summed over DP ranks.
func (r Report) Running() int64 {
	var n int64
	for _, rk := range r.Ranks {
		n += rk.Running
	}
	return n
}

// GenThroughput is the generation throughput summed over DP ranks.
func (r Report) GenThroughput() float64 {
	var s float64
	for _, rk := range r.Ranks {
		s += rk.GenThroughput
	}
	return s
}

// CacheHitRate is the mean prefix cache hit rate over DP ranks.
func (r Report) CacheHitRate() float64 {
	if len(r.Ranks) == 0 {
		return 0
	}
	var s float64
	for _, rk := range r.Ranks {
		s += rk.CacheHitRate
	}
	return s / float64(len(r.Ranks))
}

// MaxRunning is the running window summed over DP ranks. It is 0 ("no window
// reported") when any rank lacks one: a partial sum would understate the
// engine's window and gate PD admission on a number the engine never gave, and
// the spec never gates a worker whose engine reports no window.
func (r Report) MaxRunning() int64 { return r.sumEvery(func(rk Rank) int64 { return rk.MaxRunning }) }

// KVCapacity is the KV cache capacity in tokens summed over DP ranks; 0 ("not
// reported") when any rank lacks one, as MaxRunning.
func (r Report) KVCapacity() int64 { return r.sumEvery(func(rk Rank) int64 { return rk.KVCapacity }) }

// sumEvery sums f over DP ranks, or 0 when a rank has none (f <= 0).
func (r Report) sumEvery(f func(Rank) int64) int64 {
	var n int64
	for _, rk := range r.Ranks {
		v := f(rk)
		if v <= 0 {
			return 0
		}
		n += v
	}
	return n
}

// maxCount caps counts taken from floats so a hostile or corrupt value cannot
// overflow int64 sums.
const maxCount = 1 << 40

// count turns an engine number into a request count: NaN, negatives and
// infinities never become load.
func count(v float64) int64 {
	if !(v > 0) { // also catches NaN
		return 0
	}
	if v > maxCount {
		return maxCount
	}
	return int64(v)
}

// fraction clamps a ratio to [0, 1]; NaN reads as 0.
func fraction(v float64) float64 {
	if !(v > 0) {
		return 0
	}
	if v > 1 {
		return 1
	}
	return v
}

// rate keeps a finite non-negative rate; anything else reads as 0.
func rate(v float64) float64 {
	if !(v > 0) || math.IsInf(v, 1) {
		return 0
	}
	return v
}

// counter keeps a finite non-negative counter value.
func counter(v float64) float64 { return rate(v) }

// maxRanks bounds the ranks one answer may carry (real engines run a few
// dozen at most), so a hostile answer cannot make rank lookup quadratic.
const maxRanks = 1024

// rankSet collects ranks by DP rank while a payload is walked.
type rankSet struct {
	ranks   []Rank
	ctrs    []rankSample
	tooMany bool
	spill   Rank // written instead of a rank past maxRanks
}

// get returns the rank with the given DP rank, adding it if new.
func (s *rankSet) get(dp int) *Rank {
	if r := s.find(dp); r != nil {
		return r
	}
	if len(s.ranks) >= maxRanks {
		s.tooMany = true
		return &s.spill
	}
	s.ranks = append(s.ranks, Rank{DPRank: dp})
	return &s.ranks[len(s.ranks)-1]
}

// find returns the rank with the given DP rank, or nil.
func (s *rankSet) find(dp int) *Rank {
	for i := range s.ranks {
		if s.ranks[i].DPRank == dp {
			return &s.ranks[i]
		}
	}
	return nil
}

// ctr returns the counters of an existing rank, or nil.
func (s *rankSet) ctr(dp int) *rankCounters {
	if s.find(dp) == nil {
		return nil
	}
	for i := range s.ctrs {
		if s.ctrs[i].dp == dp {
			return &s.ctrs[i].c
		}
	}
	s.ctrs = append(s.ctrs, rankSample{dp: dp})
	return &s.ctrs[len(s.ctrs)-1].c
}

// report finishes a payload: ranks sorted by DP rank, or no report (saying
// why) when there are none, or a ParseError when there are too many.
func (s *rankSet) report(src Source, why string) (Report, error) {
	if s.tooMany {
		return Report{}, &ParseError{Wire: string(src), Err: fmt.Errorf("more than %d ranks", maxRanks)}
	}
	if len(s.ranks) == 0 {
		return Report{}, noReport("%s", why)
	}
	slices.SortFunc(s.ranks, func(a, b Rank) int { return a.DPRank - b.DPRank })
	return Report{Source: src, Ranks: s.ranks, counters: s.ctrs}, nil
}

// maxDPRank bounds DP rank numbers read from the wire.
const maxDPRank = 1 << 20
