package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
)

// field names a Rank field and the payload names it may be read from: when
// none of them occurs in the input, the field must stay 0 on every rank.
type field struct {
	get     func(Rank) float64
	sources []string
}

var (
	waitingF = func(r Rank) float64 { return float64(r.Waiting) }
	runningF = func(r Rank) float64 { return float64(r.Running) }
	usageF   = func(r Rank) float64 { return r.TokenUsage }
	genF     = func(r Rank) float64 { return r.GenThroughput }
	hitF     = func(r Rank) float64 { return r.CacheHitRate }
	maxF     = func(r Rank) float64 { return float64(r.MaxRunning) }
)

// checkReport asserts what every parser promises for any input: an error
// means an empty report; ranks are sorted, unique and non-negative; counts
// are non-negative; ratios lie in [0, 1]; rates are finite and non-negative;
// and no number appears that the payload did not carry.
func checkReport(t *testing.T, in []byte, rep Report, err error, fields []field) {
	t.Helper()
	if err != nil {
		if !rep.Empty() {
			t.Fatalf("error %v with a non-empty report %+v", err, rep)
		}
		if IsTransportFailure(err) {
			t.Fatalf("a parser returned a transport failure: %v", err)
		}
		return
	}
	if rep.Empty() {
		t.Fatal("no error but an empty report")
	}
	if rep.Source == "" {
		t.Fatal("report without a source")
	}
	for i, r := range rep.Ranks {
		if r.DPRank < 0 || (i > 0 && r.DPRank <= rep.Ranks[i-1].DPRank) {
			t.Fatalf("ranks not sorted and unique: %+v", rep.Ranks)
		}
		if r.Waiting < 0 || r.Running < 0 || r.MaxRunning < 0 {
			t.Fatalf("negative count: %+v", r)
		}
		if !(r.TokenUsage >= 0 && r.TokenUsage <= 1) || !(r.CacheHitRate >= 0 && r.CacheHitRate <= 1) {
			t.Fatalf("ratio out of [0,1]: %+v", r)
		}
		if !(r.GenThroughput >= 0) || math.IsInf(r.GenThroughput, 0) {
			t.Fatalf("bad throughput: %+v", r)
		}
	}
	if !(rep.StepCount >= 0) || math.IsInf(rep.StepCount, 0) || (rep.StepCount > 0 && !rep.StepWire && !rep.BatchWire) || (rep.StepWire && rep.BatchWire) {
		t.Fatalf("bad step counter %v/%v", rep.StepCount, rep.StepWire)
	}
	lower := bytes.ToLower(in) // JSON keys match case-insensitively
	for _, f := range fields {
		present := false
		for _, s := range f.sources {
			present = present || bytes.Contains(lower, []byte(s))
		}
		if present {
			continue
		}
		for _, r := range rep.Ranks {
			if f.get(r) != 0 {
				t.Fatalf("rank %+v carries a value absent from the payload (%v)", r, f.sources)
			}
		}
	}
}

func addSeeds(f *testing.F, files ...string) {
	for _, name := range files {
		f.Add(readTestdata(f, name))
	}
}

var allPages = []string{
	"vllm_v1_dp2.txt", "vllm_v0.txt", "vllm_disable_log_stats.txt", "sglang_metrics_dp2_tp2.txt",
	"tokenspeed_metrics.txt", "trtllm_metrics.txt", "trtllm_metrics_no_waiting.txt", "tgi_metrics.txt", "llamacpp_metrics.txt",
}

func FuzzParseVLLM(f *testing.F) {
	addSeeds(f, allPages...)
	f.Add([]byte("vllm:num_requests_waiting{engine=\"3\"} -2\nvllm:kv_cache_usage_perc{engine=\"3\"} NaN\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		rep, err := ParseVLLM(bytes.NewReader(in))
		checkReport(t, in, rep, err, []field{
			{waitingF, []string{"vllm:num_requests_waiting"}},
			{runningF, []string{"vllm:num_requests_running"}},
			{usageF, []string{"cache_usage_perc"}},
			{genF, []string{"vllm:avg_generation_throughput_toks_per_s"}},
			{hitF, []string{"prefix_cache"}},
			{maxF, nil},
		})
	})
}

