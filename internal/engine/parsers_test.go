package engine

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func approxRanks(got, want []Rank) bool {
	if len(got) != len(want) {
		return false
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	for i := range got {
		g, w := got[i], want[i]
		if g.DPRank != w.DPRank || g.Waiting != w.Waiting || g.Running != w.Running || g.MaxRunning != w.MaxRunning || g.KVCapacity != w.KVCapacity ||
			!near(g.TokenUsage, w.TokenUsage) || !near(g.GenThroughput, w.GenThroughput) || !near(g.CacheHitRate, w.CacheHitRate) {
			return false
		}
	}
	return true
}

func TestParsersOnRecordedPayloads(t *testing.T) {
	metrics := func(parse func(r *bytes.Reader) (Report, error)) func([]byte) (Report, error) {
		return func(b []byte) (Report, error) { return parse(bytes.NewReader(b)) }
	}
	vllm := metrics(func(r *bytes.Reader) (Report, error) { return ParseVLLM(r) })
	tests := []struct {
		name      string
		file      string
		parse     func([]byte) (Report, error)
		source    Source
		ranks     []Rank
		stepCount float64
		stepWire  bool
		batchWire bool // the step count moves with token batches (SGLang)
	}{
		{
			name: "vLLM v1, two DP engines", file: "vllm_v1_dp2.txt", parse: vllm, source: SourceVLLM,
			ranks: []Rank{
				// lifetime hit rate from the prefix-cache counters: 50000/200000 and 10000/100000;
				// KV capacity from engine 0's cache_config_info (27153 blocks of 16), none for engine 1
				{DPRank: 0, Waiting: 3, Running: 48, TokenUsage: 0.6241, CacheHitRate: 0.25, KVCapacity: 434448},
				{DPRank: 1, Waiting: 9, Running: 51, TokenUsage: 0.8817, CacheHitRate: 0.1},
			},
			stepCount: 12000 + 11500, stepWire: true,
		},
		{
			name: "vLLM v0 (gpu_cache_usage_perc, no engine label)", file: "vllm_v0.txt", parse: vllm, source: SourceVLLM,
			ranks: []Rank{{DPRank: 0, Waiting: 4, Running: 12, TokenUsage: 0.5712, GenThroughput: 655.3, CacheHitRate: 0.35, KVCapacity: 7334 * 16}},
		},
		{
			name: "SGLang /v1/loads, two DP ranks out of order", file: "sglang_v1_loads_dp2.json", parse: ParseSGLangLoads, source: SourceSGLangLoads,
			ranks: []Rank{
				{DPRank: 0, Waiting: 2, Running: 58, TokenUsage: 0.7362, GenThroughput: 2143.9, CacheHitRate: 0.3877, MaxRunning: 128, KVCapacity: 231072},
				{DPRank: 1, Waiting: 7, Running: 61, TokenUsage: 0.8713, GenThroughput: 2210.41, CacheHitRate: 0.4122, MaxRunning: 128, KVCapacity: 231072},
			},
			stepCount: 201344 + 170112, batchWire: true, // KV tokens in use
		},
		{
			name: "SGLang /get_load (num_reqs counts waiting too)", file: "sglang_get_load_dp2.json", parse: ParseSGLangGetLoad, source: SourceSGLangGetLoad,
			ranks:     []Rank{{DPRank: 0, Waiting: 3, Running: 11}, {DPRank: 1, Waiting: 0, Running: 9}},
			stepCount: 40122 + 20877, batchWire: true, // num_tokens: KV tokens in use
		},
		{
			name: "SGLang /metrics, DP 2 x TP 2, tp_rank 0 read", file: "sglang_metrics_dp2_tp2.txt",
			parse: metrics(func(r *bytes.Reader) (Report, error) { return ParseSGLangMetrics(r) }), source: SourceSGLangMetrics,
			ranks: []Rank{
				{DPRank: 0, Waiting: 6, Running: 40, TokenUsage: 0.81, GenThroughput: 1530.2, CacheHitRate: 0.52},
				{DPRank: 1, Waiting: 1, Running: 35, TokenUsage: 0.62, GenThroughput: 1402.7, CacheHitRate: 0.47},
			},
			stepCount: 8.812034e+06 + 2.104411e+06, batchWire: true, // prompt + generation token counters
		},
		{
			name: "TokenSpeed, two DP ranks", file: "tokenspeed_metrics.txt",
			parse: metrics(func(r *bytes.Reader) (Report, error) { return ParseTokenSpeed(r) }), source: SourceTokenSpeed,
			ranks: []Rank{
				{DPRank: 0, Waiting: 5, Running: 22, TokenUsage: 0.375, CacheHitRate: 0.25},
				{DPRank: 1, Waiting: 0, Running: 19, TokenUsage: 0.125, CacheHitRate: 0.5},
			},
			stepCount: 901 + 899, stepWire: true,
		},
		{
			name: "Triton TRT-LLM", file: "trtllm_metrics.txt",
			parse: metrics(func(r *bytes.Reader) (Report, error) { return ParseTRTLLM(r) }), source: SourceTRTLLM,
			ranks: []Rank{{DPRank: 0, Waiting: 17, Running: 64, TokenUsage: 0.9375, MaxRunning: 64}},
		},
		{
			name: "Triton TRT-LLM without waiting or fraction", file: "trtllm_metrics_no_waiting.txt",
			parse: metrics(func(r *bytes.Reader) (Report, error) { return ParseTRTLLM(r) }), source: SourceTRTLLM,
			ranks: []Rank{{DPRank: 0, Waiting: 11 - 8, Running: 8, TokenUsage: 150.0 / 600, MaxRunning: 8}},
		},
		{
			name: "TGI with /info", file: "tgi_metrics.txt",
			parse: func(b []byte) (Report, error) {
				return ParseTGI(bytes.NewReader(b), readTestdata(t, "tgi_info.json"))
			},
			source:    SourceTGI,
			ranks:     []Rank{{DPRank: 0, Waiting: 14, Running: 32, MaxRunning: 128}},
			stepCount: 1530 + 88210, stepWire: true,
		},
		{
			name: "TGI without /info", file: "tgi_metrics.txt",
			parse:     func(b []byte) (Report, error) { return ParseTGI(bytes.NewReader(b), nil) },
			source:    SourceTGI,
			ranks:     []Rank{{DPRank: 0, Waiting: 14, Running: 32}},
			stepCount: 1530 + 88210, stepWire: true,
		},
		{
			name: "llama.cpp with a -nan sample", file: "llamacpp_metrics.txt",
			parse: metrics(func(r *bytes.Reader) (Report, error) { return ParseLlamaCpp(r) }), source: SourceLlamaCpp,
			ranks:     []Rank{{DPRank: 0, Waiting: 2, Running: 4, GenThroughput: 49.95}},
			stepCount: 19877, stepWire: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := tc.parse(readTestdata(t, tc.file))
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if rep.Source != tc.source {
				t.Errorf("source = %q, want %q", rep.Source, tc.source)
			}
			if !approxRanks(rep.Ranks, tc.ranks) {
				t.Errorf("ranks =\n %+v\nwant\n %+v", rep.Ranks, tc.ranks)
			}
			if rep.StepCount != tc.stepCount || rep.StepWire != tc.stepWire || rep.BatchWire != tc.batchWire {
				t.Errorf("step = %v/%v/%v, want %v/%v/%v", rep.StepCount, rep.StepWire, rep.BatchWire, tc.stepCount, tc.stepWire, tc.batchWire)
			}
		})
	}
}

