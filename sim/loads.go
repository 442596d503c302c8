package sim

import (
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// collector builds the engine's exposition from the model at scrape time.
type collector struct {
	s                                                              *Server
	start                                                          *prometheus.Desc
	vWaiting, vRunning, vKV, vPrompt, vGen, vPreempt, vDone, vIter *prometheus.Desc
	vCacheInfo                                                     *prometheus.Desc
	gRunning, gQueue, gUsage, gUsed, gThr, gHit, gMaxTokens        *prometheus.Desc
	gMaxRunning, gPrompt, gGen, gReqs                              *prometheus.Desc
}

func newCollector(s *Server) *collector {
	v := []string{"model_name", "engine"}
	g := []string{"model_name", "tp_rank", "dp_rank"}
	d := prometheus.NewDesc
	return &collector{
		s:     s,
		start: d("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", nil, nil),

		vWaiting: d("vllm:num_requests_waiting", "Number of requests waiting to be processed.", v, nil),
		vRunning: d("vllm:num_requests_running", "Number of requests in model execution batches.", v, nil),
		vKV:      d("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", v, nil),
		vPrompt:  d("vllm:prompt_tokens_total", "Number of prefill tokens processed.", v, nil),
		vGen:     d("vllm:generation_tokens_total", "Number of generation tokens processed.", v, nil),
		vPreempt: d("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", v, nil),
		vDone:    d("vllm:request_success_total", "Count of successfully processed requests.", append(v, "finished_reason"), nil),
		vIter:    d("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", v, nil),
		// vLLM's config info: value 1, the KV cache's settings as labels
		// (no max_num_seqs: stock vLLM leaves its window untold).
		vCacheInfo: d("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", []string{"engine", "block_size", "num_gpu_blocks"}, nil),

		gRunning:    d("sglang:num_running_reqs", "The number of running requests.", g, nil),
		gQueue:      d("sglang:num_queue_reqs", "The number of requests in the waiting queue.", g, nil),
		gUsage:      d("sglang:token_usage", "The token usage.", g, nil),
		gUsed:       d("sglang:num_used_tokens", "The number of used tokens.", g, nil),
		gThr:        d("sglang:gen_throughput", "The generation throughput (token/s).", g, nil),
		gHit:        d("sglang:cache_hit_rate", "The prefix cache hit rate.", g, nil),
		gMaxTokens:  d("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache.", g, nil),
		gMaxRunning: d("sglang:max_running_requests", "Maximum running requests.", g, nil),
		gPrompt:     d("sglang:prompt_tokens_total", "Number of prefill tokens processed.", g, nil),
		gGen:        d("sglang:generation_tokens_total", "Number of generation tokens processed.", g, nil),
		gReqs:       d("sglang:num_requests_total", "Number of requests processed.", g, nil),
	}
}

// Describe sends nothing: the series depend on the flavor and the faults.
func (c *collector) Describe(chan<- *prometheus.Desc) {}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	ch <- prometheus.MustNewConstMetric(c.start, prometheus.GaugeValue, float64(s.startedAt().UnixNano())/1e9)
	e := s.eng.Load()
	if e == nil || s.silent.Load() {
		return
	}
	now := time.Now()
	model := s.opts.Model
	gauge, counter := prometheus.GaugeValue, prometheus.CounterValue
	for _, r := range e.ranks {
		st := r.stats(now)
		rk := strconv.Itoa(r.id)
		if s.opts.Flavor == FlavorVLLM {
			m := func(d *prometheus.Desc, t prometheus.ValueType, v float64, extra ...string) {
				ch <- prometheus.MustNewConstMetric(d, t, v, append([]string{model, rk}, extra...)...)
			}
			m(c.vWaiting, gauge, float64(st.Waiting))
			ch <- prometheus.MustNewConstMetric(c.vCacheInfo, gauge, 1, rk, strconv.Itoa(simBlockSize), strconv.Itoa(st.Capacity/simBlockSize))
			m(c.vRunning, gauge, float64(st.Running))
			m(c.vKV, gauge, st.usage())
			m(c.vPrompt, counter, float64(st.PromptTokens))
			m(c.vGen, counter, float64(st.GenTokens))
			m(c.vPreempt, counter, float64(st.Preempt))
			for _, reason := range []string{"stop", "length", "abort"} {
				m(c.vDone, counter, float64(st.Finished[reason]), reason)
			}
			buckets := make(map[float64]uint64, len(iterationBuckets))
			for i, ub := range iterationBuckets {
				buckets[ub] = st.Buckets[i]
			}
			ch <- prometheus.MustNewConstHistogram(c.vIter, st.Steps, st.IterSum, buckets, model, rk)
			continue
		}
		pub := st.Published // SGLang's gauges lag: prefill steps and every N decode steps
		for tp := range s.opts.TPSize {
			labels := []string{model, strconv.Itoa(tp), rk}
			m := func(d *prometheus.Desc, t prometheus.ValueType, v float64) {
				ch <- prometheus.MustNewConstMetric(d, t, v, labels...)
			}
			m(c.gRunning, gauge, float64(pub.Running))
			m(c.gQueue, gauge, float64(pub.Waiting))
			m(c.gUsage, gauge, pub.usage())
			m(c.gUsed, gauge, float64(pub.KVUsed))
			m(c.gThr, gauge, st.Throughput)
			m(c.gHit, gauge, 0)
			m(c.gMaxTokens, gauge, float64(pub.Capacity))
			m(c.gMaxRunning, gauge, float64(pub.Window))
			m(c.gPrompt, counter, float64(st.PromptTokens))
			m(c.gGen, counter, float64(st.GenTokens))
			m(c.gReqs, counter, float64(st.Finished["stop"]+st.Finished["length"]+st.Finished["abort"]))
		}
	}
}