func FuzzParseSGLangLoads(f *testing.F) {
	addSeeds(f, "sglang_v1_loads_dp2.json", "sglang_get_load_dp2.json")
	f.Add([]byte(`{"loads":[{"dp_rank":1e300,"num_waiting_reqs":1e300},{"num_running_reqs":-1}]}`))
	f.Add([]byte(`{"loads":[null,{"DP_RANK":2,"num_waiting_reqs":3,"num_waiting_reqs":null}],"x":[{"a":"\u00e9\n"},true,false,-0.5e-3]}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		rep, err := ParseSGLangLoads(in)
		checkReport(t, in, rep, err, []field{
			{waitingF, []string{"num_waiting_reqs"}},
			{runningF, []string{"num_running_reqs"}},
			{usageF, []string{"token_usage"}},
			{genF, []string{"gen_throughput"}},
			{hitF, []string{"cache_hit_rate"}},
			{maxF, []string{"max_running_requests"}},
		})
		// The scanner must agree with encoding/json wherever their documented
		// semantics meet: ASCII keys without escapes, one "loads" key (for a
		// repeated one, encoding/json merges into the old elements).
		if !comparableWithStd(in) {
			return
		}
		want, werr := parseSGLangLoadsStd(in)
		if (err == nil) != (werr == nil) || errors.Is(err, ErrNoReport) != errors.Is(werr, ErrNoReport) {
			t.Fatalf("scanner err %v, encoding/json err %v", err, werr)
		}
		if !reflect.DeepEqual(rep, want) {
			t.Fatalf("scanner %+v, encoding/json %+v", rep, want)
		}
	})
}

func comparableWithStd(in []byte) bool {
	if bytes.IndexByte(in, '\\') >= 0 || bytes.Count(bytes.ToLower(in), []byte(`"loads"`)) > 1 {
		return false
	}
	for _, c := range in {
		if c >= 0x80 {
			return false
		}
	}
	return true
}

// parseSGLangLoadsStd is the straightforward encoding/json decode the
// scanner replaces, kept as the reference it is fuzzed against.
func parseSGLangLoadsStd(body []byte) (Report, error) {
	var v struct {
		Loads []struct {
			DPRank             *float64 `json:"dp_rank"`
			NumRunningReqs     float64  `json:"num_running_reqs"`
			NumWaitingReqs     float64  `json:"num_waiting_reqs"`
			TokenUsage         float64  `json:"token_usage"`
			GenThroughput      float64  `json:"gen_throughput"`
			CacheHitRate       float64  `json:"cache_hit_rate"`
			MaxRunningRequests float64  `json:"max_running_requests"`
			MaxTotalNumTokens  float64  `json:"max_total_num_tokens"`
			NumUsedTokens      *float64 `json:"num_used_tokens"`
		} `json:"loads"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return Report{}, &ParseError{Wire: "sglang /v1/loads", Err: err}
	}
	s := rankSet{ranks: make([]Rank, 0, 8)}
	var used float64
	hasUsed := false
	for i, l := range v.Loads {
		e := loadsEntry{running: l.NumRunningReqs, waiting: l.NumWaitingReqs, usage: l.TokenUsage,
			gen: l.GenThroughput, hitRate: l.CacheHitRate, maxRunning: l.MaxRunningRequests, kvCapacity: l.MaxTotalNumTokens}
		if l.DPRank != nil {
			e.dp, e.hasDP = *l.DPRank, true
		}
		addLoadsEntry(&s, e, i)
		if l.NumUsedTokens != nil {
			used, hasUsed = used+count64(*l.NumUsedTokens), true
		}
	}
	rep, err := s.report(SourceSGLangLoads, "sglang /v1/loads: no ranks")
	if err == nil && hasUsed {
		rep.StepCount, rep.BatchWire = used, true
	}
	return rep, err
}

func FuzzParseSGLangGetLoad(f *testing.F) {
	addSeeds(f, "sglang_get_load_dp2.json", "sglang_v1_loads_dp2.json")
	f.Add([]byte(`{"num_reqs":3,"num_waiting_reqs":9}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		rep, err := ParseSGLangGetLoad(in)
		checkReport(t, in, rep, err, []field{
			{waitingF, []string{"num_waiting_reqs"}},
			{runningF, []string{"num_reqs"}},
			{usageF, nil}, {genF, nil}, {hitF, nil}, {maxF, nil},
		})
	})
}

func FuzzParseSGLangMetrics(f *testing.F) {
	addSeeds(f, allPages...)
	f.Fuzz(func(t *testing.T, in []byte) {
		rep, err := ParseSGLangMetrics(bytes.NewReader(in))
		checkReport(t, in, rep, err, []field{
			{waitingF, []string{"sglang:num_queue_reqs"}},
			{runningF, []string{"sglang:num_running_reqs"}},
			{usageF, []string{"sglang:token_usage"}},
			{genF, []string{"sglang:gen_throughput"}},
			{hitF, []string{"sglang:cache_hit_rate"}},
			{maxF, nil},
		})
		if rep.StepWire {
			t.Fatal("SGLang /metrics is not a step wire")
		}
	})
}

func FuzzParseTokenSpeed(f *testing.F) {
	addSeeds(f, allPages...)
	f.Fuzz(func(t *testing.T, in []byte) {
		rep, err := ParseTokenSpeed(bytes.NewReader(in))
		checkReport(t, in, rep, err, []field{
			{waitingF, []string{"tokenspeed:num_requests_waiting"}},
			{runningF, []string{"tokenspeed:num_requests_running"}},
			{usageF, []string{"tokenspeed:kv_cache_usage_perc"}},
			{genF, nil},
			{hitF, []string{"tokenspeed:prefix_cache_hits_total"}},
			{maxF, nil},
		})
	})
}

func FuzzParseTRTLLM(f *testing.F) {
	addSeeds(f, allPages...)
	f.Fuzz(func(t *testing.T, in []byte) {
		rep, err := ParseTRTLLM(bytes.NewReader(in))
		checkReport(t, in, rep, err, []field{
			{waitingF, []string{"nv_trt_llm_request_metrics"}},
			{runningF, []string{"nv_trt_llm_request_metrics"}},
			{usageF, []string{"nv_trt_llm_kv_cache_block_metrics"}},
			{genF, nil}, {hitF, nil},
			{maxF, []string{"nv_trt_llm_request_metrics"}},
		})
		if len(rep.Ranks) > 1 {
			t.Fatalf("TRT-LLM serves one rank, got %d", len(rep.Ranks))
		}
	})
}

func FuzzParseTGI(f *testing.F) {
	info := readTestdata(f, "tgi_info.json")
	for _, name := range allPages {
		f.Add(readTestdata(f, name), info)
		f.Add(readTestdata(f, name), []byte(nil))
	}
	f.Add([]byte("tgi_queue_size 3\n"), []byte(`{"max_concurrent_requests":-4}`))
	f.Fuzz(func(t *testing.T, metrics, info []byte) {
		rep, err := ParseTGI(bytes.NewReader(metrics), info)
		in := append(append([]byte{}, metrics...), info...)
		checkReport(t, in, rep, err, []field{
			{waitingF, []string{"tgi_queue_size"}},
			{runningF, []string{"tgi_batch_current_size"}},
			{usageF, nil}, {hitF, nil}, {genF, nil},
			{maxF, []string{"max_concurrent_requests"}},
		})
	})
}

func FuzzParseLlamaCpp(f *testing.F) {
	addSeeds(f, allPages...)
	f.Add([]byte("llamacpp:requests_deferred -nan\nllamacpp:requests_processing\t-NAN\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		rep, err := ParseLlamaCpp(bytes.NewReader(in))
		checkReport(t, in, rep, err, []field{
			{waitingF, []string{"llamacpp:requests_deferred"}},
			{runningF, []string{"llamacpp:requests_processing"}},
			{usageF, []string{"llamacpp:kv_cache_usage_ratio"}},
			{genF, []string{"llamacpp:predicted_tokens_seconds"}},
			{hitF, nil}, {maxF, nil},
		})
	})
}

func BenchmarkParseVLLM(b *testing.B) {
	page := readTestdata(b, "vllm_v1_dp2.txt")
	b.SetBytes(int64(len(page)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseVLLM(bytes.NewReader(page)); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseSGLangLoads(b *testing.B) {
	for _, bc := range []struct{ name, file string }{
		{"include=all,dp2", "sglang_v1_loads_dp2.json"},
		{"include=core,dp8", "sglang_v1_loads_core_dp8.json"},
	} {
		body := readTestdata(b, bc.file)
		for _, p := range []struct {
			name  string
			parse func([]byte) (Report, error)
		}{{"scanner", ParseSGLangLoads}, {"encoding-json", parseSGLangLoadsStd}} {
			b.Run(bc.name+"/"+p.name, func(b *testing.B) {
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				for b.Loop() {
					if _, err := p.parse(body); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// TestLoadsScannerAgreesWithEncodingJSON checks the scanner against
// encoding/json on hand-picked edge cases and on every truncation and
// single-byte mutation of a recorded answer.
func TestLoadsScannerAgreesWithEncodingJSON(t *testing.T) {
	agree := func(t *testing.T, in []byte) {
		t.Helper()
		got, err := ParseSGLangLoads(in)
		want, werr := parseSGLangLoadsStd(in)
		if (err == nil) != (werr == nil) || errors.Is(err, ErrNoReport) != errors.Is(werr, ErrNoReport) {
			t.Fatalf("%q: scanner err %v, encoding/json err %v", in, err, werr)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: scanner %+v, encoding/json %+v", in, got, want)
		}
	}
	for _, in := range []string{
		``, ` `, `null`, ` null `, `nul`, `{}`, `[]`, `"loads"`, `1`, `true`,
		`{"loads":null}`, `{"loads":[]}`, `{"loads":{}}`, `{"loads":[1]}`, `{"loads":["x"]}`, `{"loads":[[]]}`,
		`{"loads":[null]}`, `{"loads":[{}]}`, `{"loads":[{}],}`, `{"loads":[{},]}`, `{"loads" [{}]}`, `{loads:[]}`,
		`{"loads":[{"dp_rank":"1"}]}`, `{"loads":[{"dp_rank":true}]}`, `{"loads":[{"num_waiting_reqs":1e400}]}`,
		`{"loads":[{"other":1e400}]}`, `{"loads":[{"num_waiting_reqs":01}]}`, `{"loads":[{"num_waiting_reqs":-}]}`,
		`{"loads":[{"num_waiting_reqs":1.}]}`, `{"loads":[{"num_waiting_reqs":.5}]}`, `{"loads":[{"num_waiting_reqs":+1}]}`,
		`{"loads":[{"num_waiting_reqs":1e}]}`, `{"loads":[{"num_waiting_reqs":1E+2}]}`, `{"loads":[{"num_waiting_reqs":-0.0}]}`,
		`{"loads":[{"num_waiting_reqs":NaN}]}`, `{"loads":[{"num_waiting_reqs":123456789012345678901234}]}`,
		`{"loads":[{"num_waiting_reqs":2,"num_waiting_reqs":null}]}`, `{"loads":[{"dp_rank":3,"dp_rank":null}]}`,
		`{"loads":[{"Num_Waiting_Reqs":4}]}`, `{"loads":[{"x":{"y":[1,{"z":"\u00e9\n\"\\"}]}}]}`,
		"{\"loads\":[{\"x\":\"a\tb\"}]}", `{"loads":[{"x":"\q"}]}`, `{"loads":[{"x":"\u12"}]}`, `{"loads":[{"x":"abc`,
		`{"loads":[{"dp_rank":1}]} x`, `{"loads":[{"dp_rank":1}]}{}`, "\t{\"loads\" :\r\n[ { \"dp_rank\" : 1 } ] }\n",
		`{"a":[tru]}`, `{"a":[fals]}`, `{"a":nulll}`, `{"a":-01}`, `{"a":1}}`, `{"a":[1}`,
		strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
		`{"loads":[` + strings.Repeat("[", 9990) + strings.Repeat("]", 9990) + `]}`,
	} {
		agree(t, []byte(in))
	}
	body := readTestdata(t, "sglang_v1_loads_dp2.json")
	for n := range len(body) {
		agree(t, body[:n])
	}
	for i := range body {
		for _, c := range []byte{'"', '}', ']', ',', ':', '0', 'e', '\\', 0x01} {
			mutated := bytes.Clone(body)
			mutated[i] = c
			agree(t, mutated)
		}
		agree(t, append(bytes.Clone(body[:i]), body[i+1:]...))
	}
}
