package engine

import (
	"bytes"
	"encoding/json"
	"math"
)

// loadsEntry is the part of one /v1/loads entry this package reads. SGLang's
// answer looks like
//
//	{"timestamp": "...", "version": "...", "dp_rank_count": 2,
//	 "loads": [{"dp_rank": 0, "num_running_reqs": 3, "num_waiting_reqs": 1,
//	            "token_usage": 0.42, "gen_throughput": 812.5, "cache_hit_rate": 0.3,
//	            "max_running_requests": 256, "memory": {...}, ...}, ...],
//	 "aggregate": {...}}
//
// Absent or null fields read as 0; "3" and "3.0" both read as 3.
type loadsEntry struct {
	dp                       float64
	hasDP                    bool
	running, waiting, usage  float64
	gen, hitRate, maxRunning float64
	kvCapacity               float64 // max_total_num_tokens: KV capacity in tokens
	used                     float64 // num_used_tokens: KV tokens in use
	hasUsed                  bool
}

// ParseSGLangLoads reads SGLang's /v1/loads JSON answer, one entry per DP
// rank. It is the decode a poller runs most, so it scans the document once
// without allocating beyond the ranks it returns; it accepts exactly the
// documents encoding/json would decode into the same ranks.
func ParseSGLangLoads(body []byte) (Report, error) {
	s := jsonScanner{b: body}
	ranks := rankSet{ranks: make([]Rank, 0, 8)} // one allocation for up to 8 DP ranks
	var used float64                            // KV tokens in use, summed: the progress counter
	hasUsed := false
	top := func(key []byte) bool {
		if !keyIs(key, "loads") {
			return s.skip(2)
		}
		ranks.ranks = ranks.ranks[:0] // a repeated key: the last one counts
		used, hasUsed = 0, false
		if s.peek() == 'n' {
			return s.lit("null")
		}
		return s.array(2, func(i int) bool {
			var e loadsEntry
			if s.peek() == 'n' {
				if !s.lit("null") {
					return false
				}
			} else if !s.object(3, func(k []byte) bool { return s.loadsField(k, &e) }) {
				return false
			}
			addLoadsEntry(&ranks, e, i)
			used, hasUsed = used+count64(e.used), hasUsed || e.hasUsed
			return true
		})
	}
	ok := false
	if s.peek() == 'n' {
		ok = s.lit("null")
	} else {
		ok = s.object(1, top)
	}
	if s.ws(); !ok || s.i != len(s.b) {
		return Report{}, &ParseError{Wire: "sglang /v1/loads", Err: s.fail()}
	}
	rep, err := ranks.report(SourceSGLangLoads, "sglang /v1/loads: no ranks")
	if err == nil && hasUsed {
		// The KV tokens in use move with every prefill chunk and decode
		// step SGLang runs, and stand still when it produces nothing.
		rep.StepCount, rep.BatchWire = used, true
	}
	return rep, err
}

// count64 is a non-negative finite count as a float (NaN, ±Inf, < 0: 0).
func count64(v float64) float64 {
	if !(v > 0) || math.IsInf(v, 1) {
		return 0
	}
	return v
}

// loadsField reads one field of a /v1/loads entry.
func (s *jsonScanner) loadsField(key []byte, e *loadsEntry) bool {
	name := loadsFieldName(key)
	var dst *float64
	switch name {
	case "dp_rank":
		set, ok := s.numOrNull(&e.dp)
		e.hasDP = set
		return ok
	case "num_running_reqs":
		dst = &e.running
	case "num_waiting_reqs":
		dst = &e.waiting
	case "token_usage":
		dst = &e.usage
	case "gen_throughput":
		dst = &e.gen
	case "cache_hit_rate":
		dst = &e.hitRate
	case "max_running_requests":
		dst = &e.maxRunning
	case "max_total_num_tokens":
		dst = &e.kvCapacity
	case "num_used_tokens":
		set, ok := s.numOrNull(&e.used)
		e.hasUsed = e.hasUsed || set
		return ok
	default:
		return s.skip(4)
	}
	// encoding/json leaves a field alone on null.
	_, ok := s.numOrNull(dst)
	return ok
}

