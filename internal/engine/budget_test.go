package engine

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/smg-project/smg/internal/readbudget"
)

// bigPage is a valid vLLM page padded with series to about size bytes.
func bigPage(size int) []byte {
	var b bytes.Buffer
	b.WriteString("# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} 3\n")
	b.WriteString("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 1\n")
	b.WriteString("# TYPE pad gauge\n")
	for i := 0; b.Len() < size; i++ {
		b.WriteString("pad{a=\"" + strconv.Itoa(i) + "\",b=\"" + strings.Repeat("y", 100) + "\"} 1\n")
	}
	return b.Bytes()
}

// Readers sharing a budget never hold more than it together, whether the
// engine gives the answer's length or not: reads that do not fit wait (a
// warning, a count) and then succeed.
func TestReadsShareOneBudget(t *testing.T) {
	page := bigPage(70 << 10) // charged 560 KiB each: one at a time; without a length, charged the whole budget once past 64 KiB
	for _, withLength := range []bool{true, false} {
		t.Run("Content-Length "+strconv.FormatBool(withLength), func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/metrics" {
					http.NotFound(w, r)
					return
				}
				if withLength {
					w.Header().Set("Content-Length", strconv.Itoa(len(page)))
				}
				w.Write(page)
			}))
			defer srv.Close()
			var logs bytes.Buffer
			reg := prometheus.NewRegistry()
			b, err := readbudget.New(1<<20, reg, slog.New(slog.NewTextHandler(&logs, nil)))
			if err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			var peak atomic.Int64
			stop := make(chan struct{})
			sampled := make(chan struct{})
			go func() { // the memory held, sampled while the reads run
				defer close(sampled)
				for {
					select {
					case <-stop:
						return
					default:
					}
					if v := int64(testutil.ToFloat64(b.InUse())); v > peak.Load() {
						peak.Store(v)
					}
					time.Sleep(time.Millisecond) // sampling, not timing a rule
				}
			}()
			errs := make(chan error, 6)
			for range 6 {
				r := NewReader(srv.Client(), srv.URL, WithBudget(b))
				wg.Go(func() {
					rep, err := r.Read(context.Background())
					if err == nil && rep.Waiting() != 3 {
						t.Errorf("waiting %d, want 3", rep.Waiting())
					}
					errs <- err
				})
			}
			wg.Wait()
			close(stop)
			<-sampled
			close(errs)
			for err := range errs {
				if err != nil {
					t.Errorf("read: %v", err)
				}
			}
			if p := peak.Load(); p > 1<<20 || p == 0 {
				t.Errorf("reads held %d bytes at most, want some and at most the budget's %d", p, 1<<20)
			}
			if w := testutil.ToFloat64(b.Waits()); w < 1 {
				t.Errorf("%v reads waited, want some", w)
			}
			if got := testutil.ToFloat64(b.InUse()); got != 0 {
				t.Errorf("%v bytes held after every read ended", got)
			}
			if !strings.Contains(logs.String(), "Engine reads wait for memory") {
				t.Errorf("no warning of reads waiting:\n%s", logs.String())
			}
		})
	}
}

// A page of more lines than any engine exports is refused before it is
// parsed (parsing holds about 100 bytes a sample, however short its line).
func TestTooManyLinesRefused(t *testing.T) {
	var b bytes.Buffer
	b.WriteString("# TYPE vllm:num_requests_waiting gauge\n")
	for i := range maxLines + 1 {
		b.WriteString("vllm:num_requests_waiting{a=\"" + strconv.Itoa(i) + "\"} 1\n")
	}
	if _, err := parseFamilies(b.Bytes()); err == nil || !strings.Contains(err.Error(), "lines") {
		t.Fatalf("parse of %d lines: %v, want refused", maxLines+1, err)
	}
}
