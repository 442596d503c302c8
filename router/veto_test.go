package router

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Every policy skips vetoed (and unhealthy) workers while an un-vetoed one remains.
func TestEveryPolicySkipsVetoedWorkers(t *testing.T) {
	for _, policy := range Policies {
		t.Run(policy, func(t *testing.T) {
			h := newHarness(t, func(o *Options) { o.Policy = policy })
			over := newEngine(t, "over", nil)
			unreach := newEngine(t, "unreach", nil)
			wedged := newEngine(t, "wedged", nil)
			sick := newEngine(t, "sick", nil)
			ok := newEngine(t, "ok", nil)
			h.apply(over.worker(vetoed(VetoOverload)), unreach.worker(vetoed(VetoUnreachable)),
				wedged.worker(vetoed(VetoWedged)), sick.worker(unhealthy), ok.worker(waiting(100)))
			for i := range 40 {
				key := ""
				if i%2 == 0 {
					key = fmt.Sprintf("user-%d", i)
				}
				a := h.post(testModel, key, fmt.Sprintf("prompt %d", i))
				if a.status != http.StatusOK || a.servedBy() != "ok" {
					t.Fatalf("request %d: status %d served by %q, want 200 from ok", i, a.status, a.servedBy())
				}
			}
			if got := h.counter("smg_worker_overload_fallback_total", StageSelection) +
				h.counter("smg_worker_liveness_fallback_total", StageSelection); got != 0 {
				t.Fatalf("fallback counted %v times with an eligible worker present", got)
			}
		})
	}
}

// Hash and sticky policies route a vetoed worker's key elsewhere while the
// veto lasts, and the key comes back when it ends.
func TestHashKeysMoveWhileVetoedAndComeBack(t *testing.T) {
	for _, policy := range []string{PolicyConsistentHashing, PolicyPrefixHash, PolicyManual} {
		t.Run(policy, func(t *testing.T) {
			h := newHarness(t, func(o *Options) { o.Policy = policy })
			engines := []*engine{newEngine(t, "a", nil), newEngine(t, "b", nil), newEngine(t, "c", nil)}
			fleet := func(veto string) []Worker {
				var ws []Worker
				for _, e := range engines {
					w := e.worker()
					if e.name == veto {
						w.Veto = VetoOverload
					}
					ws = append(ws, w)
				}
				return ws
			}
			h.apply(fleet("")...)
			for k := range 10 {
				key := fmt.Sprintf("conversation-%d", k)
				home := h.post(testModel, key, "hello").servedBy()
				for range 3 {
					if got := h.post(testModel, key, "hello").servedBy(); got != home {
						t.Fatalf("key %s not sticky: %s then %s", key, home, got)
					}
				}
				h.apply(fleet(home)...)
				away := h.post(testModel, key, "hello").servedBy()
				if away == home || away == "" {
					t.Fatalf("key %s still served by vetoed %s (got %q)", key, home, away)
				}
				h.apply(fleet("")...)
				if back := h.post(testModel, key, "hello").servedBy(); back != home {
					t.Fatalf("key %s did not come back to %s after the veto, went to %s", key, home, back)
				}
			}
		})
	}
}

// Without a key, the hash policies key on the prompt.
func TestHashPoliciesKeyOnPrompt(t *testing.T) {
	for _, policy := range []string{PolicyConsistentHashing, PolicyPrefixHash} {
		t.Run(policy, func(t *testing.T) {
			h := newHarness(t, func(o *Options) { o.Policy = policy })
			engines := []*engine{newEngine(t, "a", nil), newEngine(t, "b", nil), newEngine(t, "c", nil)}
			var ws []Worker
			for _, e := range engines {
				ws = append(ws, e.worker())
			}
			h.apply(ws...)
			seen := map[string]bool{}
			for p := range 30 {
				prompt := fmt.Sprintf("prompt number %d", p)
				first := h.post(testModel, "", prompt).servedBy()
				seen[first] = true
				if again := h.post(testModel, "", prompt).servedBy(); again != first {
					t.Fatalf("prompt %q went to %s then %s", prompt, first, again)
				}
			}
			if len(seen) < 2 {
				t.Fatalf("30 prompts all hashed to %v", seen)
			}
		})
	}
}

