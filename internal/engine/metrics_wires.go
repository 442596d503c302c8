package engine

import (
	"encoding/json"
	"io"
	"strconv"
)

// The Prometheus wires. Each fromX reads an already parsed /metrics page, so
// detection parses the page once and offers it to every wire in turn.

var vllmWire = gaugeWire{
	source:     SourceVLLM,
	prefix:     "vllm:",
	rankLabels: []string{"engine"}, // vLLM v1 labels each DP engine with its global index
	waiting:    "vllm:num_requests_waiting",
	running:    "vllm:num_requests_running",
	usage:      []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"},
}

// ParseVLLM reads a vLLM /metrics page. vLLM started with --disable-log-stats
// exports no vllm: series at all: that page is no report.
func ParseVLLM(r io.Reader) (Report, error) {
	fs, err := readFamilies(r)
	if err != nil {
		return Report{}, err
	}
	return fromVLLM(fs)
}

func fromVLLM(fs families) (Report, error) {
	w := vllmWire
	if !fs.hasPrefix(w.prefix) {
		return Report{}, noReport("vllm: no vllm: series (stats logging disabled?)")
	}
	s := w.ranks(fs)
	// v0 exported rates as gauges; v1 exports counters only.
	if name := fs.first("vllm:avg_generation_throughput_toks_per_s"); name != "" {
		fs.annotate(s, name, w.rankLabels, sampleValue, func(r *Rank, v float64) { r.GenThroughput = rate(v) })
	} else {
		fs.genCounter(s, "vllm:generation_tokens_total", w.rankLabels, sampleValue)
	}
	if name := fs.first("vllm:gpu_prefix_cache_hit_rate"); name != "" {
		fs.annotate(s, name, w.rankLabels, sampleValue, func(r *Rank, v float64) { r.CacheHitRate = fraction(v) })
	} else if fs["vllm:prefix_cache_queries_total"] != nil {
		fs.hitCounters(s, "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", w.rankLabels)
	} else {
		fs.hitCounters(s, "vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_queries_total", w.rankLabels)
	}
	fs.configInfo(s, "vllm:cache_config_info", w.rankLabels)
	rep, err := s.report(w.source, "vllm: no load gauges")
	if err != nil {
		return Report{}, err
	}
	// One histogram observation per engine step: the scheduler's own pulse.
	rep.StepCount, rep.StepWire = fs.stepCounter("vllm:iteration_tokens_total", w.rankLabels)
	rep.StartTime = fs.startTime()
	return rep, nil
}

var sglangWire = gaugeWire{
	source:     SourceSGLangMetrics,
	prefix:     "sglang:",
	rankLabels: []string{"dp_rank"},
	waiting:    "sglang:num_queue_reqs",
	running:    "sglang:num_running_reqs",
	usage:      []string{"sglang:token_usage"},
}

// ParseSGLangMetrics reads an SGLang /metrics page (server run with
// --enable-metrics). Every TP rank repeats its DP rank's values; one is read.
// SGLang refreshes these gauges only on prefill batches and every
// --decode-log-interval decode steps, so the page carries no step counter;
// its prompt and generation token counters move with those batches, which
// makes it a token-batch wire (BatchWire).
func ParseSGLangMetrics(r io.Reader) (Report, error) {
	fs, err := readFamilies(r)
	if err != nil {
		return Report{}, err
	}
	return fromSGLangMetrics(fs)
}

func fromSGLangMetrics(fs families) (Report, error) {
	w := sglangWire
	if !fs.hasPrefix(w.prefix) {
		return Report{}, noReport("sglang metrics: no sglang: series")
	}
	s := w.ranks(fs)
	fs.annotate(s, "sglang:gen_throughput", w.rankLabels, sampleValue, func(r *Rank, v float64) { r.GenThroughput = rate(v) })
	fs.annotate(s, "sglang:cache_hit_rate", w.rankLabels, sampleValue, func(r *Rank, v float64) { r.CacheHitRate = fraction(v) })
	fs.annotate(s, "sglang:max_total_num_tokens", w.rankLabels, sampleValue, func(r *Rank, v float64) { r.KVCapacity = count(v) })
	rep, err := s.report(w.source, "sglang metrics: no load gauges")
	if err != nil {
		return Report{}, err
	}
	if fs["sglang:prompt_tokens_total"] != nil || fs["sglang:generation_tokens_total"] != nil {
		rep.StepCount = fs.sumRanks("sglang:prompt_tokens_total", w.rankLabels, sampleValue) +
			fs.sumRanks("sglang:generation_tokens_total", w.rankLabels, sampleValue)
		rep.BatchWire = true
	}
	rep.StartTime = fs.startTime()
	return rep, nil
}

