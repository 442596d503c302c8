package engine

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// fakeEngine serves recorded payloads by path and counts what it is asked.
type fakeEngine struct {
	mu     sync.Mutex
	routes map[string]string // path → body served with 200; absent paths answer 404
	status map[string]int    // path → status other than 200
	hits   map[string]int
	accept map[string]string
	query  map[string]string
}

func newFakeEngine(t *testing.T, routes map[string]string) (*fakeEngine, *httptest.Server) {
	t.Helper()
	f := &fakeEngine{routes: routes, status: map[string]int{}, hits: map[string]int{}, accept: map[string]string{}, query: map[string]string{}}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv
}

func (f *fakeEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	p := r.URL.Path
	f.hits[p]++
	f.accept[p] = r.Header.Get("Accept")
	f.query[p] = r.URL.RawQuery
	body, ok := f.routes[p]
	code := f.status[p]
	f.mu.Unlock()
	if code != 0 {
		http.Error(w, "engine error", code)
		return
	}
	if !ok {
		http.NotFound(w, r)
		return
	}
	_, _ = io.WriteString(w, body)
}

func (f *fakeEngine) set(path, body string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if body == "" {
		delete(f.routes, path)
	} else {
		f.routes[path] = body
	}
}

func (f *fakeEngine) fail(path string, code int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.status[path] = code
}

func (f *fakeEngine) counts() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int{}
	for k, v := range f.hits {
		out[k] = v
	}
	return out
}

func (f *fakeEngine) reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hits = map[string]int{}
}

func sameCounts(got, want map[string]int) bool {
	if len(got) != len(want) {
		return false
	}
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}

func TestReaderDetectsEachWire(t *testing.T) {
	td := func(name string) string { return string(readTestdata(t, name)) }
	tests := []struct {
		name   string
		routes map[string]string
		want   Source
		hits   map[string]int // requests made by the first Read
		ranks  int
	}{
		{
			name:   "vLLM wins over SGLang endpoints: /metrics is asked first",
			routes: map[string]string{"/metrics": td("vllm_v1_dp2.txt"), "/v1/loads": td("sglang_v1_loads_dp2.json")},
			want:   SourceVLLM, hits: map[string]int{"/metrics": 1}, ranks: 2,
		},
		{
			name: "SGLang /v1/loads before /get_load and /metrics",
			routes: map[string]string{"/metrics": td("sglang_metrics_dp2_tp2.txt"), "/v1/loads": td("sglang_v1_loads_dp2.json"),
				"/get_load": td("sglang_get_load_dp2.json")},
			want: SourceSGLangLoads, hits: map[string]int{"/metrics": 1, "/v1/loads": 1}, ranks: 2,
		},
		{
			name:   "SGLang /get_load when /v1/loads is missing",
			routes: map[string]string{"/metrics": td("sglang_metrics_dp2_tp2.txt"), "/get_load": td("sglang_get_load_dp2.json")},
			want:   SourceSGLangGetLoad, hits: map[string]int{"/metrics": 1, "/v1/loads": 1, "/get_load": 1}, ranks: 2,
		},
		{
			name:   "SGLang /metrics last",
			routes: map[string]string{"/metrics": td("sglang_metrics_dp2_tp2.txt")},
			want:   SourceSGLangMetrics, hits: map[string]int{"/metrics": 1, "/v1/loads": 1, "/get_load": 1}, ranks: 2,
		},
		{
			name:   "TokenSpeed",
			routes: map[string]string{"/metrics": td("tokenspeed_metrics.txt")},
			want:   SourceTokenSpeed, hits: map[string]int{"/metrics": 1, "/v1/loads": 1, "/get_load": 1}, ranks: 2,
		},
		{
			name:   "Triton TRT-LLM",
			routes: map[string]string{"/metrics": td("trtllm_metrics.txt")},
			want:   SourceTRTLLM, hits: map[string]int{"/metrics": 1, "/v1/loads": 1, "/get_load": 1}, ranks: 1,
		},
		{
			name:   "TGI, with /info read once",
			routes: map[string]string{"/metrics": td("tgi_metrics.txt"), "/info": td("tgi_info.json")},
			want:   SourceTGI, hits: map[string]int{"/metrics": 1, "/v1/loads": 1, "/get_load": 1, "/info": 1}, ranks: 1,
		},
		{
			name:   "llama.cpp",
			routes: map[string]string{"/metrics": td("llamacpp_metrics.txt")},
			want:   SourceLlamaCpp, hits: map[string]int{"/metrics": 1, "/v1/loads": 1, "/get_load": 1}, ranks: 1,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			eng, srv := newFakeEngine(t, tc.routes)
			rd := NewReader(srv.Client(), srv.URL+"/")
			rep, err := rd.Read(context.Background())
			if err != nil {
				t.Fatalf("Read: %v", err)
			}
			if rep.Source != tc.want || rd.Source() != tc.want || len(rep.Ranks) != tc.ranks {
				t.Fatalf("source %q (remembered %q), %d ranks; want %q, %d", rep.Source, rd.Source(), len(rep.Ranks), tc.want, tc.ranks)
			}
			if got := eng.counts(); !sameCounts(got, tc.hits) {
				t.Errorf("first Read asked %v, want %v", got, tc.hits)
			}
			// The wire is remembered: the next Read asks only its endpoint.
			eng.reset()
			if _, err := rd.Read(context.Background()); err != nil {
				t.Fatalf("second Read: %v", err)
			}
			wantPath := "/metrics"
			switch tc.want {
			case SourceSGLangLoads:
				wantPath = "/v1/loads"
			case SourceSGLangGetLoad:
				wantPath = "/get_load"
			}
			if got := eng.counts(); !sameCounts(got, map[string]int{wantPath: 1}) {
				t.Errorf("second Read asked %v, want only %s once", got, wantPath)
			}
		})
	}
}

