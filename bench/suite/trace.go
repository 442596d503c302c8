package suite

import (
	"context"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/smg-project/smg/bench"
)

// workerSampler reads GET /workers every interval in the background, so a
// run can show what the gateway believed while the load arrived.
type workerSampler struct {
	cancel  context.CancelFunc
	done    chan struct{}
	mu      sync.Mutex
	samples []WorkerSample
}

// sampleWorkers starts sampling gw; engine indexes come from the fleet's URL
// order and times are seconds from start.
func sampleWorkers(ctx context.Context, gw *Gateway, urls []string, start time.Time, every time.Duration) *workerSampler {
	index := map[string]int{}
	for i, u := range urls {
		index[u] = i
	}
	ctx, cancel := context.WithCancel(ctx)
	ws := &workerSampler{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(ws.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			states, err := gw.Workers(ctx)
			if err != nil {
				continue
			}
			at := time.Since(start).Seconds()
			ws.mu.Lock()
			for _, w := range states {
				ws.samples = append(ws.samples, WorkerSample{At: at, Engine: index[w.URL], WorkerState: w})
			}
			ws.mu.Unlock()
		}
	}()
	return ws
}

// stop ends sampling and returns every sample taken.
func (ws *workerSampler) stop() []WorkerSample {
	ws.cancel()
	<-ws.done
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.samples
}

// TraceSecond is one second of a run: what arrived, where it went, and what
// the gateway's verdicts were meanwhile. It is the evidence for why admitted
// latency is what it is.
type TraceSecond struct {
	Second   int   `json:"second"`
	Arrivals int   `json:"arrivals"`
	Shed     int   `json:"shed"`
	Routed   []int `json:"routed"` // requests starting this second, by the engine that served them
	// VetoedShare is, per engine, the share of this second's samples of
	// GET /workers that showed it vetoed for overload.
	VetoedShare []float64 `json:"vetoed_share"`
	// AllVetoed is the share of samples in which every engine was vetoed.
	AllVetoed float64 `json:"all_vetoed"`
	// MaxWaiting is, per engine, the most waiting requests the gateway's
	// stored load showed this second.
	MaxWaiting []int `json:"max_waiting"`
	// TTFTMax is the longest TTFT of admitted requests that started this second.
	TTFTMax float64 `json:"ttft_max"`
	// MinWindow and MaxWindow are, per engine, the smallest and largest
	// admission window the samples showed this second (0: none).
	MinWindow []int `json:"min_window,omitempty"`
	MaxWindow []int `json:"max_window,omitempty"`
}

// Trace bins a run's records and worker samples into seconds.
func Trace(records []bench.Record, samples []WorkerSample, engines int, seconds float64) []TraceSecond {
	n := int(math.Ceil(seconds))
	out := make([]TraceSecond, n)
	for i := range out {
		out[i] = TraceSecond{Second: i, Routed: make([]int, engines), VetoedShare: make([]float64, engines),
			MaxWaiting: make([]int, engines), MinWindow: make([]int, engines), MaxWindow: make([]int, engines)}
	}
	for _, r := range records {
		// Every arrival was scheduled inside the window; one that started
		// just past its end was late by scheduling lag, not a second more.
		i := min(int(r.Start), n-1)
		if i < 0 {
			continue
		}
		t := &out[i]
		t.Arrivals++
		if r.Shed {
			t.Shed++
		}
		if e, err := strconv.Atoi(r.Engine); err == nil && e >= 0 && e < engines {
			t.Routed[e]++
		}
		if r.Completed && r.TTFT > t.TTFTMax {
			t.TTFTMax = r.TTFT
		}
	}
	// Samples come in rounds of one row per engine, all with the same time.
	type round struct{ vetoed, total int }
	rounds := map[float64]*round{}
	perSecond := make([]int, n) // rounds per second
	for _, s := range samples {
		i := int(s.At)
		if i < 0 || i >= n || s.Engine < 0 || s.Engine >= engines {
			continue
		}
		rd := rounds[s.At]
		if rd == nil {
			rd = &round{}
			rounds[s.At] = rd
			perSecond[i]++
		}
		rd.total++
		overloaded := s.Vetoed && s.Veto == "overload"
		if overloaded {
			rd.vetoed++
			out[i].VetoedShare[s.Engine]++
		}
		out[i].MaxWaiting[s.Engine] = max(out[i].MaxWaiting[s.Engine], s.Waiting)
		if lo := out[i].MinWindow[s.Engine]; lo == 0 || (s.Window > 0 && s.Window < lo) {
			out[i].MinWindow[s.Engine] = s.Window
		}
		out[i].MaxWindow[s.Engine] = max(out[i].MaxWindow[s.Engine], s.Window)
	}
	for at, rd := range rounds {
		if rd.total == engines && rd.vetoed == engines {
			out[int(at)].AllVetoed++
		}
	}
	for i := range out {
		if perSecond[i] == 0 {
			continue
		}
		for e := range out[i].VetoedShare {
			out[i].VetoedShare[e] /= float64(perSecond[i])
		}
		out[i].AllVetoed /= float64(perSecond[i])
	}
	return out
}

// WriteTraceTable writes a trace as a markdown table.
func WriteTraceTable(w io.Writer, trace []TraceSecond) {
	fmt.Fprintf(w, "| s | arrivals | shed | routed per engine | vetoed share per engine | all vetoed | max waiting per engine | max TTFT |\n")
	fmt.Fprintf(w, "|---|---|---|---|---|---|---|---|\n")
	for _, t := range trace {
		shares := make([]string, len(t.VetoedShare))
		for i, v := range t.VetoedShare {
			shares[i] = fmt.Sprintf("%.0f%%", 100*v)
		}
		fmt.Fprintf(w, "| %d | %d | %d | %s | %s | %.0f%% | %s | %s |\n", t.Second, t.Arrivals, t.Shed, joinInts(t.Routed),
			strings.Join(shares, " "), 100*t.AllVetoed, joinInts(t.MaxWaiting), msStr(t.TTFTMax))
	}
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, " ")
}