// simBlockSize is the KV block size the vLLM flavor reports (vLLM's
// default): its capacity in tokens is num_gpu_blocks of it, rounded down.
const simBlockSize = 16

// garbageExposition is what a broken exporter serves: unbalanced braces, a
// value that is not a number and a conflicting TYPE line.
const garbageExposition = "# TYPE vllm:num_requests_waiting gauge\n" +
	"vllm:num_requests_waiting{model_name=\"sim\",engine=\"0\" 3\n" +
	"# TYPE vllm:num_requests_waiting counter\n" +
	"sglang:num_queue_reqs{dp_rank=\"0\"} many\n" +
	"\x00\xff{{{\n"

func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request) {
	if s.garbage.Load() {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = w.Write([]byte(garbageExposition))
		return
	}
	s.metrics.ServeHTTP(w, r)
}

// garbageJSON is a load report cut off mid-value.
const garbageJSON = `{"loads":[{"dp_rank":0,"num_running_reqs":`

// loadEntry is one rank of SGLang's /v1/loads.
type loadEntry struct {
	DPRank             int     `json:"dp_rank"`
	NumRunningReqs     int     `json:"num_running_reqs"`
	NumWaitingReqs     int     `json:"num_waiting_reqs"`
	NumReqs            int     `json:"num_reqs"`
	NumUsedTokens      int     `json:"num_used_tokens"`
	MaxTotalNumTokens  int     `json:"max_total_num_tokens"`
	TokenUsage         float64 `json:"token_usage"`
	GenThroughput      float64 `json:"gen_throughput"`
	CacheHitRate       float64 `json:"cache_hit_rate"`
	Utilization        float64 `json:"utilization"`
	MaxRunningRequests int     `json:"max_running_requests"`
}

// liveLoads reads every rank's current load; nil while killed or silent.
func (s *Server) liveLoads() []loadEntry {
	e := s.eng.Load()
	if e == nil || s.silent.Load() {
		return []loadEntry{}
	}
	now := time.Now()
	out := make([]loadEntry, 0, len(e.ranks))
	for _, r := range e.ranks {
		st := r.stats(now)
		out = append(out, loadEntry{
			DPRank: r.id, NumRunningReqs: st.Running, NumWaitingReqs: st.Waiting, NumReqs: st.Running + st.Waiting,
			NumUsedTokens: st.KVUsed, MaxTotalNumTokens: st.Capacity, TokenUsage: st.usage(),
			GenThroughput: st.Throughput, Utilization: float64(st.Running) / float64(st.Window),
			MaxRunningRequests: st.Window,
		})
	}
	return out
}