func TestReaderAsksForTextFormatAndCoreLoads(t *testing.T) {
	eng, srv := newFakeEngine(t, map[string]string{"/metrics": "# nothing\n"})
	_, _ = NewReader(srv.Client(), srv.URL).Read(context.Background())
	eng.mu.Lock()
	defer eng.mu.Unlock()
	if got := eng.accept["/metrics"]; got != "text/plain; version=0.0.4" {
		t.Errorf("/metrics Accept = %q", got)
	}
	if got := eng.query["/v1/loads"]; got != "include=core" {
		t.Errorf("/v1/loads query = %q", got)
	}
}

func TestReaderNoReportWhenNoWireHasLoad(t *testing.T) {
	// vLLM with --disable-log-stats: /metrics answers with no vllm: series and
	// the SGLang endpoints do not exist.
	eng, srv := newFakeEngine(t, map[string]string{"/metrics": string(readTestdata(t, "vllm_disable_log_stats.txt"))})
	rd := NewReader(srv.Client(), srv.URL)
	rep, err := rd.Read(context.Background())
	if !errors.Is(err, ErrNoReport) || !rep.Empty() || rd.Source() != "" {
		t.Fatalf("got %+v, %v, source %q; want no report and nothing remembered", rep, err, rd.Source())
	}
	if IsTransportFailure(err) {
		t.Error("no report is not a transport failure")
	}
	for _, why := range []string{"no vllm: series", "/v1/loads", "HTTP 404", "/get_load", "no tgi_ series"} {
		if !strings.Contains(err.Error(), why) {
			t.Errorf("error %q does not say %q", err, why)
		}
	}
	if got := eng.counts()["/metrics"]; got != 1 {
		t.Errorf("/metrics asked %d times in one detection, want 1", got)
	}
}

func TestReaderRedetectsWhenRememberedWireStopsAnswering(t *testing.T) {
	eng, srv := newFakeEngine(t, map[string]string{"/metrics": string(readTestdata(t, "vllm_v1_dp2.txt"))})
	rd := NewReader(srv.Client(), srv.URL)
	if rep, err := rd.Read(context.Background()); err != nil || rep.Source != SourceVLLM {
		t.Fatalf("first Read: %+v, %v", rep, err)
	}

	// The port now runs SGLang: the remembered vLLM page has no vllm: series.
	eng.set("/metrics", string(readTestdata(t, "sglang_metrics_dp2_tp2.txt")))
	eng.set("/v1/loads", string(readTestdata(t, "sglang_v1_loads_dp2.json")))
	rep, err := rd.Read(context.Background())
	if err != nil || rep.Source != SourceSGLangLoads || rd.Source() != SourceSGLangLoads {
		t.Fatalf("after the switch: %q, %v, remembered %q; want sglang_loads in the same Read", rep.Source, err, rd.Source())
	}

	// An error status from the remembered wire also starts detection again.
	eng.fail("/v1/loads", http.StatusInternalServerError)
	rep, err = rd.Read(context.Background())
	if err != nil || rep.Source != SourceSGLangMetrics {
		t.Fatalf("after /v1/loads fails: %q, %v; want sglang_metrics", rep.Source, err)
	}
}