// When every candidate is vetoed the request is steered to the least-loaded
// routable one, overload-vetoed before liveness-vetoed, and counted.
func TestSteerWhenEveryCandidateIsVetoed(t *testing.T) {
	h := newHarness(t, nil)
	busy := newEngine(t, "busy", nil)
	lighter := newEngine(t, "lighter", nil)
	gone := newEngine(t, "gone", nil)
	sickLight := newEngine(t, "sick-light", nil)
	h.apply(busy.worker(vetoed(VetoOverload), waiting(30)), lighter.worker(vetoed(VetoOverload), waiting(20)),
		gone.worker(vetoed(VetoUnreachable)), sickLight.worker(vetoed(VetoOverload), unhealthy))
	a := h.post(testModel, "", "x")
	if a.status != http.StatusOK || a.servedBy() != "lighter" {
		t.Fatalf("got %d from %q, want 200 from the least-loaded overloaded worker", a.status, a.servedBy())
	}
	if h.counter("smg_worker_overload_fallback_total", StageSelection) != 1 ||
		h.counter("smg_worker_liveness_fallback_total", StageSelection) != 0 {
		t.Fatal("want one overload fallback, no liveness fallback")
	}

	// Only liveness-vetoed workers routable: steer to the least loaded of them.
	h.apply(busy.worker(vetoed(VetoWedged), waiting(5)), lighter.worker(vetoed(VetoUnreachable), waiting(2)),
		gone.worker(vetoed(VetoOverload), unhealthy))
	a = h.post(testModel, "", "x")
	if a.status != http.StatusOK || a.servedBy() != "lighter" {
		t.Fatalf("got %d from %q, want 200 from the least-loaded liveness-vetoed worker", a.status, a.servedBy())
	}
	if h.counter("smg_worker_liveness_fallback_total", StageSelection) != 1 {
		t.Fatal("want one liveness fallback")
	}

	// Nothing routable at all.
	h.apply(busy.worker(unhealthy), lighter.worker(vetoed(VetoOverload), unhealthy))
	a = h.post(testModel, "", "x")
	if a.status != http.StatusServiceUnavailable || a.errorCode() != CodeNoAvailableWorkers ||
		a.header.Get(ErrorCodeHeader) != CodeNoAvailableWorkers {
		t.Fatalf("got %d %s, want 503 no_available_workers", a.status, a.body)
	}
}

// With --worker-overload-shed a pool that is all overloaded gets the spec's
// exact answer, immediately and without internal retries.
func TestShedAnswerIsExactAndNotRetried(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.WorkerOverloadShed = true; o.LoadMonitorInterval = 7 })
	a1, a2 := newEngine(t, "a", nil), newEngine(t, "b", nil)
	h.apply(a1.worker(vetoed(VetoOverload)), a2.worker(vetoed(VetoOverload), waiting(3)))

	got := h.post(testModel, "", "hi")
	want := `{"error":{"type":"server_error","code":"worker_overload_protection_shed",` +
		`"message":"All workers for model 'meta-llama/Llama-3.1-8B-Instruct' are overloaded","param":null}}`
	if got.status != http.StatusServiceUnavailable || got.body != want {
		t.Fatalf("got %d\n%s\nwant 503\n%s", got.status, got.body, want)
	}
	for k, v := range map[string]string{"Content-Type": "application/json", "Retry-After": "7",
		"X-SMG-Error-Code": "worker_overload_protection_shed"} {
		if got.header.Get(k) != v {
			t.Errorf("header %s = %q, want %q", k, got.header.Get(k), v)
		}
	}
	if n := a1.hits.Load() + a2.hits.Load(); n != 0 {
		t.Fatalf("a shed request reached workers %d times", n)
	}
	if h.counter("smg_worker_overload_shed_total", StageSelection) != 1 ||
		h.counter("smg_worker_overload_fallback_total", StageSelection) != 0 {
		t.Fatal("want shed{selection}=1 and no fallback")
	}
	if testutil.ToFloat64(h.r.metrics.retries) != 0 {
		t.Fatal("a shed was retried")
	}
}