func TestVLLMWithoutStatsIsNoReport(t *testing.T) {
	rep, err := ParseVLLM(bytes.NewReader(readTestdata(t, "vllm_disable_log_stats.txt")))
	if !errors.Is(err, ErrNoReport) || !rep.Empty() {
		t.Fatalf("got %+v, %v; want empty report and ErrNoReport", rep, err)
	}
}

func TestMetricsParsersRejectOtherWires(t *testing.T) {
	// Each wire answers "no report" for every other engine's page, so detection
	// never mistakes one engine for another.
	pages := map[Source]string{
		SourceVLLM: "vllm_v1_dp2.txt", SourceSGLangMetrics: "sglang_metrics_dp2_tp2.txt",
		SourceTokenSpeed: "tokenspeed_metrics.txt", SourceTRTLLM: "trtllm_metrics.txt",
		SourceTGI: "tgi_metrics.txt", SourceLlamaCpp: "llamacpp_metrics.txt",
	}
	wires := map[Source]func(families) (Report, error){
		SourceVLLM: fromVLLM, SourceSGLangMetrics: fromSGLangMetrics, SourceTokenSpeed: fromTokenSpeed,
		SourceTRTLLM: fromTRTLLM, SourceLlamaCpp: fromLlamaCpp,
		SourceTGI: func(fs families) (Report, error) { return fromTGI(fs, 0) },
	}
	for pageSrc, file := range pages {
		fs, err := parseFamilies(readTestdata(t, file))
		if err != nil {
			t.Fatal(err)
		}
		for wireSrc, from := range wires {
			rep, err := from(fs)
			if wireSrc == pageSrc {
				if err != nil {
					t.Errorf("%s on its own page: %v", wireSrc, err)
				}
				continue
			}
			if !errors.Is(err, ErrNoReport) || !rep.Empty() {
				t.Errorf("%s read %s's page: %+v, %v", wireSrc, pageSrc, rep, err)
			}
		}
	}
}

