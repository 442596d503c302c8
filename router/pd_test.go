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
	h := newHarness(t, func(o *Options) { o.PDDisaggregation = true })
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
}

func TestPDPrefillFailureFailsTheRequestAndCancelsDecode(t *testing.T) {
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
	h := newHarness(t, func(o *Options) { o.PDDisaggregation = true })
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
}

func TestPDStreamsFromDecode(t *testing.T) {
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
	h := newHarness(t, func(o *Options) { o.PDDisaggregation = true })
	h.apply(pdWorker(prefill, TypePrefill), pdWorker(decode, TypeDecode))
	a := h.send("/v1/chat/completions", `{"model":"`+testModel+`","stream":true,"messages":[]}`, "")
	if a.status != http.StatusOK || !strings.Contains(a.body, `{"tok":2}`) || strings.Contains(a.body, `"p":1`) {
		t.Fatalf("stream = %d %q, want the decode leg's events only", a.status, a.body)
	}
}

func TestPDWindowFullShedsWithRetryAfter(t *testing.T) {
	release := make(chan struct{})
	prefill := newEngine(t, "p1", nil)
	decode := newEngine(t, "d1", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		<-release
	})
	h := newHarness(t, func(o *Options) { o.PDDisaggregation, o.PDAdmissionWaitSecs = true, 0 })
	h.apply(pdWorker(prefill, TypePrefill), pdWorker(decode, TypeDecode, func(w *Worker) { w.MaxRunning, w.WindowShare = 2, 1 }))

	first := make(chan answer, 1)
	go func() { first <- h.post(testModel, "", "one") }()
	waitUntil(t, func() bool { return h.r.view.Load().states[1].gate.inFlight.Load() == 1 })
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
}

func TestPDEveryPairVetoedSteersOrSheds(t *testing.T) {
	prefill := newEngine(t, "p1", nil)
	decode := newEngine(t, "d1", nil)
	for _, shed := range []bool{false, true} {
		h := newHarness(t, func(o *Options) { o.PDDisaggregation, o.WorkerOverloadShed = true, shed })
		h.apply(pdWorker(prefill, TypePrefill), pdWorker(decode, TypeDecode, vetoed(VetoOverload)))
		a := h.post(testModel, "", "x")
		switch {
		case shed && (a.status != http.StatusServiceUnavailable || a.errorCode() != CodeShed):
			t.Errorf("shed on: %d %s, want worker_overload_protection_shed", a.status, a.body)
		case !shed && (a.status != http.StatusOK || h.counter("smg_worker_overload_fallback_total", StageSelection) != 1):
			t.Errorf("shed off: %d %s, want steered to the overloaded pair", a.status, a.body)
		}
	}
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
