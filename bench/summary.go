package bench

import (
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
	"time"
)

// Summary condenses a run's records.
type Summary struct {
	Requests    int     `json:"requests"`
	Completed   int     `json:"completed"`
	Shed        int     `json:"shed"`         // final answer 503 worker_overload_protection_shed
	Status503   int     `json:"status_503"`   // final answer 503, shed or not
	Rate503     float64 `json:"rate_503"`     // Status503 / Requests
	Errors      int     `json:"errors"`       // neither completed nor shed (timeouts included)
	Timeouts    int     `json:"timeouts"`     // hit the client's request timeout
	OfferedRate float64 `json:"offered_rate"` // arrivals per second

	TTFT Percentiles `json:"ttft"` // of completed requests, seconds
	ITL  Percentiles `json:"itl"`  // of every gap in completed requests, seconds
	E2E  Percentiles `json:"e2e"`  // of completed requests, seconds

	OutputTokens   int            `json:"output_tokens"`    // of completed requests
	Throughput     float64        `json:"throughput"`       // output tokens/s of completed requests
	MetObjective   int            `json:"met_objective"`    // completed with TTFT within the objective
	Goodput        float64        `json:"goodput"`          // output tokens/s of those
	GoodputReqRate float64        `json:"goodput_req_rate"` // requests/s of those
	ErrorKinds     map[string]int `json:"error_kinds,omitempty"`
	// InFlight is the mean number of completed requests open (from the
	// client's send to the end of the answer) over the same steady-state
	// span: how many of the fleet's slots admitted work kept busy. Unlike
	// tokens/s it does not slow down when other jobs take the CPU.
	InFlight float64 `json:"in_flight"`
}

// Percentiles of a sample; zero when the sample is empty.
type Percentiles struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// PercentilesOf sorts xs and reads its percentiles (nearest rank).
func PercentilesOf(xs []float64) Percentiles {
	if len(xs) == 0 {
		return Percentiles{}
	}
	s := slices.Clone(xs)
	sort.Float64s(s)
	at := func(q float64) float64 {
		i := int(math.Ceil(q*float64(len(s)))) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	return Percentiles{N: len(s), P50: at(0.50), P90: at(0.90), P99: at(0.99), Max: s[len(s)-1]}
}

// Summarize reads records of a run whose arrivals lasted window. Offered
// load is per second of that window. Throughput and goodput are steady-state
// rates: output tokens received between a warm-up (a fifth of the window, at
// most 2 s, while the first batches fill) and the end of the window, so
// neither the empty start nor the queue drained after the end counts.
func Summarize(records []Record, window, ttftObjective time.Duration) Summary {
	warm := Warmup(window).Seconds()
	end := window.Seconds()
	s := Summary{Requests: len(records), ErrorKinds: map[string]int{}}
	var ttft, itl, e2e []float64
	for _, r := range records {
		if r.Status == 503 && !r.Completed {
			s.Status503++
		}
		switch {
		case r.Completed:
			s.Completed++
			ttft = append(ttft, r.TTFT)
			itl = append(itl, r.ITL...)
			e2e = append(e2e, r.E2E)
			s.OutputTokens += r.Tokens
			s.InFlight += max(0, min(end, r.Start+r.E2E)-max(warm, r.Start))
			inWindow := tokensBetween(r, warm, end)
			s.Throughput += inWindow
			if ttftObjective <= 0 || r.TTFT <= ttftObjective.Seconds() {
				s.MetObjective++
				s.Goodput += inWindow
			}
		case r.Shed:
			s.Shed++
		default:
			s.Errors++
			kind := r.Error
			if i := strings.IndexByte(kind, ':'); i > 0 && !strings.HasPrefix(kind, "http") {
				kind = kind[:i]
			}
			if r.Error == "timeout" {
				s.Timeouts++
			}
			s.ErrorKinds[kind]++
		}
	}
	if len(s.ErrorKinds) == 0 {
		s.ErrorKinds = nil
	}
	if s.Requests > 0 {
		s.Rate503 = float64(s.Status503) / float64(s.Requests)
	}
	if secs := window.Seconds(); secs > 0 {
		s.OfferedRate = float64(s.Requests) / secs
		s.GoodputReqRate = float64(s.MetObjective) / secs
		s.Throughput /= end - warm
		s.Goodput /= end - warm
		s.InFlight /= end - warm
	}
	s.TTFT, s.ITL, s.E2E = PercentilesOf(ttft), PercentilesOf(itl), PercentilesOf(e2e)
	return s
}

// Warmup is the start of a run of window that steady-state rates leave out.
func Warmup(window time.Duration) time.Duration { return min(window/5, 2*time.Second) }

// WriteTable prints s as a human-readable block.
func (s Summary) WriteTable(w io.Writer, ttftObjective time.Duration) {
	ms := func(v float64) string { return fmt.Sprintf("%.0f ms", v*1000) }
	fmt.Fprintf(w, "requests        %d (%.1f/s offered)\n", s.Requests, s.OfferedRate)
	fmt.Fprintf(w, "completed       %d\n", s.Completed)
	fmt.Fprintf(w, "shed            %d    503 rate %.1f%%\n", s.Shed, 100*s.Rate503)
	fmt.Fprintf(w, "errors          %d (timeouts %d)", s.Errors, s.Timeouts)
	if len(s.ErrorKinds) > 0 {
		kinds := make([]string, 0, len(s.ErrorKinds))
		for k, n := range s.ErrorKinds {
			kinds = append(kinds, fmt.Sprintf("%s: %d", k, n))
		}
		sort.Strings(kinds)
		fmt.Fprintf(w, " [%s]", strings.Join(kinds, ", "))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "                p50        p90        p99        max\n")
	for _, row := range []struct {
		name string
		p    Percentiles
	}{{"TTFT", s.TTFT}, {"ITL", s.ITL}, {"E2E", s.E2E}} {
		fmt.Fprintf(w, "%-15s %-10s %-10s %-10s %s\n", row.name, ms(row.p.P50), ms(row.p.P90), ms(row.p.P99), ms(row.p.Max))
	}
	fmt.Fprintf(w, "throughput      %.0f output tokens/s\n", s.Throughput)
	fmt.Fprintf(w, "goodput         %.0f output tokens/s (%d requests with TTFT <= %s)\n", s.Goodput, s.MetObjective, ttftObjective)
}

// tokensBetween counts r's output tokens received in [from, to] (seconds from
// the run's start). Token chunks are timed; when the final usage reports more
// tokens than chunks, each chunk weighs its share.
func tokensBetween(r Record, from, to float64) float64 {
	chunks := len(r.ITL) + 1
	if r.Tokens == 0 {
		return 0
	}
	weight := float64(r.Tokens) / float64(chunks)
	t := r.Start + r.TTFT
	n := 0.0
	for i := 0; i < chunks; i++ {
		if i > 0 {
			t += r.ITL[i-1]
		}
		if t >= from && t <= to {
			n += weight
		}
	}
	return n
}
