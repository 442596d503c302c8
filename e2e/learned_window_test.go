package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// closedLoop keeps n clients sending short chat completions to router until
// stopped; a shed answer (503) is retried after a short pause, as a client
// honouring back-pressure does. It counts whole answers and anything else
// (neither a whole answer nor the shed answer) as a failure.
type closedLoop struct {
	ok, shed, failed atomic.Int64
	lastErr          atomic.Value   // string
	started          []atomic.Int64 // by client: when its request now open was sent (unix ns)
	stop             context.CancelFunc
	wg               sync.WaitGroup
}

func startClosedLoop(t *testing.T, router string, n int) *closedLoop {
	ctx, cancel := context.WithCancel(context.Background())
	l := &closedLoop{stop: cancel, started: make([]atomic.Int64, n)}
	for c := range n {
		l.wg.Go(func() {
			for ctx.Err() == nil {
				l.started[c].Store(time.Now().UnixNano())
				a := chat(router, 8, false, 20*time.Second)
				switch {
				case a.status == http.StatusServiceUnavailable:
					l.shed.Add(1)
					select {
					case <-ctx.Done():
					case <-time.After(5 * time.Millisecond):
					}
				case a.completeJSON() == nil:
					l.ok.Add(1)
				case ctx.Err() == nil:
					l.failed.Add(1)
					l.lastErr.Store(fmt.Sprintf("status %d err %v: %.200s", a.status, a.err, a.body))
				}
			}
		})
	}
	t.Cleanup(l.end)
	return l
}

func (l *closedLoop) end() { l.stop(); l.wg.Wait() }

// sentSince reports whether every client's open request was sent at or
// after since: every request sent before it has ended.
func (l *closedLoop) sentSince(since time.Time) bool {
	for i := range l.started {
		if l.started[i].Load() < since.UnixNano() {
			return false
		}
	}
	return true
}

// engineSampler reads engines' own /metrics (vllm:num_requests_running and
// _waiting) over a run and keeps the most each held at once.
type engineSampler struct {
	mu      sync.Mutex
	held    map[string]int // most running+waiting in one sample, by engine URL
	running map[string]int // most running in one sample
	samples int
	stop    context.CancelFunc
	done    chan struct{}
}

func sampleEngines(urls ...string) *engineSampler {
	ctx, cancel := context.WithCancel(context.Background())
	s := &engineSampler{held: map[string]int{}, running: map[string]int{}, stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for ctx.Err() == nil {
			for _, u := range urls {
				page, err := scrape(u + "/metrics")
				if err != nil {
					continue // a restarting engine answers nothing for a moment
				}
				r := int(metricSum(page, "vllm:num_requests_running"))
				w := int(metricSum(page, "vllm:num_requests_waiting"))
				s.mu.Lock()
				s.held[u] = max(s.held[u], r+w)
				s.running[u] = max(s.running[u], r)
				s.samples++
				s.mu.Unlock()
			}
		}
	}()
	return s
}

// end stops sampling and returns the peaks and the sample count.
func (s *engineSampler) end() (held, running map[string]int, samples int) {
	s.stop()
	<-s.done
	return s.held, s.running, s.samples
}

// admissionOf is url's admission on GET /workers.
func (a admin) admissionOf(url string) (workerView, error) {
	ws, err := a.workers()
	if err != nil {
		return workerView{}, err
	}
	w, ok := ws[url]
	if !ok || w.Admission == nil {
		return workerView{}, fmt.Errorf("no admission for %s", url)
	}
	return w, nil
}

// awaitLearned waits until url's window is want, learned by basis, and
// split whole into router shares.
func (a admin) awaitLearned(t *testing.T, url string, want int, basis string, within time.Duration) string {
	t.Helper()
	var seen string
	waitFor(t, within, fmt.Sprintf("%s: window %d learned by %s", url, want, basis), func() (bool, string) {
		w, err := a.admissionOf(url)
		if err != nil {
			return false, err.Error()
		}
		v := w.Admission
		seen = fmt.Sprintf("window %d source %s learned %v by %s, shares %v, engine load %+v, verdict %+v",
			v.Window, v.Source, v.Learned, v.LearnedBy, v.Shares, w.EngineLoad, w.Verdict)
		var shares u64
		for _, n := range v.Shares {
			shares += n
		}
		return int(v.Window) == want && v.Source == "learned" && int(v.Learned) == want && v.LearnedBy == basis &&
			int(shares) == want, seen
	})
	return seen
}