func TestReportAggregates(t *testing.T) {
	rep := Report{Ranks: []Rank{
		{DPRank: 0, Waiting: 3, Running: 10, TokenUsage: 0.5, GenThroughput: 100, CacheHitRate: 0.2, MaxRunning: 64},
		{DPRank: 1, Waiting: 5, Running: 12, TokenUsage: 0.9, GenThroughput: 50, CacheHitRate: 0.4, MaxRunning: 64},
	}}
	if rep.Empty() || rep.Waiting() != 8 || rep.Running() != 22 ||
		rep.GenThroughput() != 150 || math.Abs(rep.CacheHitRate()-0.3) > 1e-12 || rep.MaxRunning() != 128 {
		t.Fatalf("aggregates wrong: W%d R%d G%v H%v M%d", rep.Waiting(), rep.Running(),
			rep.GenThroughput(), rep.CacheHitRate(), rep.MaxRunning())
	}
	rep.Ranks[1].MaxRunning = 0
	if rep.MaxRunning() != 0 {
		t.Errorf("MaxRunning with a rank lacking a window = %d, want 0 (no window)", rep.MaxRunning())
	}
	var empty Report
	if !empty.Empty() || empty.MaxRunning() != 0 || empty.CacheHitRate() != 0 {
		t.Error("empty report must read as zero everywhere")
	}
}

func TestSGLangLoadsEdgeCases(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		ranks   []Rank
		noRep   bool
		parseEr bool
	}{
		{name: "empty list", body: `{"loads":[]}`, noRep: true},
		{name: "no loads key", body: `{"version":"0.5.9"}`, noRep: true},
		{name: "null loads", body: `{"loads":null}`, noRep: true},
		{name: "not JSON", body: `<html>404</html>`, parseEr: true},
		{
			name:  "repeated rank keeps the first",
			body:  `{"loads":[{"dp_rank":0,"num_waiting_reqs":4},{"dp_rank":0,"num_waiting_reqs":9}]}`,
			ranks: []Rank{{DPRank: 0, Waiting: 4}},
		},
		{
			name:  "missing dp_rank uses position; nulls read as 0",
			body:  `{"loads":[{"num_running_reqs":2,"token_usage":null},{"num_running_reqs":3.0}]}`,
			ranks: []Rank{{DPRank: 0, Running: 2}, {DPRank: 1, Running: 3}},
		},
		{
			name:  "negative counts and usage above 1 are clamped",
			body:  `{"loads":[{"dp_rank":0,"num_waiting_reqs":-5,"token_usage":1.7,"cache_hit_rate":-1}]}`,
			ranks: []Rank{{DPRank: 0, TokenUsage: 1}},
		},
		{
			name:  "malformed ranks are skipped",
			body:  `{"loads":[{"dp_rank":-1,"num_waiting_reqs":1},{"dp_rank":0.5},{"dp_rank":1e12},{"dp_rank":2,"num_waiting_reqs":1}]}`,
			ranks: []Rank{{DPRank: 2, Waiting: 1}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := ParseSGLangLoads([]byte(tc.body))
			var pe *ParseError
			switch {
			case tc.noRep:
				if !errors.Is(err, ErrNoReport) || !rep.Empty() {
					t.Fatalf("got %+v, %v; want no report", rep, err)
				}
			case tc.parseEr:
				if !errors.As(err, &pe) || !rep.Empty() {
					t.Fatalf("got %+v, %v; want a ParseError", rep, err)
				}
			default:
				if err != nil || !reflect.DeepEqual(rep.Ranks, tc.ranks) {
					t.Fatalf("got %+v, %v; want %+v", rep.Ranks, err, tc.ranks)
				}
			}
		})
	}
}