// The shed header goes out in the spec's spelling, not Go's canonical form.
func TestShedHeaderSpellingOnTheWire(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.WorkerOverloadShed = true })
	e := newEngine(t, "w", nil)
	h.apply(e.worker(vetoed(VetoOverload)))
	conn, err := net.Dial("tcp", h.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"model":"` + testModel + `"}`
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
		"Content-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
	raw, err := io.ReadAll(conn)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), "\r\nX-SMG-Error-Code: worker_overload_protection_shed\r\n") {
		t.Fatalf("raw answer lacks the header in the spec's spelling:\n%s", raw)
	}
}

// Dispatch-time re-check: a worker flagged between selection and dispatch is
// shed with the dispatch message when shedding is on; otherwise the dispatch stands.
func TestDispatchTimeRecheck(t *testing.T) {
	for _, shed := range []bool{true, false} {
		t.Run(fmt.Sprintf("shed=%v", shed), func(t *testing.T) {
			h := newHarness(t, func(o *Options) { o.WorkerOverloadShed = shed; o.Policy = PolicyRoundRobin })
			e := newEngine(t, "only", nil)
			h.apply(e.worker())
			h.r.beforeDispatch = func() { h.apply(e.worker(vetoed(VetoOverload))) }
			a := h.post(testModel, "", "x")
			if !shed {
				if a.status != http.StatusOK || a.servedBy() != "only" {
					t.Fatalf("without shedding the dispatch must stand, got %d %s", a.status, a.body)
				}
				return
			}
			want := fmt.Sprintf(`{"error":{"type":"server_error","code":"worker_overload_protection_shed",`+
				`"message":"Worker '%s' for model '%s' became overloaded before dispatch","param":null}}`, e.srv.URL, testModel)
			if a.status != http.StatusServiceUnavailable || a.body != want || a.header.Get("Retry-After") != "10" {
				t.Fatalf("got %d %q Retry-After %q\nwant %s", a.status, a.body, a.header.Get("Retry-After"), want)
			}
			if e.hits.Load() != 0 {
				t.Fatal("request was dispatched")
			}
			if h.counter("smg_worker_overload_shed_total", StageDispatch) != 1 ||
				h.counter("smg_worker_overload_shed_total", StageSelection) != 0 {
				t.Fatal("want shed{dispatch}=1")
			}
		})
	}
}

// A liveness veto still steers with shedding on, and an overloaded worker is
// never the fallback then.
func TestLivenessStillSteersWhenShedding(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.WorkerOverloadShed = true })
	over := newEngine(t, "over", nil)
	gone := newEngine(t, "gone", nil)
	h.apply(over.worker(vetoed(VetoOverload)), gone.worker(vetoed(VetoUnreachable), waiting(50)))
	for range 5 {
		a := h.post(testModel, "", "x")
		if a.status != http.StatusOK || a.servedBy() != "gone" {
			t.Fatalf("got %d from %q, want steer to the liveness-vetoed worker", a.status, a.servedBy())
		}
	}
	if over.hits.Load() != 0 {
		t.Fatal("an overloaded worker was used as fallback while shedding")
	}
	if h.counter("smg_worker_liveness_fallback_total", StageSelection) != 5 ||
		h.counter("smg_worker_overload_shed_total", StageSelection) != 0 {
		t.Fatal("want 5 liveness fallbacks and no shed")
	}
}

// A worker both wedged and over its overload ceiling (the liveness veto
// outranks overload in Veto, Overloaded keeps the second cause) is never the
// fallback while shedding: with only such workers the pool sheds, and next
// to a worker the liveness tracker doubts alone, that one is taken.
func TestWedgedAndOverloadedIsNeverTheShedFallback(t *testing.T) {
	both := func(w *Worker) {
		w.Veto, w.VetoReason = VetoWedged, "no progress"
		w.Overloaded, w.OverloadReason = true, "waiting_requests 9 >= 8"
	}
	h := newHarness(t, func(o *Options) { o.WorkerOverloadShed = true })
	a := newEngine(t, "a", nil)
	h.apply(a.worker(both))
	if got := h.post(testModel, "", "x"); got.status != http.StatusServiceUnavailable || got.errorCode() != "worker_overload_protection_shed" {
		t.Fatalf("got %d %s, want the overload shed", got.status, got.body)
	}
	b := newEngine(t, "b", nil)
	h.apply(a.worker(both, waiting(0)), b.worker(vetoed(VetoWedged), waiting(50)))
	for range 3 {
		if got := h.post(testModel, "", "x"); got.status != http.StatusOK || got.servedBy() != "b" {
			t.Fatalf("got %d from %q, want steer to the worker doubted by liveness alone", got.status, got.servedBy())
		}
	}
	if a.hits.Load() != 0 {
		t.Fatal("a worker over its overload ceiling was the fallback while shedding")
	}
	// Both causes show in /loads.
	var loads LoadsResponse
	if err := json.Unmarshal([]byte(h.get("/loads").body), &loads); err != nil {
		t.Fatal(err)
	}
	for _, w := range loads.Workers {
		if w.WorkerID == "a" && (w.Veto != "wedged" || !w.Overloaded || w.OverloadReason != "waiting_requests 9 >= 8") {
			t.Fatalf("/loads shows %+v, want both the wedged veto and the overload cause", w)
		}
	}
}

// Mixed causes are not a shed: overloaded workers plus workers out for another
// reason (unhealthy, breaker open) give no_available_workers with shedding on,
// and steer to the overloaded one with shedding off.
func TestMixedCausesAreNotAShed(t *testing.T) {
	for _, other := range []string{"unhealthy", "breaker-open"} {
		t.Run(other, func(t *testing.T) {
			for _, shed := range []bool{true, false} {
				h := newHarness(t, func(o *Options) { o.WorkerOverloadShed = shed })
				over := newEngine(t, "over", nil)
				out := newEngine(t, "out", nil)
				outWorker := out.worker()
				if other == "unhealthy" {
					outWorker.Healthy = false
				}
				h.apply(over.worker(vetoed(VetoOverload)), outWorker)
				if other == "breaker-open" {
					tripBreaker(h, "out")
				}
				a := h.post(testModel, "", "x")
				if shed {
					if a.status != http.StatusServiceUnavailable || a.errorCode() != CodeNoAvailableWorkers {
						t.Fatalf("shed on: got %d %s, want 503 no_available_workers", a.status, a.body)
					}
					if h.counter("smg_worker_overload_shed_total", StageSelection) != 0 {
						t.Fatal("mixed causes counted as a shed")
					}
				} else if a.status != http.StatusOK || a.servedBy() != "over" {
					t.Fatalf("shed off: got %d from %q, want steer to the overloaded worker", a.status, a.servedBy())
				}
			}
		})
	}
}

func tripBreaker(h *harness, id string) {
	v := h.r.view.Load()
	st := v.states[v.index(id)]
	for range h.r.opts.CBFailureThreshold {
		st.breaker.failure(&h.r.cb, h.r.now())
	}
	if st.breaker.allow(&h.r.cb, h.r.now()) {
		h.t.Fatal("breaker did not open")
	}
}

// X-SMG-Error-Code from a worker never reaches the client.
func TestWorkerErrorCodeHeaderIsStripped(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.DisableRetries = true })
	forger := newEngine(t, "forger", func(w http.ResponseWriter, r *http.Request) {
		w.Header()["X-SMG-Error-Code"] = []string{"worker_overload_protection_shed"}
		w.Header().Set("X-Smg-Error-Code", "forged")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"error":"busy"}`))
	})
	h.apply(forger.worker())
	a := h.post(testModel, "", "x")
	if a.status != http.StatusServiceUnavailable || !strings.Contains(a.body, "busy") {
		t.Fatalf("got %d %s, want the worker's 503 forwarded", a.status, a.body)
	}
	for k := range a.header {
		if strings.EqualFold(k, ErrorCodeHeader) {
			t.Fatalf("worker's %s reached the client: %v", k, a.header[k])
		}
	}
}

