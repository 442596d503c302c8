package router

import (
	"bufio"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/smg-project/smg/sim"
)

func startSim(t *testing.T, mutate func(*sim.Options)) *sim.Server {
	t.Helper()
	o := sim.DefaultOptions()
	o.Model = testModel
	o.ITL = time.Millisecond
	o.Seed = 1
	if mutate != nil {
		mutate(&o)
	}
	s, err := sim.Start("127.0.0.1:0", o, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// A streaming chat completion through the router to the simulator arrives as
// the engine's SSE events, ends with [DONE], and records progress.
func TestStreamingThroughRouterToSimulator(t *testing.T) {
	h := newHarness(t, nil)
	s := startSim(t, nil)
	h.apply(Worker{ID: "sim", URL: s.URL(), Model: testModel, Healthy: true})
	req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/chat/completions", strings.NewReader(
		`{"model":"`+testModel+`","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"hello"}]}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	events, done := 0, false
	for sc.Scan() {
		line := sc.Text()
		if line == "data: [DONE]" {
			done = true
		} else if strings.HasPrefix(line, "data: ") {
			events++
		}
	}
	if resp.StatusCode != http.StatusOK || !done || events < 2 {
		t.Fatalf("status %d, %d events, done=%v", resp.StatusCode, events, done)
	}
	if obs := observation(h.r, "sim"); obs.LastProgress.IsZero() || obs.StreamsInFlight != 0 {
		t.Fatalf("observation after the stream: %+v", obs)
	}
}

// An engine that resets connections is reported as connection failures and
// the request is retried on another worker before any byte reached the client.
func TestResettingEngineIsRetriedAndReported(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.Policy = PolicyRoundRobin })
	bad := startSim(t, func(o *sim.Options) { o.Fault.Reset = true })
	good := startSim(t, nil)
	h.apply(Worker{ID: "bad", URL: bad.URL(), Model: testModel, Healthy: true},
		Worker{ID: "good", URL: good.URL(), Model: testModel, Healthy: true})
	for range 4 {
		a := h.send("/v1/completions", `{"model":"`+testModel+`","max_tokens":2,"prompt":"hi"}`, "")
		if a.status != http.StatusOK {
			t.Fatalf("got %d %s", a.status, a.body)
		}
	}
	if obs := observation(h.r, "bad"); obs.ConnectionFailures == 0 {
		t.Fatal("resets not reported as connection failures")
	}
}

// A batched PD request (a list of prompts: the router sends one bootstrap
// host, port and room per prompt, as SGLang expects) that fits the decode
// window is answered through real simulator engines, one choice per prompt,
// streamed or not.
func TestBatchedPDRequestThroughRouterToSimulators(t *testing.T) {
	prefill := startSim(t, func(o *sim.Options) { o.Flavor, o.Role = sim.FlavorSGLang, sim.RolePrefill })
	decode := startSim(t, func(o *sim.Options) { o.Flavor, o.Role = sim.FlavorSGLang, sim.RoleDecode })
	port, err := strconv.Atoi(prefill.Addr()[strings.LastIndexByte(prefill.Addr(), ':')+1:])
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(o *Options) { o.PDDisaggregation = true })
	h.apply(Worker{ID: "p", URL: prefill.URL(), Model: testModel, Type: TypePrefill, Healthy: true, BootstrapPort: int32(port)},
		Worker{ID: "d", URL: decode.URL(), Model: testModel, Type: TypeDecode, Healthy: true, MaxRunning: 8, WindowShare: 8})
	for _, stream := range []bool{false, true} {
		a := h.send("/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":["one","two","three"],"max_tokens":3,"stream":%v}`, testModel, stream), "")
		if a.status != http.StatusOK {
			t.Fatalf("batched PD request (stream %v): %d %s", stream, a.status, a.body)
		}
		for i := range 3 {
			if !strings.Contains(a.body, fmt.Sprintf(`"index":%d`, i)) {
				t.Fatalf("batched PD request (stream %v): no choice %d in %s", stream, i, a.body)
			}
		}
		if stream && !strings.Contains(a.body, "data: [DONE]") {
			t.Fatalf("batched PD stream without [DONE]: %s", a.body)
		}
	}
}

// An engine killed and restarted on its address before the control plane
// judged it unreachable: its failures opened this router's breaker, and the
// control plane's next load report from the restarted engine lets requests
// through again at once, not after --cb-timeout-duration-secs (the clock
// does not move).
func TestRestartedSimulatorBackOnItsFirstReport(t *testing.T) {
	clock := newFakeClock()
	h := newHarness(t, func(o *Options) {
		clock.opts(o)
		o.DisableRetries = true
		o.CBFailureThreshold = 3
	})
	s := startSim(t, nil)
	w := Worker{ID: "sim", URL: s.URL(), Model: testModel, Healthy: true, LoadRevision: 1}
	h.apply(w)
	if a := h.post(testModel, "", "hello"); a.status != http.StatusOK {
		t.Fatalf("before the kill: %d %s", a.status, a.body)
	}
	if err := s.SetFault(sim.Fault{Kill: true}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if a := h.post(testModel, "", "hello"); a.status == http.StatusOK {
			t.Fatal("a killed engine answered")
		}
	}
	if err := s.SetFault(sim.Fault{}); err != nil { // restarted on the same address
		t.Fatal(err)
	}
	if a := h.post(testModel, "", "hello"); a.errorCode() != CodeNoAvailableWorkers {
		t.Fatalf("restarted, no report yet: got %d %s, want the breaker open", a.status, a.body)
	}
	w.LoadRevision = 2 // the restarted engine answered the control plane's poll
	h.apply(w)
	if a := h.post(testModel, "", "hello"); a.status != http.StatusOK {
		t.Fatalf("after the restarted engine's first report: got %d %s, want its answer", a.status, a.body)
	}
}
