package router

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/smg-project/smg/router/admission"
)

// spillHarness is a router with --spill-over and running windows (wait 0:
// a request finding no room is shed at once), on a clock the test moves.
func spillHarness(t *testing.T, mutate func(*Options)) (*harness, *atomic.Int64) {
	var clock atomic.Int64
	clock.Store(time.Unix(20000, 0).UnixNano())
	h := newHarness(t, func(o *Options) {
		o.SpillOver = true
		o.WorkerAdmissionWindow = true
		o.WorkerAdmissionWaitSecs = 0
		o.Now = func() time.Time { return time.Unix(0, clock.Load()) }
		if mutate != nil {
			mutate(o)
		}
	})
	return h, &clock
}

func (h *harness) spilled(model, reason string) float64 {
	return testutil.ToFloat64(h.r.spill.spilled.WithLabelValues(model, reason))
}

func (h *harness) spillRefused(model, reason string) float64 {
	return testutil.ToFloat64(h.r.spill.refused.WithLabelValues(model, reason))
}

// With the local engine's window full, requests spill to the provider up
// to its budget (2 requests/s, the whole of it at a router the control
// plane gave no part), the next is shed as the spec says, and a second
// later the budget allows one more. The engine never gets more than its
// window.
func TestSpillOverUpToTheBudgetThenShed(t *testing.T) {
	h, clock := spillHarness(t, nil)
	p := startProvider(t, nil)
	local := startSim(t, nil)
	ext := external("ext", p, "file:"+keyFile(t, providerKey))
	ext.Provider.SpillRequestsPerSec = 2
	h.apply(Worker{ID: "local", URL: local.URL(), Model: testModel, Healthy: true, AdmissionRooms: 1}, ext)
	if a := h.post(testModel, "", "room free"); a.status != http.StatusOK || h.spilled(testModel, SpillNoRoom) != 0 {
		t.Fatalf("with room: %d, spilled %v", a.status, h.spilled(testModel, SpillNoRoom))
	}
	if !h.r.states["local"].gate.TryAcquire(1, 0) { // the engine's one room, taken
		t.Fatal("room not free")
	}
	for i := range 2 {
		if a := h.post(testModel, "", "spill"); a.status != http.StatusOK {
			t.Fatalf("spill %d: %d %s", i, a.status, a.body)
		}
	}
	if a := h.post(testModel, "", "past the budget"); a.status != http.StatusServiceUnavailable || a.errorCode() != CodeShed {
		t.Fatalf("past the budget: %d %s, want the spec's shed", a.status, a.body)
	}
	clock.Add(int64(time.Second))
	if a := h.post(testModel, "", "a second later"); a.status != http.StatusOK {
		t.Fatalf("a second later: %d %s", a.status, a.body)
	}
	if got, refused := h.spilled(testModel, SpillNoRoom), h.spillRefused(testModel, SpillRefusedBudget); got != 3 || refused != 1 {
		t.Fatalf("spilled %v refused %v, want 3 and 1", got, refused)
	}
	if in := h.r.states["local"].gate.InFlight(); in != 1 {
		t.Fatalf("local engine holds %d rooms, want its window of 1", in)
	}
}