func TestSGLangGetLoadSingleObject(t *testing.T) {
	rep, err := ParseSGLangGetLoad([]byte(` {"num_reqs": 7, "num_waiting_reqs": 2, "num_tokens": 900}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := []Rank{{DPRank: 0, Waiting: 2, Running: 5}}; !reflect.DeepEqual(rep.Ranks, want) {
		t.Fatalf("ranks = %+v, want %+v", rep.Ranks, want)
	}
}

func TestTPRanksUnderDPAttention(t *testing.T) {
	// Under DP attention SGLang numbers TP ranks globally: DP rank 1 of a
	// TP-8/DP-2 server has tp_rank 4..7 and no tp_rank 0. The lowest TP rank
	// of each DP rank is read, so no DP rank goes missing.
	page := `# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{dp_rank="0",tp_rank="1"} 3
sglang:num_queue_reqs{dp_rank="0",tp_rank="0"} 3
sglang:num_queue_reqs{dp_rank="1",tp_rank="5"} 8
sglang:num_queue_reqs{dp_rank="1",tp_rank="4"} 7
sglang:num_queue_reqs{dp_rank="x",tp_rank="0"} 99
`
	rep, err := ParseSGLangMetrics(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	if want := []Rank{{DPRank: 0, Waiting: 3}, {DPRank: 1, Waiting: 7}}; !reflect.DeepEqual(rep.Ranks, want) {
		t.Fatalf("ranks = %+v, want %+v", rep.Ranks, want)
	}
}

func TestStepCounterWithoutTypeLine(t *testing.T) {
	// Without a TYPE line the histogram's _count is a family of its own.
	page := "vllm:num_requests_waiting 1\nvllm:iteration_tokens_total_count 42\n"
	rep, err := ParseVLLM(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	if rep.StepCount != 42 || !rep.StepWire {
		t.Fatalf("step = %v/%v, want 42/true", rep.StepCount, rep.StepWire)
	}
}

func TestCompletionCounterIsNotAStepWire(t *testing.T) {
	// generation_tokens_total may move only when a request completes (as in
	// some simulators): it must never pass for a per-step counter.
	page := "vllm:num_requests_waiting 1\nvllm:generation_tokens_total 900\n"
	rep, err := ParseVLLM(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	if rep.StepWire || rep.StepCount != 0 {
		t.Fatalf("step = %v/%v, want 0/false", rep.StepCount, rep.StepWire)
	}
}

func TestFixNegativeNaNLeavesInputAlone(t *testing.T) {
	in := []byte("a -nan\nb{x=\"-nan\"} 1\nc -NaN\n")
	orig := bytes.Clone(in)
	out := fixNegativeNaN(in)
	if !bytes.Equal(in, orig) {
		t.Fatal("input modified")
	}
	if want := "a NaN\nb{x=\"-nan\"} 1\nc NaN\n"; string(out) != want {
		t.Fatalf("got %q, want %q", out, want)
	}
	if _, err := parseFamilies(out); err != nil {
		t.Fatalf("fixed page does not parse: %v", err)
	}
}

func TestMalformedPageIsParseErrorNotReport(t *testing.T) {
	_, err := ParseVLLM(strings.NewReader("vllm:num_requests_waiting{engine=\"0\" 3\n"))
	var pe *ParseError
	if !errors.As(err, &pe) || IsTransportFailure(err) {
		t.Fatalf("err = %v, want a ParseError that is not a transport failure", err)
	}
}

func TestTooManyRanksIsAParseError(t *testing.T) {
	// A real engine runs a few dozen DP ranks; a page claiming thousands is
	// refused rather than walked quadratically.
	var page, loads strings.Builder
	loads.WriteString(`{"loads":[`)
	for i := range maxRanks + 1 {
		fmt.Fprintf(&page, "vllm:num_requests_waiting{engine=\"%d\"} 1\n", i)
		if i > 0 {
			loads.WriteByte(',')
		}
		fmt.Fprintf(&loads, `{"dp_rank":%d,"num_waiting_reqs":1}`, i)
	}
	loads.WriteString(`]}`)
	var pe *ParseError
	if rep, err := ParseVLLM(strings.NewReader(page.String())); !errors.As(err, &pe) || !rep.Empty() {
		t.Errorf("vLLM page with %d ranks: %d ranks, %v", maxRanks+1, len(rep.Ranks), err)
	}
	if rep, err := ParseSGLangLoads([]byte(loads.String())); !errors.As(err, &pe) || !rep.Empty() {
		t.Errorf("/v1/loads with %d ranks: %d ranks, %v", maxRanks+1, len(rep.Ranks), err)
	}
}

// TestVLLMConfigInfoWindow: a max_num_seqs label on vllm:cache_config_info
// is the engine's window (per engine label, or for every rank without one);
// stock vLLM's labels (the KV cache's) give none, nor do bad values.
func TestVLLMConfigInfoWindow(t *testing.T) {
	page := func(info string) string {
		return "# TYPE vllm:num_requests_running gauge\n" +
			"vllm:num_requests_running{engine=\"0\"} 3\nvllm:num_requests_running{engine=\"1\"} 4\n" +
			"# TYPE vllm:cache_config_info gauge\n" + info
	}
	for _, c := range []struct {
		name, info string
		want       [2]int64
	}{
		{"stock vLLM: KV labels only", `vllm:cache_config_info{block_size="16",num_gpu_blocks="4096"} 1` + "\n", [2]int64{0, 0}},
		{"one series for every rank", `vllm:cache_config_info{block_size="16",max_num_seqs="256"} 1` + "\n", [2]int64{256, 256}},
		{"per engine", `vllm:cache_config_info{engine="0",max_num_seqs="8"} 1` + "\n" + `vllm:cache_config_info{engine="1",max_num_seqs="16"} 1` + "\n", [2]int64{8, 16}},
		{"bad values", `vllm:cache_config_info{max_num_seqs="-3"} 1` + "\n" + `vllm:cache_config_info{engine="x",max_num_seqs="9"} 1` + "\n" +
			`vllm:cache_config_info{max_num_seqs="1e9999"} 1` + "\n", [2]int64{0, 0}},
	} {
		rep, err := ParseVLLM(strings.NewReader(page(c.info)))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := [2]int64{rep.Ranks[0].MaxRunning, rep.Ranks[1].MaxRunning}; got != c.want {
			t.Errorf("%s: windows %v, want %v", c.name, got, c.want)
		}
	}
}

// TestVLLMConfigInfoKVCapacity: num_gpu_blocks × block_size on
// vllm:cache_config_info is the engine's KV capacity in tokens (per engine
// label, or for every rank without one); a missing half, a value that is not
// a positive integer ("None" on CPU blocks' side, negative, huge) or a
// product past the bound gives none.
func TestVLLMConfigInfoKVCapacity(t *testing.T) {
	page := func(info string) string {
		return "# TYPE vllm:num_requests_running gauge\n" +
			"vllm:num_requests_running{engine=\"0\"} 3\nvllm:num_requests_running{engine=\"1\"} 4\n" +
			"# TYPE vllm:cache_config_info gauge\n" + info
	}
	for _, c := range []struct {
		name, info string
		want       [2]int64
	}{
		{"one series for every rank", `vllm:cache_config_info{block_size="16",num_gpu_blocks="4096"} 1` + "\n", [2]int64{65536, 65536}},
		{"per engine", `vllm:cache_config_info{engine="0",block_size="16",num_gpu_blocks="100"} 1` + "\n" +
			`vllm:cache_config_info{engine="1",block_size="32",num_gpu_blocks="100"} 1` + "\n", [2]int64{1600, 3200}},
		{"blocks without a size", `vllm:cache_config_info{num_gpu_blocks="4096"} 1` + "\n", [2]int64{0, 0}},
		{"not counts", `vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1` + "\n" +
			`vllm:cache_config_info{engine="1",block_size="-16",num_gpu_blocks="8"} 1` + "\n", [2]int64{0, 0}},
		{"a product past the bound", `vllm:cache_config_info{block_size="1099511627776",num_gpu_blocks="1099511627776"} 1` + "\n", [2]int64{0, 0}},
	} {
		rep, err := ParseVLLM(strings.NewReader(page(c.info)))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := [2]int64{rep.Ranks[0].KVCapacity, rep.Ranks[1].KVCapacity}; got != c.want {
			t.Errorf("%s: KV capacities %v, want %v", c.name, got, c.want)
		}
	}
}

// TestSGLangMetricsKVCapacity: sglang:max_total_num_tokens on /metrics is
// each DP rank's KV capacity, as max_total_num_tokens is on /v1/loads.
func TestSGLangMetricsKVCapacity(t *testing.T) {
	page := "# TYPE sglang:num_running_reqs gauge\n" +
		"sglang:num_running_reqs{dp_rank=\"0\",tp_rank=\"0\"} 3\nsglang:num_running_reqs{dp_rank=\"1\",tp_rank=\"0\"} 4\n" +
		"# TYPE sglang:max_total_num_tokens gauge\n" +
		"sglang:max_total_num_tokens{dp_rank=\"0\",tp_rank=\"0\"} 50000\nsglang:max_total_num_tokens{dp_rank=\"1\",tp_rank=\"0\"} NaN\n"
	rep, err := ParseSGLangMetrics(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	if got := [2]int64{rep.Ranks[0].KVCapacity, rep.Ranks[1].KVCapacity}; got != [2]int64{50000, 0} {
		t.Errorf("KV capacities %v, want [50000 0]", got)
	}
}