func (s *Server) handleLoads(w http.ResponseWriter, _ *http.Request) {
	if s.garbage.Load() {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(garbageJSON))
		return
	}
	loads := s.liveLoads()
	writeJSON(w, map[string]any{
		"timestamp":     time.Now().UTC().Format(time.RFC3339Nano),
		"dp_rank_count": len(loads),
		"loads":         loads,
	})
}

func (s *Server) handleGetLoad(w http.ResponseWriter, _ *http.Request) {
	if s.garbage.Load() {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(garbageJSON))
		return
	}
	type legacy struct {
		DPRank         int `json:"dp_rank"`
		NumReqs        int `json:"num_reqs"`
		NumWaitingReqs int `json:"num_waiting_reqs"`
		NumTokens      int `json:"num_tokens"`
	}
	out := []legacy{}
	for _, l := range s.liveLoads() {
		out = append(out, legacy{l.DPRank, l.NumReqs, l.NumWaitingReqs, l.NumUsedTokens})
	}
	writeJSON(w, out)
}

func (s *Server) handleServerInfo(w http.ResponseWriter, _ *http.Request) {
	mode := "null"
	if s.opts.Role != RoleRegular {
		mode = s.opts.Role
	}
	var thr float64
	for _, l := range s.liveLoads() {
		thr += l.GenThroughput
	}
	// SGLang reports its KV bootstrap port here; the simulator hands KV over
	// on its HTTP port (/sim/bootstrap), so a prefill engine reports that.
	var bootstrapPort any
	if s.opts.Role == RolePrefill {
		if _, p, err := net.SplitHostPort(s.addr); err == nil {
			bootstrapPort, _ = strconv.Atoi(p)
		}
	}
	writeJSON(w, map[string]any{
		"model_path": s.opts.Model, "served_model_name": s.opts.Model,
		"max_running_requests": s.opts.MaxRunningRequests, "max_total_tokens": s.opts.KVCapacityTokens,
		"chunked_prefill_size": s.opts.MaxBatchedTokens, "dp_size": s.opts.DPSize, "tp_size": s.opts.TPSize,
		"disaggregation_mode": mode, "disaggregation_bootstrap_port": bootstrapPort,
		"decode_log_interval": s.opts.SGLangMetricsInterval, "version": "sim",
		"internal_states": []map[string]any{{
			"max_running_requests": s.opts.MaxRunningRequests, "max_total_num_tokens": s.opts.KVCapacityTokens,
			"last_gen_throughput": thr,
		}},
	})
}

func (s *Server) handleModelInfo(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, map[string]any{"model_path": s.opts.Model, "tokenizer_path": s.opts.Model, "is_generation": true})
}

// simStats is GET /sim/stats: the engine's own queue and running batch now
// and their high-water marks (summed over DP ranks) since the last reset.
type simStats struct {
	Waiting     int    `json:"waiting"`
	Running     int    `json:"running"`
	PeakWaiting int    `json:"peak_waiting"`
	PeakRunning int    `json:"peak_running"`
	KVStreams   int    `json:"kv_streams"`
	GetLoads    int64  `json:"grpc_get_loads"`
	Preemptions uint64 `json:"preemptions"` // running requests evicted for KV since start (not reset)
	// Rooms of the running window and their idle room-seconds since start
	// (not reset): all, and those while a request was queued at the engine.
	Rooms              int     `json:"rooms"`
	RoomIdleSeconds    float64 `json:"room_idle_seconds"`
	RoomIdleQueuedSecs float64 `json:"room_idle_queued_seconds"`
}

// handleStats serves GET /sim/stats; ?reset=1 starts new high-water marks.
func (s *Server) handleStats(w http.ResponseWriter, r *http.Request) {
	e := s.eng.Load()
	out := simStats{KVStreams: s.KVStreams(), GetLoads: s.GetLoadsCalls()}
	if e != nil {
		reset := r.URL.Query().Get("reset") == "1"
		now := time.Now()
		for _, rk := range e.ranks {
			st := rk.stats(now)
			pw, pr := rk.peaks(reset)
			out.Waiting += st.Waiting
			out.Running += st.Running
			out.PeakWaiting += pw
			out.PeakRunning += pr
			out.Preemptions += st.Preempt
			out.Rooms += st.Window
			out.RoomIdleSeconds += st.IdleRooms
			out.RoomIdleQueuedSecs += st.IdleRoomsQueued
		}
	}
	writeJSON(w, out)
}