// Every local candidate overloaded (shedding on) spills with reason
// overload; a model that only a provider serves spills with reason
// unavailable and is listed in /v1/models; a token budget counts the
// prompt estimate plus max_tokens.
func TestSpillOverReasonsAndTokenBudget(t *testing.T) {
	h, _ := spillHarness(t, func(o *Options) { o.WorkerOverloadShed = true })
	p := startProvider(t, nil)
	local := startSim(t, nil)
	ext := external("ext", p, "file:"+keyFile(t, providerKey))
	ext.Provider.SpillTokensPerSec = 100
	only := external("only", p, "file:"+keyFile(t, providerKey))
	only.Model, only.URL = "only-external", only.URL+"-only"
	h.apply(Worker{ID: "local", URL: local.URL(), Model: testModel, Healthy: true, Veto: VetoOverload, Overloaded: true}, ext, only)
	body := `{"model":"` + testModel + `","max_tokens":60,"messages":[{"role":"user","content":"hi"}]}`
	if a := h.send("/v1/chat/completions", body, ""); a.status != http.StatusOK {
		t.Fatalf("overloaded local: %d %s", a.status, a.body)
	}
	if a := h.send("/v1/chat/completions", body, ""); a.status != http.StatusOK { // 100 - 60 > 0: allowed, into debt
		t.Fatalf("second: %d %s", a.status, a.body)
	}
	if a := h.send("/v1/chat/completions", body, ""); a.status != http.StatusServiceUnavailable || a.errorCode() != CodeShed {
		t.Fatalf("token budget spent: %d %s, want the spec's shed", a.status, a.body)
	}
	if got := h.spilled(testModel, SpillOverload); got != 2 {
		t.Fatalf("spilled for overload %v, want 2", got)
	}
	if a := h.post("only-external", "", "hi"); a.status != http.StatusOK || h.spilled("only-external", SpillUnavailable) != 1 {
		t.Fatalf("provider-only model: %d %s, spilled %v", a.status, a.body, h.spilled("only-external", SpillUnavailable))
	}
	if a := h.get("/v1/models"); a.status != http.StatusOK || !strings.Contains(a.body, `"only-external"`) || !strings.Contains(a.body, `"`+testModel+`"`) {
		t.Fatalf("/v1/models: %s", a.body)
	}
}

// A router the control plane has granted no part of the budget (-1) spills
// nothing; one granted half of a 4 requests/s budget spills 2 per second.
// With spill-over off, an external worker is an ordinary candidate.
func TestSpillOverPartsAndOff(t *testing.T) {
	h, _ := spillHarness(t, nil)
	p := startProvider(t, nil)
	ext := external("ext", p, "file:"+keyFile(t, providerKey))
	ext.Provider.SpillRequestsPerSec = 4
	ext.WindowShare = -1
	h.apply(ext)
	if a := h.post(testModel, "", "hi"); a.status != http.StatusServiceUnavailable || h.spillRefused(testModel, SpillRefusedBudget) != 1 {
		t.Fatalf("no part granted: %d %s", a.status, a.body)
	}
	ext.WindowShare = spillPart / 2
	h.apply(ext)
	ok := 0
	for range 4 {
		if a := h.post(testModel, "", "hi"); a.status == http.StatusOK {
			ok++
		}
	}
	if ok != 2 {
		t.Fatalf("half of 4 requests/s: %d spilled in the same instant, want 2", ok)
	}

	off := newHarness(t, func(o *Options) { o.Policy = PolicyRoundRobin })
	local := startSim(t, nil)
	off.apply(Worker{ID: "local", URL: local.URL(), Model: testModel, Healthy: true}, ext)
	for range 2 {
		if a := off.post(testModel, "", "hi"); a.status != http.StatusOK {
			t.Fatalf("spill-over off: %d %s", a.status, a.body)
		}
	}
	if obs := observation(off.r, "ext"); obs.LastProgress.IsZero() {
		t.Fatal("spill-over off: the external worker got no request from round robin over two")
	}
	if off.r.spill != nil {
		t.Fatal("spill-over state without the flag")
	}
}

// With spill-over, an external worker (ungated) adds nothing to the
// scheduler's capacity from the fleet's windows; without it, it is an
// ordinary candidate with no window and the capacity is unlimited.
func TestSpillOverKeepsProvidersOutOfTheFleetCapacity(t *testing.T) {
	ext := &Worker{Type: TypeRegular, Provider: &Provider{}}
	apart := fleetCap{spillApart: true}
	apart.add(&Worker{Type: TypeRegular}, 4, 4, 1)
	apart.add(ext, admission.Unlimited, 0, 1)
	if got := apart.capacity(); got != 4 {
		t.Fatalf("spill-over: capacity %d, want the local window of 4", got)
	}
	var ordinary fleetCap
	ordinary.add(&Worker{Type: TypeRegular}, 4, 4, 1)
	ordinary.add(ext, admission.Unlimited, 0, 1)
	if got := ordinary.capacity(); got != admission.Unlimited {
		t.Fatalf("without spill-over: capacity %d, want unlimited", got)
	}
}