var tokenSpeedWire = gaugeWire{
	source:     SourceTokenSpeed,
	prefix:     "tokenspeed:",
	rankLabels: []string{"dp_rank", "engine"},
	waiting:    "tokenspeed:num_requests_waiting",
	running:    "tokenspeed:num_requests_running",
	usage:      []string{"tokenspeed:kv_cache_usage_perc"},
}

// ParseTokenSpeed reads a TokenSpeed /metrics page. Its
// iteration_tokens_total histogram is observed once per scheduler step.
func ParseTokenSpeed(r io.Reader) (Report, error) {
	fs, err := readFamilies(r)
	if err != nil {
		return Report{}, err
	}
	return fromTokenSpeed(fs)
}

func fromTokenSpeed(fs families) (Report, error) {
	w := tokenSpeedWire
	if !fs.hasPrefix(w.prefix) {
		return Report{}, noReport("tokenspeed: no tokenspeed: series")
	}
	s := w.ranks(fs)
	fs.genCounter(s, "tokenspeed:generation_tokens_total", w.rankLabels, sampleValue)
	// TokenSpeed documents its hit ratio as prefix_cache_hits / prompt_tokens.
	fs.hitCounters(s, "tokenspeed:prefix_cache_hits_total", "tokenspeed:prompt_tokens_total", w.rankLabels)
	rep, err := s.report(w.source, "tokenspeed: no load gauges")
	if err != nil {
		return Report{}, err
	}
	rep.StepCount, rep.StepWire = fs.stepCounter("tokenspeed:iteration_tokens_total", w.rankLabels)
	rep.StartTime = fs.startTime()
	return rep, nil
}

// ParseTRTLLM reads a Triton TensorRT-LLM backend /metrics page. The backend
// serves one rank. Backends older than the "waiting" request type count
// queued requests as active but not scheduled, so waiting falls back to
// active - scheduled there.
func ParseTRTLLM(r io.Reader) (Report, error) {
	fs, err := readFamilies(r)
	if err != nil {
		return Report{}, err
	}
	return fromTRTLLM(fs)
}

const (
	trtRequests = "nv_trt_llm_request_metrics"
	trtKVBlocks = "nv_trt_llm_kv_cache_block_metrics"
)

func fromTRTLLM(fs families) (Report, error) {
	if !fs.hasPrefix("nv_trt_llm_") {
		return Report{}, noReport("trtllm: no nv_trt_llm_ series")
	}
	one := func(name, label, value string) (float64, bool) {
		rv := fs.perRank(name, nil, filter{label, value}, sampleValue)
		if len(rv) == 0 {
			return 0, false
		}
		return rv[0].v, true
	}
	waiting, hasWaiting := one(trtRequests, "request_type", "waiting")
	scheduled, hasScheduled := one(trtRequests, "request_type", "scheduled")
	active, hasActive := one(trtRequests, "request_type", "active")
	window, _ := one(trtRequests, "request_type", "max")
	usage, hasUsage := one(trtKVBlocks, "kv_cache_block_type", "fraction")
	if !hasUsage {
		used, okUsed := one(trtKVBlocks, "kv_cache_block_type", "used")
		total, okMax := one(trtKVBlocks, "kv_cache_block_type", "max")
		if okUsed && okMax && total > 0 {
			usage, hasUsage = used/total, true
		}
	}
	if !hasWaiting && hasActive && hasScheduled {
		waiting, hasWaiting = active-scheduled, true
	}
	if !hasWaiting && !hasScheduled && !hasUsage {
		return Report{}, noReport("trtllm: no request or KV cache metrics")
	}
	rk := Rank{
		Waiting:    count(waiting),
		Running:    count(scheduled),
		TokenUsage: fraction(usage),
		MaxRunning: count(window),
	}
	return Report{Source: SourceTRTLLM, Ranks: []Rank{rk}, StartTime: fs.startTime()}, nil
}

// ParseTGI reads a Text Generation Inference /metrics page and, when given,
// its /info answer, whose max_concurrent_requests is the running window. TGI
// reports no KV usage. tgi_batch_inference_count moves once per prefill or
// decode step of the batch.
func ParseTGI(metrics io.Reader, info []byte) (Report, error) {
	fs, err := readFamilies(metrics)
	if err != nil {
		return Report{}, err
	}
	var window int64
	if len(info) > 0 {
		if window, err = parseTGIInfo(info); err != nil {
			return Report{}, err
		}
	}
	return fromTGI(fs, window)
}