func TestReaderKeepsWireOnTransportFailure(t *testing.T) {
	_, srv := newFakeEngine(t, map[string]string{"/metrics": string(readTestdata(t, "vllm_v1_dp2.txt"))})
	rd := NewReader(srv.Client(), srv.URL)
	if _, err := rd.Read(context.Background()); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	rep, err := rd.Read(context.Background())
	if err == nil || !rep.Empty() || !IsTransportFailure(err) {
		t.Fatalf("after close: %+v, %v; want an empty report and a transport failure", rep, err)
	}
	if rd.Source() != SourceVLLM {
		t.Errorf("remembered %q after a transport failure, want vllm kept", rd.Source())
	}
}

func TestIsTransportFailure(t *testing.T) {
	read := func(t *testing.T, url string) error {
		t.Helper()
		_, err := NewReader(nil, url).Read(context.Background())
		if err == nil {
			t.Fatal("Read succeeded")
		}
		return err
	}

	t.Run("connection refused on a closed port", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		if err := read(t, "http://"+addr); !IsTransportFailure(err) {
			t.Errorf("refused: IsTransportFailure(%v) = false", err)
		}
	})

	t.Run("connection reset by the server", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err != nil {
				return
			}
			conn.(*net.TCPConn).SetLinger(0) // close with RST
			conn.Close()
		}))
		defer srv.Close()
		if err := read(t, srv.URL); !IsTransportFailure(err) {
			t.Errorf("reset: IsTransportFailure(%v) = false", err)
		}
	})

	t.Run("connection closed inside the response headers", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			conn, buf, err := w.(http.Hijacker).Hijack()
			if err != nil {
				return
			}
			// The header block is cut after a whole line. (A line cut in the
			// middle reads as a malformed header, a protocol error.)
			_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n")
			_ = buf.Flush()
			conn.Close()
		}))
		defer srv.Close()
		if err := read(t, srv.URL); !IsTransportFailure(err) {
			t.Errorf("EOF in headers: IsTransportFailure(%v) = false", err)
		}
	})

	t.Run("HTTP 500 is not", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "boom", http.StatusInternalServerError)
		}))
		defer srv.Close()
		err := read(t, srv.URL)
		var se *StatusError
		if IsTransportFailure(err) || !errors.As(err, &se) {
			t.Errorf("500: IsTransportFailure(%v) = true or no StatusError", err)
		}
	})

	t.Run("classification of wrapped errors", func(t *testing.T) {
		for _, tc := range []struct {
			err  error
			want bool
		}{
			{nil, false},
			{&net.DNSError{Err: "no such host", Name: "engine.invalid", IsNotFound: true}, true},
			{&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("no route")}, true},
			{io.ErrUnexpectedEOF, true},
			{context.DeadlineExceeded, false},
			{context.Canceled, false},
			{&net.DNSError{Err: "i/o timeout", Name: "engine", IsTimeout: true}, false},
			{&StatusError{Path: "/metrics", Code: 503}, false},
			{&ParseError{Wire: "x", Err: io.ErrUnexpectedEOF}, false},
			{noReport("nothing"), false},
		} {
			if got := IsTransportFailure(tc.err); got != tc.want {
				t.Errorf("IsTransportFailure(%v) = %v, want %v", tc.err, got, tc.want)
			}
		}
	})
}

// pipeNet is an in-memory network for synctest bubbles: a real http.Server
// and http.Client talking over net.Pipe, so fake time drives deadlines.
type pipeNet struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newPipeNet() *pipeNet { return &pipeNet{conns: make(chan net.Conn), done: make(chan struct{})} }

func (p *pipeNet) Accept() (net.Conn, error) {
	select {
	case c := <-p.conns:
		return c, nil
	case <-p.done:
		return nil, net.ErrClosed
	}
}

func (p *pipeNet) Close() error   { p.once.Do(func() { close(p.done) }); return nil }
func (p *pipeNet) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8000} }

func (p *pipeNet) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case p.conns <- server:
		return client, nil
	case <-p.done:
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// serveSlow runs a real HTTP engine inside the bubble whose /metrics never
// answers until the client gives up.
func serveSlow(t *testing.T) (*http.Client, func()) {
	pn := newPipeNet()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	})}
	go func() { _ = srv.Serve(pn) }()
	tr := &http.Transport{DialContext: pn.dial}
	return &http.Client{Transport: tr}, func() {
		tr.CloseIdleConnections()
		_ = srv.Close()
	}
}

func TestReadTimesOutAfterFiveSeconds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client, stop := serveSlow(t)
		defer stop()
		start := time.Now()
		rep, err := NewReader(client, "http://engine:8000").Read(context.Background())
		if elapsed := time.Since(start); elapsed != RequestTimeout {
			t.Errorf("Read gave up after %v, want %v", elapsed, RequestTimeout)
		}
		if err == nil || !rep.Empty() {
			t.Fatalf("got %+v, %v; want no report", rep, err)
		}
		if IsTransportFailure(err) {
			t.Errorf("a deadline is not a transport failure: %v", err)
		}
	})
}

