package bench

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

func TestParseDist(t *testing.T) {
	for in, want := range map[string]Dist{"48": {48, 48, false}, "32-64": {32, 64, false}, "64~16384": {64, 16384, true}} {
		got, err := ParseDist(in)
		if err != nil || got != want || got.String() != in {
			t.Errorf("ParseDist(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "0", "64-32", "a-b", "5-", "64~32", "1~x"} {
		if _, err := ParseDist(bad); err == nil {
			t.Errorf("ParseDist(%q) accepted", bad)
		}
	}
}

// A log-uniform draw stays in its bounds, puts as many draws in each
// doubling of length, and averages what Mean says.
func TestLogUniformDist(t *testing.T) {
	d, err := ParseDist("64~16384")
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	const n = 200000
	var sum float64
	var below128, above8192 int
	for range n {
		v := d.Sample(r)
		if v < 64 || v > 16384 {
			t.Fatalf("sample %d outside 64..16384", v)
		}
		sum += float64(v)
		if v < 128 {
			below128++
		}
		if v >= 8192 {
			above8192++
		}
	}
	// 8 doublings: each holds an eighth of the draws.
	for name, got := range map[string]int{"[64, 128)": below128, "[8192, 16384]": above8192} {
		if share := float64(got) / n; math.Abs(share-0.125) > 0.005 {
			t.Errorf("share in %s = %.4f, want 0.125", name, share)
		}
	}
	if mean := sum / n; math.Abs(mean-d.Mean())/d.Mean() > 0.01 {
		t.Errorf("sample mean %.0f, Mean() %.0f", mean, d.Mean())
	}
}

func TestPercentilesNearestRank(t *testing.T) {
	xs := make([]float64, 100)
	for i := range xs {
		xs[i] = float64(100 - i) // 100..1, unsorted
	}
	p := PercentilesOf(xs)
	if p.P50 != 50 || p.P90 != 90 || p.P99 != 99 || p.Max != 100 || p.N != 100 {
		t.Errorf("PercentilesOf(1..100) = %+v", p)
	}
	if (PercentilesOf(nil) != Percentiles{}) {
		t.Error("empty sample must give zero percentiles")
	}
}

func TestSummarizeCountsShedsErrorsAndGoodput(t *testing.T) {
	// A 10 s window: warm-up 2 s. Each completed request streams 3 tokens.
	itl := []float64{0.5, 0.5}
	records := []Record{
		{Start: 3, Status: 200, Completed: true, TTFT: 0.2, ITL: itl, Tokens: 3, E2E: 1.2},   // meets 1 s
		{Start: 4, Status: 200, Completed: true, TTFT: 2.0, ITL: itl, Tokens: 3, E2E: 3},     // misses 1 s
		{Start: 9.5, Status: 200, Completed: true, TTFT: 0.1, ITL: itl, Tokens: 3, E2E: 1.1}, // 1 token inside window
		{Start: 5, Status: 503, Shed: true, ErrorCode: ShedCode, RetryAfter: 1},              // shed
		{Start: 5, Status: 503, ErrorCode: "no_available_workers", Error: "http 503 x"},      // 503 but an error
		{Start: 6, Error: "timeout"},
	}
	s := Summarize(records, 10*time.Second, time.Second)
	if s.Requests != 6 || s.Completed != 3 || s.Shed != 1 || s.Errors != 2 || s.Timeouts != 1 || s.Status503 != 2 {
		t.Errorf("counts: %+v", s)
	}
	if math.Abs(s.Rate503-2.0/6) > 1e-9 {
		t.Errorf("503 rate %v, want 1/3", s.Rate503)
	}
	// Goodput: 3 tokens + 1 token inside [2, 10] from requests meeting 1 s, over 8 s.
	if math.Abs(s.Goodput-4.0/8) > 1e-9 || math.Abs(s.Throughput-7.0/8) > 1e-9 {
		t.Errorf("goodput %v throughput %v, want 0.5 and 0.875", s.Goodput, s.Throughput)
	}
	// Open requests: 1.2 + 3 + 0.5 s (the last cut at the window's end) over 8 s.
	if math.Abs(s.InFlight-4.7/8) > 1e-9 {
		t.Errorf("mean in flight %v, want %v", s.InFlight, 4.7/8)
	}
	if s.TTFT.N != 3 || s.TTFT.Max != 2.0 || s.ITL.N != 6 {
		t.Errorf("latency samples: TTFT %+v ITL %+v", s.TTFT, s.ITL)
	}
}

// sseServer streams n tokens per request, or sheds the first shedFirst
// requests with 503 and Retry-After 0.
func sseServer(t *testing.T, n int, shedFirst int64) (*httptest.Server, *atomic.Int64) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) <= shedFirst {
			w.Header().Set("Retry-After", "0")
			w.Header().Set("X-SMG-Error-Code", ShedCode)
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		fmt.Fprint(w, `data: {"id":"chatcmpl-2-7","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`+"\n\n")
		for range n {
			fmt.Fprint(w, `data: {"id":"chatcmpl-2-7","choices":[{"index":0,"delta":{"content":"x "},"finish_reason":null}]}`+"\n\n")
			fl.Flush()
		}
		fmt.Fprint(w, `data: {"id":"chatcmpl-2-7","choices":[{"index":0,"delta":{"content":""},"finish_reason":"length"}]}`+"\n\n")
		fmt.Fprintf(w, `data: {"id":"chatcmpl-2-7","choices":[],"usage":{"completion_tokens":%d}}`+"\n\ndata: [DONE]\n\n", n)
	}))
	t.Cleanup(srv.Close)
	return srv, &calls
}

func TestRunRecordsStreamedTokens(t *testing.T) {
	srv, calls := sseServer(t, 5, 0)
	var progress atomic.Int64
	res, err := Run(context.Background(), NewHTTPClient(), Config{URL: srv.URL, Rate: 200, Duration: 200 * time.Millisecond,
		Prompt: Dist{Min: 8, Max: 16}, Output: Dist{Min: 5, Max: 5}, Timeout: 5 * time.Second, TTFTObjective: time.Second, Seed: 3},
		func(Progress) { progress.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Records) == 0 || int64(len(res.Records)) != calls.Load() {
		t.Fatalf("%d records for %d calls", len(res.Records), calls.Load())
	}
	for _, r := range res.Records {
		if !r.Completed || r.Tokens != 5 || len(r.ITL) != 4 || r.Engine != "2" || r.TTFT <= 0 || r.E2E < r.TTFT {
			t.Fatalf("record %+v: want a completed 5-token stream from engine 2", r)
		}
	}
	if progress.Load() == 0 {
		t.Error("no progress reported")
	}
}

func TestRunHonorsRetryAfter(t *testing.T) {
	for _, honor := range []bool{false, true} {
		srv, calls := sseServer(t, 2, 2)
		c := Config{URL: srv.URL, Timeout: 5 * time.Second, HonorRetryAfter: honor, MaxRetries: 3}
		var live liveCounters
		r := doRequest(context.Background(), NewHTTPClient(), c, time.Now(), "hello", 2, nil, &live, nil)
		s := Summarize([]Record{r}, time.Second, time.Second)
		if honor && (!r.Completed || r.Attempts != 3 || calls.Load() != 3) {
			t.Errorf("honoring Retry-After: %+v after %d calls; want completed on the 3rd attempt", r, calls.Load())
		}
		if !honor && (!r.Shed || r.Attempts != 1 || r.RetryAfter != 0 || s.Shed != 1) {
			t.Errorf("not honoring: %+v; want one shed attempt", r)
		}
	}
}