func fromTGI(fs families, window int64) (Report, error) {
	if !fs.hasPrefix("tgi_") {
		return Report{}, noReport("tgi: no tgi_ series")
	}
	var s rankSet
	for _, rv := range fs.perRank("tgi_queue_size", nil, filter{}, sampleValue) {
		s.get(0).Waiting = count(rv.v)
	}
	for _, rv := range fs.perRank("tgi_batch_current_size", nil, filter{}, sampleValue) {
		s.get(0).Running = count(rv.v)
	}
	if rk := s.find(0); rk != nil {
		rk.MaxRunning = window
	}
	if fs["tgi_request_generated_tokens"] != nil {
		fs.genCounter(&s, "tgi_request_generated_tokens", nil, histSum)
	}
	rep, err := s.report(SourceTGI, "tgi: no queue or batch gauges")
	if err != nil {
		return Report{}, err
	}
	if fs["tgi_batch_inference_count"] != nil {
		rep.StepCount, rep.StepWire = fs.sumAll("tgi_batch_inference_count", sampleValue), true
	}
	rep.StartTime = fs.startTime()
	return rep, nil
}

// parseTGIInfo reads max_concurrent_requests from TGI's /info.
func parseTGIInfo(info []byte) (int64, error) {
	var v struct {
		MaxConcurrentRequests float64 `json:"max_concurrent_requests"`
	}
	if err := json.Unmarshal(info, &v); err != nil {
		return 0, &ParseError{Wire: "tgi /info", Err: err}
	}
	return count(v.MaxConcurrentRequests), nil
}

var llamaCppWire = gaugeWire{
	source:  SourceLlamaCpp,
	prefix:  "llamacpp:",
	waiting: "llamacpp:requests_deferred",
	running: "llamacpp:requests_processing",
	usage:   []string{"llamacpp:kv_cache_usage_ratio"}, // removed upstream; read when present
}

// ParseLlamaCpp reads a llama.cpp server /metrics page (server run with
// --metrics). n_decode_total counts llama_decode() calls, one per step.
func ParseLlamaCpp(r io.Reader) (Report, error) {
	fs, err := readFamilies(r)
	if err != nil {
		return Report{}, err
	}
	return fromLlamaCpp(fs)
}

func fromLlamaCpp(fs families) (Report, error) {
	w := llamaCppWire
	if !fs.hasPrefix(w.prefix) {
		return Report{}, noReport("llamacpp: no llamacpp: series")
	}
	s := w.ranks(fs)
	fs.annotate(s, "llamacpp:predicted_tokens_seconds", nil, sampleValue, func(r *Rank, v float64) { r.GenThroughput = rate(v) })
	rep, err := s.report(w.source, "llamacpp: no request gauges")
	if err != nil {
		return Report{}, err
	}
	if fs["llamacpp:n_decode_total"] != nil {
		rep.StepCount, rep.StepWire = fs.sumRanks("llamacpp:n_decode_total", nil, sampleValue), true
	}
	rep.StartTime = fs.startTime()
	return rep, nil
}

// configInfo reads vLLM's config info gauge name (value 1, the settings as
// labels) into the ranks: max_num_seqs, where a vLLM exports its
// scheduler's, is the window (stock vLLM labels only the KV cache, so its
// window is learned); num_gpu_blocks × block_size is the KV capacity in
// tokens. A series without a rank label applies to every rank; a value that
// is not a positive integer is ignored.
func (fs families) configInfo(s *rankSet, name string, rankLabels []string) {
	mf := fs[name]
	if mf == nil {
		return
	}
	for _, m := range mf.GetMetric() {
		rank, ranked := 0, false
		var window, blocks, blockSize int64
		for _, lp := range m.GetLabel() {
			switch ln := lp.GetName(); {
			case ln == "max_num_seqs":
				window = positiveInt(lp.GetValue())
			case ln == "num_gpu_blocks":
				blocks = positiveInt(lp.GetValue())
			case ln == "block_size":
				blockSize = positiveInt(lp.GetValue())
			case !ranked && isRankLabel(ln, rankLabels):
				rank, ranked = -1, true
				if v, ok := smallInt(lp.GetValue()); ok {
					rank = v
				}
			}
		}
		if rank < 0 {
			continue
		}
		kv := int64(0)
		if blocks > 0 && blockSize > 0 && blocks <= maxCount/blockSize {
			kv = blocks * blockSize
		}
		set := func(r *Rank) {
			if window > 0 {
				r.MaxRunning = window
			}
			if kv > 0 {
				r.KVCapacity = kv
			}
		}
		if !ranked {
			for i := range s.ranks {
				set(&s.ranks[i])
			}
		} else if r := s.find(rank); r != nil {
			set(r)
		}
	}
}

// positiveInt is a label's value as a count in (0, maxCount], else 0.
func positiveInt(v string) int64 {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 || n > maxCount {
		return 0
	}
	return n
}