func TestReadKeepsAnEarlierCallerDeadline(t *testing.T) {
	for _, tc := range []struct {
		callerDeadline, want time.Duration
	}{
		{callerDeadline: time.Second, want: time.Second},
		{callerDeadline: time.Minute, want: RequestTimeout},
	} {
		synctest.Test(t, func(t *testing.T) {
			client, stop := serveSlow(t)
			defer stop()
			ctx, cancel := context.WithTimeout(context.Background(), tc.callerDeadline)
			defer cancel()
			start := time.Now()
			_, err := NewReader(client, "http://engine:8000").Read(ctx)
			if elapsed := time.Since(start); elapsed != tc.want {
				t.Errorf("caller deadline %v: gave up after %v, want %v", tc.callerDeadline, elapsed, tc.want)
			}
			if err == nil || IsTransportFailure(err) {
				t.Errorf("err = %v, want a non-transport error", err)
			}
		})
	}
}

func TestReaderKeepsWireOnTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pn := newPipeNet()
		var slow sync.Mutex
		page := string(readTestdata(t, "llamacpp_metrics.txt"))
		blocking := false
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			slow.Lock()
			b := blocking
			slow.Unlock()
			if b {
				<-r.Context().Done()
				return
			}
			if r.URL.Path != "/metrics" {
				http.NotFound(w, r)
				return
			}
			_, _ = io.WriteString(w, page)
		})}
		go func() { _ = srv.Serve(pn) }()
		tr := &http.Transport{DialContext: pn.dial}
		defer func() { tr.CloseIdleConnections(); _ = srv.Close() }()

		rd := NewReader(&http.Client{Transport: tr}, "http://engine:8000")
		if _, err := rd.Read(context.Background()); err != nil {
			t.Fatal(err)
		}
		slow.Lock()
		blocking = true
		slow.Unlock()
		if _, err := rd.Read(context.Background()); err == nil {
			t.Fatal("Read of a frozen engine succeeded")
		}
		if rd.Source() != SourceLlamaCpp {
			t.Errorf("remembered %q after a timeout, want llamacpp kept", rd.Source())
		}
	})
}

func TestReaderDerivesRatesFromCounters(t *testing.T) {
	page := func(gen, hits, queries string) string {
		return "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\"} 1\n" +
			"# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{engine=\"0\"} " + gen + "\n" +
			"# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total{engine=\"0\"} " + hits + "\n" +
			"# TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total{engine=\"0\"} " + queries + "\n"
	}
	eng, srv := newFakeEngine(t, map[string]string{"/metrics": page("1000", "100", "1000")})
	now := time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)
	rd := NewReader(srv.Client(), srv.URL, WithClock(func() time.Time { return now }))

	rep, err := rd.Read(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// First report: no interval yet, so no throughput; hit rate is the lifetime ratio.
	if r := rep.Ranks[0]; r.GenThroughput != 0 || r.CacheHitRate != 0.1 {
		t.Fatalf("first report: gen %v hit %v, want 0 and 0.1", r.GenThroughput, r.CacheHitRate)
	}

	now = now.Add(10 * time.Second)
	eng.set("/metrics", page("6000", "900", "2000"))
	rep, err = rd.Read(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// 5000 tokens in 10 s; 800 hits out of 1000 lookups in the interval.
	if r := rep.Ranks[0]; r.GenThroughput != 500 || r.CacheHitRate != 0.8 {
		t.Fatalf("second report: gen %v hit %v, want 500 and 0.8", r.GenThroughput, r.CacheHitRate)
	}

	// A restarted engine's counters go backwards: no rate this time.
	now = now.Add(10 * time.Second)
	eng.set("/metrics", page("50", "0", "10"))
	rep, err = rd.Read(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if r := rep.Ranks[0]; r.GenThroughput != 0 || r.CacheHitRate != 0 {
		t.Fatalf("after restart: gen %v hit %v, want 0 and the lifetime 0", r.GenThroughput, r.CacheHitRate)
	}
}

func TestReaderConcurrentUse(t *testing.T) {
	_, srv := newFakeEngine(t, map[string]string{"/v1/loads": string(readTestdata(t, "sglang_v1_loads_dp2.json"))})
	rd := NewReader(srv.Client(), srv.URL)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 20 {
				if rep, err := rd.Read(context.Background()); err != nil || rep.Waiting() != 9 {
					t.Errorf("Read: %v, %v", rep.Waiting(), err)
					return
				}
			}
		})
	}
	wg.Wait()
}
