package router

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// pdLegs records the bodies each leg received.
type pdLegs struct {
	mu     sync.Mutex
	bodies map[string]map[string]any
}

func (l *pdLegs) record(name string, r *http.Request) map[string]any {
	b, _ := io.ReadAll(r.Body)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bodies == nil {
		l.bodies = map[string]map[string]any{}
	}
	l.bodies[name] = m
	return m
}

func pdWorker(e *engine, typ string, opts ...func(*Worker)) Worker {
	w := e.worker(opts...)
	w.Type = typ
	return w
}

func TestPDInjectsBootstrapFieldsAndAnswersFromDecode(t *testing.T) {
	forEachPolicy(t, func(t *testing.T, policy string) {
		legs := &pdLegs{}
		handedOver := make(chan struct{}) // like a KV handover: decode answers after prefill
		prefill := newEngine(t, "p1", func(w http.ResponseWriter, r *http.Request) {
			legs.record("prefill", r)
			close(handedOver)
			_, _ = io.WriteString(w, `{"from":"prefill"}`)
		})
		decode := newEngine(t, "d1", func(w http.ResponseWriter, r *http.Request) {
			legs.record("decode", r)
			<-handedOver
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"from":"decode"}`)
		})
		h := newHarness(t, func(o *Options) { o.Policy = policy; o.PDDisaggregation = true })
		h.apply(pdWorker(prefill, TypePrefill, func(w *Worker) { w.BootstrapPort = 8998 }), pdWorker(decode, TypeDecode))

		a := h.post(testModel, "", "hello")
		if a.status != http.StatusOK || a.body != `{"from":"decode"}` || a.servedBy() != "d1" {
			t.Fatalf("answer = %d %q from %q, want the decode leg's", a.status, a.body, a.servedBy())
		}
		p, d := legs.bodies["prefill"], legs.bodies["decode"]
		host := strings.TrimPrefix(prefill.srv.URL, "http://")
		host = host[:strings.LastIndexByte(host, ':')]
		for name, b := range map[string]map[string]any{"prefill": p, "decode": d} {
			if b["bootstrap_host"] != host || b["bootstrap_port"] != float64(8998) || b["bootstrap_room"] == nil {
				t.Errorf("%s leg body %v: want bootstrap_host %q, port 8998 and a room", name, b, host)
			}
			if b["model"] != testModel {
				t.Errorf("%s leg lost the client's fields: %v", name, b)
			}
		}
		if p["bootstrap_room"] != d["bootstrap_room"] {
			t.Errorf("legs got different rooms: %v and %v", p["bootstrap_room"], d["bootstrap_room"])
		}
	})
}

func TestPDPrefillFailureFailsTheRequestAndCancelsDecode(t *testing.T) {
	forEachPolicy(t, func(t *testing.T, policy string) {
		decodeCanceled := make(chan struct{})
		var decodeStarted atomic.Bool
		prefill := newEngine(t, "p1", func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, `{"error":{"message":"bootstrap timeout"}}`)
		})
		decode := newEngine(t, "d1", func(w http.ResponseWriter, r *http.Request) {
			decodeStarted.Store(true)
			_, _ = io.Copy(io.Discard, r.Body)
			<-r.Context().Done() // waits for the KV that never comes
			close(decodeCanceled)
		})
		h := newHarness(t, func(o *Options) { o.Policy = policy; o.PDDisaggregation = true })
		h.apply(pdWorker(prefill, TypePrefill), pdWorker(decode, TypeDecode))

		a := h.post(testModel, "", "hello")
		if a.status != http.StatusBadGateway || a.errorCode() != CodeUpstreamError ||
			!strings.Contains(a.body, "Prefill worker") || !strings.Contains(a.body, "bootstrap timeout") {
			t.Fatalf("answer = %d %s, want 502 upstream_error naming the prefill leg", a.status, a.body)
		}
		select {
		case <-decodeCanceled:
		case <-time.After(3 * time.Second):
			// A prefill that fails at once may cancel the decode leg before it
			// reaches the engine; one that did reach it must have been cancelled.
			if decodeStarted.Load() {
				t.Fatal("the decode leg was not cancelled")
			}
		}
	})
}

func TestPDStreamsFromDecode(t *testing.T) {
	forEachPolicy(t, func(t *testing.T, policy string) {
		prefill := newEngine(t, "p1", func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: {\"p\":1}\n\ndata: [DONE]\n\n")
		})
		decode := newEngine(t, "d1", func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "text/event-stream")
			for i := range 3 {
				_, _ = io.WriteString(w, "data: {\"tok\":"+strconv.Itoa(i)+"}\n\n")
				w.(http.Flusher).Flush()
			}
			_, _ = io.WriteString(w, "data: [DONE]\n\n")
		})
		h := newHarness(t, func(o *Options) { o.Policy = policy; o.PDDisaggregation = true })
		h.apply(pdWorker(prefill, TypePrefill), pdWorker(decode, TypeDecode))
		a := h.send("/v1/chat/completions", `{"model":"`+testModel+`","stream":true,"messages":[]}`, "")
		if a.status != http.StatusOK || !strings.Contains(a.body, `{"tok":2}`) || strings.Contains(a.body, `"p":1`) {
			t.Fatalf("stream = %d %q, want the decode leg's events only", a.status, a.body)
		}
	})
}

func TestPDWindowFullShedsWithRetryAfter(t *testing.T) {
	forEachPolicy(t, func(t *testing.T, policy string) {
		release := make(chan struct{})
		prefill := newEngine(t, "p1", nil)
		decode := newEngine(t, "d1", func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			<-release
		})
		h := newHarness(t, func(o *Options) { o.Policy = policy; o.PDDisaggregation, o.PDAdmissionWaitSecs = true, 0 })
		h.apply(pdWorker(prefill, TypePrefill), pdWorker(decode, TypeDecode, func(w *Worker) { w.MaxRunning, w.WindowShare = 2, 1 }))

		first := make(chan answer, 1)
		go func() { first <- h.post(testModel, "", "one") }()
		waitUntil(t, func() bool { return h.r.view.Load().states[1].gate.InFlight() == 1 })
		a := h.post(testModel, "", "two") // the share of 1 is full
		close(release)
		<-first
		if a.status != http.StatusServiceUnavailable || a.errorCode() != CodeShed ||
			a.header.Get("Retry-After") != "10" || a.header.Get(ErrorCodeHeader) != CodeShed {
			t.Fatalf("answer = %d %v %s, want the shed answer", a.status, a.header, a.body)
		}
		if got := h.counter("smg_worker_overload_shed_total", StagePDAdmission); got != 1 {
			t.Errorf("shed{stage=pd_admission} = %v, want 1", got)
		}
		if got := testutil.ToFloat64(h.r.pdm.sheds); got != 1 {
			t.Errorf("smg_pd_admission_sheds_total = %v, want 1", got)
		}
		// Demand goes to the control plane with every report.
		obs := h.r.Observations()
		if len(obs.Demand) != 1 || obs.Demand[0].WorkerID != "d1" {
			t.Errorf("demand = %+v, want the gated decode worker", obs.Demand)
		}
	})
}

func TestPDEveryPairVetoedSteersOrSheds(t *testing.T) {
	forEachPolicy(t, func(t *testing.T, policy string) {
		prefill := newEngine(t, "p1", nil)
		decode := newEngine(t, "d1", nil)
		for _, shed := range []bool{false, true} {
			h := newHarness(t, func(o *Options) { o.Policy = policy; o.PDDisaggregation, o.WorkerOverloadShed = true, shed })
			h.apply(pdWorker(prefill, TypePrefill), pdWorker(decode, TypeDecode, vetoed(VetoOverload)))
			a := h.post(testModel, "", "x")
			switch {
			case shed && (a.status != http.StatusServiceUnavailable || a.errorCode() != CodeShed):
				t.Errorf("shed on: %d %s, want worker_overload_protection_shed", a.status, a.body)
			case !shed && (a.status != http.StatusOK || h.counter("smg_worker_overload_fallback_total", StageSelection) != 1):
				t.Errorf("shed off: %d %s, want steered to the overloaded pair", a.status, a.body)
			}
		}
	})
}

func TestInjectBootstrapBatchAndEmptyObject(t *testing.T) {
	w := &Worker{URL: "http://10.0.0.7:30000"}
	b, err := injectBootstrap([]byte(`{}`), w, 0)
	if err != nil || !strings.HasPrefix(string(b), `{"bootstrap_host":"10.0.0.7","bootstrap_port":null,"bootstrap_room":`) {
		t.Fatalf("empty object: %s %v", b, err)
	}
	f := requestFields{Text: rawRef(`["a","b","c"]`)}
	rooms, prompts := batchSize(&f)
	if rooms != 3 || prompts != 3 {
		t.Fatalf("batch of 3: rooms %d prompts %d", rooms, prompts)
	}
	b, _ = injectBootstrap([]byte(`{"text":["a","b","c"]}`), w, prompts)
	var m struct {
		BootstrapRoom []uint64 `json:"bootstrap_room"`
	}
	if err := json.Unmarshal(b, &m); err != nil || len(m.BootstrapRoom) != 3 {
		t.Fatalf("batch body %s: want 3 rooms (%v)", b, err)
	}
	for _, r := range m.BootstrapRoom {
		if r >= 1<<63 {
			t.Fatalf("room %d outside SGLang's 63-bit range", r)
		}
	}
	if _, err := injectBootstrap([]byte(`[1]`), w, 0); err == nil {
		t.Fatal("a non-object body was accepted")
	}
}

// waitUntil polls cond (state reached by another goroutine over loopback).
func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(time.Millisecond) // polling, not an assertion
	}
}

// forEachPolicy runs fn once under every routing policy.
func forEachPolicy(t *testing.T, fn func(t *testing.T, policy string)) {
	for _, p := range Policies {
		t.Run(p, func(t *testing.T) { fn(t, p) })
	}
}

// Each leg is chosen from its own pool under every policy: the affinity a
// policy records for the prefill leg (cache_aware's prompt prefix, manual's
// routing key) never sends the decode leg to the prefill worker, so the
// decode gate is always a decode worker's: a batch wider than its window is
// shed at once, and a waiter is admitted when a decode leg ends.
func TestPDLegsStayInTheirPoolsUnderEveryPolicy(t *testing.T) {
	forEachPolicy(t, func(t *testing.T, policy string) {
		hold := make(chan struct{})
		var held atomic.Int64
		prefill := newEngine(t, "p1", nil)
		decode := newEngine(t, "d1", func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			if strings.Contains(string(b), "hold") {
				held.Add(1)
				<-hold
			}
			_, _ = io.WriteString(w, `{"from":"decode"}`)
		})
		h := newHarness(t, func(o *Options) { o.PDDisaggregation, o.Policy, o.PDAdmissionWaitSecs = true, policy, 30 })
		// Engines report a running window on both roles.
		h.apply(pdWorker(prefill, TypePrefill, func(w *Worker) { w.MaxRunning = 8 }),
			pdWorker(decode, TypeDecode, func(w *Worker) { w.MaxRunning, w.WindowShare = 2, 2 }))
		prompt := strings.Repeat("a long shared system prompt ", 20)
		for i := range 4 {
			if a := h.post(testModel, "user-1", prompt); a.status != http.StatusOK || a.servedBy() != "d1" {
				t.Fatalf("request %d = %d %q from %q, want the decode worker's answer", i, a.status, a.body, a.servedBy())
			}
		}
		// Three prompts need three rooms of a window of 2: shed at once,
		// not after the 30 s admission wait, and never sent to the prefill.
		began := time.Now()
		a := h.send("/v1/completions", `{"model":"`+testModel+`","prompt":["x","y","z"]}`, "user-1")
		if a.status != http.StatusServiceUnavailable || a.errorCode() != CodeShed {
			t.Fatalf("batch of 3 over a window of 2 = %d %s from %q, want the shed answer", a.status, a.body, a.servedBy())
		}
		if waited := time.Since(began); waited > 10*time.Second {
			t.Fatalf("the too-wide batch was shed after %v, want at once", waited)
		}
		// Fill the window, queue a third request, free one room: the
		// waiter is admitted on the decode worker.
		answers := make(chan answer, 3)
		for range 2 {
			go func() { answers <- h.post(testModel, "user-1", prompt+" hold") }()
		}
		waitUntil(t, func() bool { return held.Load() == 2 })
		go func() { answers <- h.post(testModel, "user-1", prompt) }()
		waitUntil(t, func() bool {
			var waiting int64
			for _, n := range h.r.view.Load().pd[testModel].decode.wl.WaitingByClass() {
				waiting += n
			}
			return waiting == 1
		})
		close(hold)
		for range 3 {
			if a := <-answers; a.status != http.StatusOK || a.servedBy() != "d1" {
				t.Fatalf("answer %d %q from %q, want the decode worker's", a.status, a.body, a.servedBy())
			}
		}
		if got := testutil.ToFloat64(h.r.pdm.waits); got != 1 {
			t.Fatalf("smg_pd_admission_waits_total = %v, want 1", got)
		}
	})
}

// The prefill and decode legs of one prompt keep their own affinity: the
// decode leg's pin never overwrites the prefill leg's, so a repeated prompt
// stays on the prefill worker that holds its KV cache (cache_aware), and a
// routing key stays on its pinned pair (manual).
func TestPDLegAffinitiesDoNotOverwriteEachOther(t *testing.T) {
	for _, policy := range []string{PolicyCacheAware, PolicyManual} {
		t.Run(policy, func(t *testing.T) {
			engines := map[string]*engine{}
			var workers []Worker
			for _, name := range []string{"p1", "p2", "d1", "d2"} {
				engines[name] = newEngine(t, name, nil)
				typ := TypePrefill
				if name[0] == 'd' {
					typ = TypeDecode
				}
				workers = append(workers, pdWorker(engines[name], typ))
			}
			h := newHarness(t, func(o *Options) { o.PDDisaggregation, o.Policy = true, policy })
			h.apply(workers...)
			prompt := strings.Repeat("the same long prompt ", 30)
			for i := range 10 {
				if a := h.post(testModel, "user-1", prompt); a.status != http.StatusOK {
					t.Fatalf("request %d = %d %s", i, a.status, a.body)
				}
			}
			for _, pair := range [][2]string{{"p1", "p2"}, {"d1", "d2"}} {
				a, b := engines[pair[0]].hits.Load(), engines[pair[1]].hits.Load()
				// A prefill leg may be cancelled before it lands once its
				// decode leg has answered: count where legs went, not how many.
				if a+b == 0 || (a != 0 && b != 0) {
					t.Fatalf("%s got %d legs, %s got %d: want every leg on one of them", pair[0], a, pair[1], b)
				}
			}
		})
	}
}