// FailOpen drops every veto and keeps routing; the next snapshot brings them back.
func TestFailOpen(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.WorkerOverloadShed = true })
	e := newEngine(t, "w", nil)
	h.apply(e.worker(vetoed(VetoOverload)))
	if a := h.post(testModel, "", "x"); a.errorCode() != CodeShed {
		t.Fatalf("want a shed before failing open, got %d %s", a.status, a.body)
	}
	h.r.FailOpen()
	a := h.post(testModel, "", "x")
	if a.status != http.StatusOK || a.servedBy() != "w" {
		t.Fatalf("after FailOpen got %d %s, want routed", a.status, a.body)
	}
	if h.counter("smg_worker_overload_fallback_total", StageSelection) != 0 {
		t.Fatal("a fail-open route counted as a fallback")
	}
	if loads := h.get("/loads"); !strings.Contains(loads.body, `"fail_open":true`) {
		t.Fatalf("/loads does not show fail-open: %s", loads.body)
	}
	h.apply(e.worker(vetoed(VetoOverload)))
	if a := h.post(testModel, "", "x"); a.errorCode() != CodeShed {
		t.Fatalf("a new snapshot must restore the veto, got %d %s", a.status, a.body)
	}
}

// A 503 that a worker (for instance a nested gateway) marks as a shed is
// forwarded, code stripped, and not retried.
func TestWorkerShedIsNotRetried(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.Policy = PolicyRoundRobin })
	shedder := newEngine(t, "shedder", func(w http.ResponseWriter, _ *http.Request) {
		w.Header()["X-SMG-Error-Code"] = []string{CodeShed}
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	good := newEngine(t, "good", nil)
	h.apply(shedder.worker(), good.worker())
	statuses := map[int]int{}
	for range 4 {
		a := h.post(testModel, "", "x")
		statuses[a.status]++
		if a.header.Get(ErrorCodeHeader) != "" {
			t.Fatal("worker's code reached the client")
		}
	}
	if statuses[http.StatusServiceUnavailable] != 2 || testutil.ToFloat64(h.r.metrics.retries) != 0 {
		t.Fatalf("statuses %v, retries %v: a worker's shed was retried", statuses, testutil.ToFloat64(h.r.metrics.retries))
	}
}

// A shed names the model the request asked for, and no model when it named
// none (never "model ”").
func TestShedMessageNamesTheModelOnlyWhenGiven(t *testing.T) {
	e := newEngine(t, "a", nil)
	h := newHarness(t, func(o *Options) { o.WorkerOverloadShed = true })
	h.apply(e.worker(vetoed(VetoOverload)))
	for body, want := range map[string]string{
		`{"model":"` + testModel + `","messages":[]}`: "All workers for model '" + testModel + "' are overloaded",
		`{"messages":[]}`: "All workers are overloaded",
	} {
		a := h.send("/v1/chat/completions", body, "")
		var got struct {
			Error struct{ Message string } `json:"error"`
		}
		_ = json.Unmarshal([]byte(a.body), &got)
		if a.status != http.StatusServiceUnavailable || a.errorCode() != CodeShed || got.Error.Message != want {
			t.Errorf("%s: %d %q, want the shed answer %q", body, a.status, got.Error.Message, want)
		}
	}
}
