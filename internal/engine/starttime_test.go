package engine

import (
	"bytes"
	"strings"
	"testing"
)

// TestStartTimeRecorded: the recorded vLLM page's process_start_time_seconds
// is the report's StartTime; a recorded page without one reads 0.
func TestStartTimeRecorded(t *testing.T) {
	rep, err := ParseVLLM(bytes.NewReader(readTestdata(t, "vllm_v1_dp2.txt")))
	if err != nil {
		t.Fatal(err)
	}
	if rep.StartTime != 1.75463172318e+09 {
		t.Errorf("vLLM StartTime = %v, want 1.75463172318e+09", rep.StartTime)
	}
	rep, err = ParseSGLangMetrics(bytes.NewReader(readTestdata(t, "sglang_metrics_dp2_tp2.txt")))
	if err != nil {
		t.Fatal(err)
	}
	if rep.StartTime != 0 {
		t.Errorf("SGLang page without process_start_time_seconds: StartTime = %v, want 0", rep.StartTime)
	}
}

// TestStartTimeEveryMetricsWire: every /metrics wire reads the start time,
// and a missing or malformed one (NaN, negative, zero, infinite) reads 0
// without voiding the load.
func TestStartTimeEveryMetricsWire(t *testing.T) {
	wires := []struct {
		name  string
		page  string
		parse func(string) (Report, error)
	}{
		{"vllm", "vllm:num_requests_waiting 1\nvllm:num_requests_running 2\nvllm:kv_cache_usage_perc 0.5\n",
			func(s string) (Report, error) { return ParseVLLM(strings.NewReader(s)) }},
		{"sglang", "sglang:num_queue_reqs 1\nsglang:num_running_reqs 2\nsglang:token_usage 0.5\n",
			func(s string) (Report, error) { return ParseSGLangMetrics(strings.NewReader(s)) }},
		{"tokenspeed", "tokenspeed:num_requests_waiting 1\ntokenspeed:num_requests_running 2\n",
			func(s string) (Report, error) { return ParseTokenSpeed(strings.NewReader(s)) }},
		{"trtllm", "nv_trt_llm_request_metrics{request_type=\"waiting\"} 1\nnv_trt_llm_request_metrics{request_type=\"scheduled\"} 2\n",
			func(s string) (Report, error) { return ParseTRTLLM(strings.NewReader(s)) }},
		{"tgi", "tgi_queue_size 1\ntgi_batch_current_size 2\n",
			func(s string) (Report, error) { return ParseTGI(strings.NewReader(s), nil) }},
		{"llamacpp", "llamacpp:requests_processing 2\nllamacpp:requests_deferred 1\n",
			func(s string) (Report, error) { return ParseLlamaCpp(strings.NewReader(s)) }},
	}
	values := []struct {
		line string
		want float64
	}{
		{"process_start_time_seconds 1.7e+09\n", 1.7e9},
		{"# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds 1.8e+09\n", 1.8e9},
		{"", 0},
		{"process_start_time_seconds NaN\n", 0},
		{"process_start_time_seconds -5\n", 0},
		{"process_start_time_seconds 0\n", 0},
		{"process_start_time_seconds +Inf\n", 0},
	}
	for _, w := range wires {
		for _, v := range values {
			rep, err := w.parse(w.page + v.line)
			if err != nil {
				t.Fatalf("%s with %q: %v", w.name, v.line, err)
			}
			if rep.Empty() || rep.Running() != 2 {
				t.Errorf("%s with %q: load %+v, want running 2", w.name, v.line, rep.Ranks)
			}
			if rep.StartTime != v.want {
				t.Errorf("%s with %q: StartTime = %v, want %v", w.name, v.line, rep.StartTime, v.want)
			}
		}
	}
}