// TestLearnedWindowsVLLMEndToEnd: two vLLM-flavor engines (no window in
// their reports; a real cap of 4 running requests each) behind a control
// plane, an agent polling every 50 ms and one router shedding at once,
// driven at 2x of capacity by closed-loop clients.
//
//   - both windows are learned from the first queue: exactly 4, by queue,
//     as GET /workers shows;
//   - from then on, the engines' own /metrics and peaks never show one
//     holding more than its window + 1 (running + waiting);
//   - one engine restarted with a cap of 8 (same URL, after a failure spell)
//     is found again: its window is probed up to 8, the probe past 8 fails
//     and ends the search (learned by queue), and it never holds more than
//     9 on the way, while the other engine stays at 4.
func TestLearnedWindowsVLLMEndToEnd(t *testing.T) {
	const window, bigger = 4, 8
	simArgs := func(port int, cap int) []string {
		return []string{"sim", "--count", "1", "--port", strconv.Itoa(port), "--flavor", "vllm", "--log-level", "warn",
			"--max-running-requests", strconv.Itoa(cap), "--itl-ms", "10"}
	}
	fixed := startSMG(t, "sim-fixed", simArgs(0, window)...).lines(1, 20*time.Second)[0]
	port := freePort(t)
	restarted := startSMG(t, "sim-restarted", simArgs(port, window)...)
	moved := restarted.lines(1, 20*time.Second)[0]
	engines := []string{fixed, moved}

	cp := newControlPlane(t, engines, "--load-monitor-interval", "1", "--health-success-threshold", "1",
		"--worker-stall-secs", "0", "--worker-admission-window", "--worker-admission-queue", "0", "--log-level", "debug")
	t.Cleanup(func() { // on failure, how each window moved (the learner logs it at debug)
		if t.Failed() {
			for _, line := range strings.Split(cp.proc.Log(), "\n") {
				if strings.Contains(line, "Learned window") || strings.Contains(line, "liveness") {
					t.Log(line)
				}
			}
		}
	})
	startSMG(t, "agent", append(argsf("agent --controlplane 127.0.0.1:%d --node n1 --poll-interval 50ms --port %d --engine-urls",
		cp.grpcPort, freePort(t)), engines...)...)
	cp.admin.waitReady(t, engines...)
	router := startRouter(t, "r1", cp.grpcPort, "--worker-admission-window", "--worker-admission-wait-secs", "0",
		"--policy", "least_load")
	cp.admin.waitRoutersApplied(t, 1)

	load := startClosedLoop(t, router, 4*window) // 2x of the two engines' 8
	for _, e := range engines {
		v := cp.admin.awaitLearned(t, e, window, "queue", 15*time.Second)
		t.Logf("%s: %s", e, v)
	}
	// What the router sent before it held the windows (some of it still on
	// its way to the engines) ends; from here on, each engine holds at most
	// its window + 1.
	cp.admin.waitRoutersApplied(t, 1)
	learnedAt := time.Now()
	waitFor(t, 10*time.Second, "every request sent before the windows were learned to end", func() (bool, string) {
		return load.sentSince(learnedAt), ""
	})
	for _, e := range engines {
		getSimStats(t, e, true)
	}
	sampler := sampleEngines(engines...)
	start := load.ok.Load()
	waitFor(t, 20*time.Second, "200 whole answers at 2x", func() (bool, string) {
		n := load.ok.Load() - start
		return n >= 200, fmt.Sprintf("%d answered, %d shed, %d failed", n, load.shed.Load(), load.failed.Load())
	})
	held, running, samples := sampler.end()
	for _, e := range engines {
		// The peak running count is the engine's own, at every step; what it
		// held (running + waiting at one moment) is read off /metrics (the
		// peaks of the two are taken apart, and a reset starts the waiting
		// one at whatever arrived since the last step).
		st := getSimStats(t, e, false)
		t.Logf("%s: peak running %d; /metrics: most held %d, most running %d (%d samples)",
			e, st.PeakRunning, held[e], running[e], samples)
		if st.PeakRunning != window {
			t.Errorf("%s peak running %d at 2x, want its whole window %d", e, st.PeakRunning, window)
		}
		if held[e] > window+1 {
			t.Errorf("%s held %d (running + waiting on /metrics) after the first queue, want at most window+1 = %d", e, held[e], window+1)
		}
		cp.admin.awaitLearned(t, e, window, "queue", time.Second)
	}
	if f := load.failed.Load(); f > 0 {
		t.Errorf("%d requests neither answered whole nor shed (last: %v)", f, load.lastErr.Load())
	}

	// Restart the second engine with a larger cap, at the same URL, the
	// load paused (requests cut by the kill trip the router's breaker, which
	// only the control plane's contact closes). A real engine restart
	// (loading weights) takes far longer than one poll: the control plane
	// sees it unreachable before it answers again (the veto can be brief:
	// its count is read, not the verdict).
	load.end()
	vetoes := func() (float64, error) {
		page, err := scrape(cp.admin.base + "/metrics")
		return metricSum(page, "smg_worker_stall_transitions_total", "worker", moved, "reason", "unreachable"), err
	}
	before, err := vetoes()
	if err != nil {
		t.Fatal(err)
	}
	restarted.kill()
	waitFor(t, 10*time.Second, "the control plane to veto the killed engine as unreachable", func() (bool, string) {
		n, err := vetoes()
		return err == nil && n > before, fmt.Sprintf("unreachable vetoes %v (%v), before %v", n, err, before)
	})
	back := startSMG(t, "sim-restarted-8", simArgs(port, bigger)...)
	if u := back.lines(1, 20*time.Second)[0]; u != moved {
		t.Fatalf("restarted engine at %s, want %s", u, moved)
	}
	cp.admin.awaitLiveness(t, moved, "", 10*time.Second)
	backAt := time.Now()
	sampler = sampleEngines(engines...)
	load = startClosedLoop(t, router, 6*window) // 2x of the 4 + 8 now
	v := cp.admin.awaitLearned(t, moved, bigger, "queue", 30*time.Second)
	found := time.Since(backAt)
	held, _, _ = sampler.end()
	st := getSimStats(t, moved, false)
	t.Logf("restarted with %d: found again after %s: %s; peaks running %d waiting %d, most held %d",
		bigger, found.Round(time.Millisecond), v, st.PeakRunning, st.PeakWaiting, held[moved])
	if st.PeakWaiting > 1 || held[moved] > bigger+1 {
		t.Errorf("restarted engine held more than window+1 while found again: peak waiting %d, most held %d", st.PeakWaiting, held[moved])
	}
	if held[fixed] > window+1 {
		t.Errorf("the other engine held %d meanwhile, want at most %d", held[fixed], window+1)
	}
	cp.admin.awaitLearned(t, fixed, window, "queue", time.Second)
	load.end()
	if f := load.failed.Load(); f > 0 {
		t.Errorf("%d requests after the restart neither answered whole nor shed (last: %v)", f, load.lastErr.Load())
	}
}