var loadsFieldNames = []string{"dp_rank", "num_running_reqs", "num_waiting_reqs", "token_usage",
	"gen_throughput", "cache_hit_rate", "max_running_requests", "num_used_tokens", "max_total_num_tokens"}

// loadsFieldName maps a key to the field it fills, matching as encoding/json
// does (case-insensitively); "" for keys this package does not read.
func loadsFieldName(key []byte) string {
	for _, n := range loadsFieldNames {
		if string(key) == n { // the exact spelling SGLang sends, without folding
			return n
		}
	}
	// A lowercase ASCII key that missed cannot match under folding either.
	if !needsFold(key) {
		return ""
	}
	for _, n := range loadsFieldNames {
		if keyIs(key, n) {
			return n
		}
	}
	return ""
}

// needsFold reports whether key has an upper-case or non-ASCII byte.
func needsFold(key []byte) bool {
	for _, c := range key {
		if 'A' <= c && c <= 'Z' || c >= 0x80 {
			return true
		}
	}
	return false
}

// addLoadsEntry adds entry i unless its rank is malformed or already read.
func addLoadsEntry(s *rankSet, e loadsEntry, i int) {
	var dp *float64
	if e.hasDP {
		dp = &e.dp
	}
	r, ok := jsonRank(dp, i)
	if !ok || s.find(r) != nil {
		return // keep the first reading of a rank
	}
	*s.get(r) = Rank{
		DPRank:        r,
		Waiting:       count(e.waiting),
		Running:       count(e.running),
		TokenUsage:    fraction(e.usage),
		GenThroughput: rate(e.gen),
		CacheHitRate:  fraction(e.hitRate),
		MaxRunning:    count(e.maxRunning),
		KVCapacity:    count(e.kvCapacity),
	}
}

// sglangGetLoad is one entry of the legacy /get_load answer. num_reqs counts
// running and waiting requests together; num_tokens is absolute, not a ratio,
// so this wire carries no KV usage.
type sglangGetLoad struct {
	DPRank         *float64 `json:"dp_rank"`
	NumReqs        float64  `json:"num_reqs"`
	NumWaitingReqs float64  `json:"num_waiting_reqs"`
	NumTokens      *float64 `json:"num_tokens"`
}

// ParseSGLangGetLoad reads SGLang's legacy /get_load answer: a list of
// {dp_rank, num_reqs, num_waiting_reqs, num_tokens}, or a single such object
// from servers without DP.
func ParseSGLangGetLoad(body []byte) (Report, error) {
	var list []sglangGetLoad
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) > 0 && trimmed[0] == '{' {
		var one sglangGetLoad
		if err := json.Unmarshal(trimmed, &one); err != nil {
			return Report{}, &ParseError{Wire: "sglang /get_load", Err: err}
		}
		list = []sglangGetLoad{one}
	} else if err := json.Unmarshal(trimmed, &list); err != nil {
		return Report{}, &ParseError{Wire: "sglang /get_load", Err: err}
	}
	s := rankSet{ranks: make([]Rank, 0, len(list))}
	var tokens float64
	hasTokens := false
	for i, l := range list {
		dp, ok := jsonRank(l.DPRank, i)
		if !ok || s.find(dp) != nil {
			continue
		}
		if l.NumTokens != nil {
			tokens, hasTokens = tokens+count64(*l.NumTokens), true
		}
		waiting := count(l.NumWaitingReqs)
		running := count(l.NumReqs) - waiting
		if running < 0 {
			running = 0
		}
		*s.get(dp) = Rank{DPRank: dp, Waiting: waiting, Running: running}
	}
	rep, err := s.report(SourceSGLangGetLoad, "sglang /get_load: no ranks")
	if err == nil && hasTokens {
		rep.StepCount, rep.BatchWire = tokens, true // KV tokens in use, as on /v1/loads
	}
	return rep, err
}

// jsonRank takes an entry's dp_rank, or its position when the field is absent.
func jsonRank(p *float64, index int) (int, bool) {
	if p == nil {
		return index, index < maxDPRank
	}
	v := *p
	if v < 0 || v >= maxDPRank || v != math.Trunc(v) {
		return 0, false
	}
	return int(v), true
}
