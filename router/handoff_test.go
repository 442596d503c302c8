package router

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// loanRouters are two routers that list each other in --peer-routers and
// share worker e's window.
func loanRouters(t *testing.T, e *engine, shareA, shareB int64) (a, b *harness) {
	noWait := func(o *Options) {
		windowsOn(PolicyRoundRobin)(o)
		o.WorkerAdmissionWaitSecs = 0
	}
	b = newHarness(t, noWait)
	a = newHarness(t, func(o *Options) {
		noWait(o)
		o.PeerRouters = "http://127.0.0.1:1, " + b.srv.URL + "/" // an unreachable peer is skipped
	})
	b.r.handoff.peers, _ = parsePeers(a.srv.URL) // b lends to a (b's listener exists only now)
	a.apply(e.worker(rooms(4), func(w *Worker) { w.WindowShare = shareA }))
	b.apply(e.worker(rooms(4), func(w *Worker) { w.WindowShare = shareB }))
	return a, b
}

// TestLoanFromAPeerWithRoom: a request that finds no room in its router's
// share borrows a peer's free room and is sent to that worker by its own
// router; the room stays in the lender's count until the answer ends; when
// every peer is full too, the client gets the spec's shed answer.
func TestLoanFromAPeerWithRoom(t *testing.T) {
	release := make(chan struct{})
	e := holdingEngine(t, "w", release)
	a, b := loanRouters(t, e, 1, 1)
	openRelease := gateOpen(t, release)

	first := make(chan answer, 1)
	go func() { first <- a.post(testModel, "", "one") }()
	waitUntil(t, func() bool { return e.hits.Load() == 1 })
	second := make(chan answer, 1)
	go func() { second <- a.post(testModel, "", "two") }()
	waitUntil(t, func() bool { return e.hits.Load() == 2 })
	if a.inFlight("w") != 1 || b.inFlight("w") != 1 {
		t.Fatalf("rooms held: router a %d, router b %d; want one each (b lent its room)", a.inFlight("w"), b.inFlight("w"))
	}

	full := a.post(testModel, "", "three")
	if full.status != http.StatusServiceUnavailable || full.errorCode() != CodeShed || full.header.Get("Retry-After") == "" {
		t.Fatalf("both shares full: %d %s, want 503 %s with Retry-After", full.status, full.body, CodeShed)
	}
	if e.hits.Load() != 2 {
		t.Fatalf("worker hits = %d, want 2: nothing past the window", e.hits.Load())
	}

	openRelease()
	for _, c := range []chan answer{first, second} {
		if got := <-c; got.status != http.StatusOK || got.servedBy() != "w" {
			t.Fatalf("answer %d %q from %q, want 200 from the worker", got.status, got.body, got.servedBy())
		}
	}
	waitUntil(t, func() bool { return b.inFlight("w") == 0 }) // the loan ended with the answer
	if n := testutil.ToFloat64(a.r.handoff.borrowed); n != 1 {
		t.Errorf("a: loans borrowed = %v, want 1", n)
	}
	if n := testutil.ToFloat64(a.r.handoff.none); n != 1 {
		t.Errorf("a: no loan = %v, want 1", n)
	}
	if n := testutil.ToFloat64(b.r.handoff.lent); n != 1 {
		t.Errorf("b: loans lent = %v, want 1", n)
	}
}

// TestLoanWithoutAShareHereStreams: a router holding no room at all serves
// a streamed request through a peer's room, the answer straight from the
// worker.
func TestLoanWithoutAShareHereStreams(t *testing.T) {
	const events = "data: {\"n\":1}\n\ndata: {\"n\":2}\n\ndata: [DONE]\n\n"
	e := newEngine(t, "s", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for ev := range strings.SplitAfterSeq(events, "\n\n") {
			_, _ = io.WriteString(w, ev)
			w.(http.Flusher).Flush()
		}
	})
	a, b := loanRouters(t, e, -1, 1) // router a holds no room
	got := a.send("/v1/chat/completions", `{"model":"`+testModel+`","stream":true,"messages":[]}`, "")
	if got.status != http.StatusOK || got.servedBy() != "s" || got.body != events {
		t.Fatalf("answer through a loan: %d %v %q, want the worker's stream", got.status, got.header, got.body)
	}
	waitUntil(t, func() bool { return b.inFlight("s") == 0 })
}

// TestLendOnlyToPeers: a loan asked from an address that is not a peer is
// refused; a malformed one gets 400; a router with waiters of its own, or no
// room, lends nothing.
func TestLendOnlyToPeers(t *testing.T) {
	e := newEngine(t, "w", nil)
	stranger := newHarness(t, func(o *Options) {
		windowsOn(PolicyRoundRobin)(o)
		o.PeerRouters = "http://192.0.2.1:8080" // not the test's address
	})
	stranger.apply(e.worker(rooms(4), func(w *Worker) { w.WindowShare = 2 }))
	if got := stranger.send(LendPath+"?model="+testModel+"&need=1", "", ""); got.status != http.StatusForbidden || got.errorCode() != CodeNotAPeer {
		t.Fatalf("a loan asked by a stranger: %d %s, want 403 %s", got.status, got.body, CodeNotAPeer)
	}
	if stranger.inFlight("w") != 0 {
		t.Fatal("a refused loan holds a room")
	}

	_, b := loanRouters(t, e, 0, -1) // b holds no room
	for q, want := range map[string]int{
		"?model=" + testModel + "&need=0":                          http.StatusBadRequest,
		"?model=" + testModel + "&need=x":                          http.StatusBadRequest,
		"?model=" + testModel + "&need=1":                          http.StatusServiceUnavailable, // no room at b
		"?model=nosuchmodel&need=1":                                http.StatusServiceUnavailable,
		"?model=" + testModel + "&need=1&tenant=auth:x&class=nope": http.StatusBadRequest,
	} {
		req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, b.srv.URL+LendPath+q, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := do(t, req); got.status != want || got.header.Get(LentWorkerHeader) != "" {
			t.Errorf("loan %s: %d %s, want %d and no worker", q, got.status, got.body, want)
		}
	}
}

func TestParsePeers(t *testing.T) {
	for in, ok := range map[string]bool{
		"":                                  true,
		"http://r1:8080, https://r2:8443/ ": true,
		"r1:8080":                           false,
		"ftp://r1":                          false,
		"http://":                           false,
		"http://u:p@r1":                     false,
		"http://r1?x=1":                     false,
		"http://r1\x7f":                     false,
	} {
		if _, err := parsePeers(in); (err == nil) != ok {
			t.Errorf("parsePeers(%q): err %v, want ok %v", in, err, ok)
		}
	}
}

// roundTripFunc is an http.RoundTripper from a function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A peer that does not answer delays a request without a room by askWait
// at most; a peer that lends is taken at once.
func TestBorrowWaitsForASilentPeerAskWaitAtMost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		silent, lender := &url.URL{Scheme: "http", Host: "silent"}, &url.URL{Scheme: "http", Host: "lender"}
		client := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.URL.Host == "silent" {
				<-r.Context().Done() // never answers while the request lives
				return nil, r.Context().Err()
			}
			h := http.Header{}
			h.Set(LentWorkerHeader, "w1")
			return &http.Response{StatusCode: http.StatusOK, Header: h, Body: io.NopCloser(strings.NewReader(""))}, nil
		})}
		newH := func(peers ...*url.URL) *handoff {
			reg := prometheus.NewRegistry()
			h, err := newHandoff(peers, DefaultOptions(), reg)
			if err != nil {
				t.Fatal(err)
			}
			h.client = client
			return h
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()

		start := time.Now()
		if l := newH(silent).borrow(ctx, "m", 1, 0, false); l != nil {
			t.Fatalf("a silent peer lent %+v", l)
		}
		if d := time.Since(start); d != askWait {
			t.Fatalf("waited %s for a silent peer, want askWait %s", d, askWait)
		}
		start = time.Now()
		l := newH(silent, lender).borrow(ctx, "m", 1, 0, false)
		if l == nil || l.worker != "w1" {
			t.Fatalf("loan %+v, want w1's from the lender", l)
		}
		if d := time.Since(start); d != 0 {
			t.Fatalf("the lender's loan was taken after %s, want at once", d)
		}
		l.release()
		cancel()
		synctest.Wait()
	})
}

// pooledDoc is fairDoc with both tenants of weight 1: a floods, b is steady.
var pooledDoc = fairDoc[:strings.Index(fairDoc, "tenant_policies:")]

// TestPooledHeadroomBorrowedAtTheDoor: with fair shares and --peer-routers,
// a request of a tenant under its weighted share that finds its router's
// scheduler full is served at once on a room a peer lends (the peer's
// scheduler admits it and counts it), instead of waiting here for a
// completion; this router's scheduler holds no slot for it.
func TestPooledHeadroomBorrowedAtTheDoor(t *testing.T) {
	release := make(chan struct{})
	e := holdingEngine(t, "w", release)
	noWait := func(o *Options) {
		windowsOn(PolicyRoundRobin)(o)
		o.WorkerAdmissionWaitSecs = 0
	}
	b, _ := schedHarness(t, -1, pooledDoc, noWait)
	a, _ := schedHarness(t, -1, pooledDoc, func(o *Options) {
		noWait(o)
		o.PeerRouters = b.srv.URL
	})
	b.r.handoff.peers, _ = parsePeers(a.srv.URL)
	a.apply(e.worker(rooms(4), func(w *Worker) { w.WindowShare = 2 }))
	b.apply(e.worker(rooms(4), func(w *Worker) { w.WindowShare = 2 }))
	openRelease := gateOpen(t, release)

	answers := make(chan answer, 3)
	for range 2 {
		go func() { answers <- a.sendAs("sk-a", "", "flood") }()
	}
	waitUntil(t, func() bool { return e.hits.Load() == 2 })
	go func() { answers <- a.sendAs("sk-b", "", "steady") }()
	waitUntil(t, func() bool { return e.hits.Load() == 3 })
	inflight := map[string]string{"class": "default"}
	if a.inFlight("w") != 2 || b.inFlight("w") != 1 ||
		a.metricValue("smg_scheduler_inflight", inflight) != 2 || b.metricValue("smg_scheduler_inflight", inflight) != 1 {
		t.Fatalf("rooms a %d b %d, scheduler slots a %v b %v: want the steady request on b's room, counted by b's scheduler",
			a.inFlight("w"), b.inFlight("w"), a.metricValue("smg_scheduler_inflight", inflight), b.metricValue("smg_scheduler_inflight", inflight))
	}
	openRelease()
	for range 3 {
		if got := <-answers; got.status != http.StatusOK {
			t.Fatalf("answer %d %s", got.status, got.body)
		}
	}
	waitUntil(t, func() bool { return b.inFlight("w") == 0 && b.metricValue("smg_scheduler_inflight", inflight) == 0 })
	if n := testutil.ToFloat64(a.r.handoff.borrowed); n != 1 {
		t.Errorf("a: loans borrowed = %v, want 1", n)
	}
}

// A room the door borrowed on a worker this router does not know (the
// lender's view is newer) is given back, and the request goes on here as
// any other: it waits for a room of its own and is served there.
func TestPooledHeadroomLoanOfAnUnknownWorkerIsGivenBack(t *testing.T) {
	release := make(chan struct{})
	e := holdingEngine(t, "w", release)
	other := holdingEngine(t, "w2", release)
	noWait := func(o *Options) {
		windowsOn(PolicyRoundRobin)(o)
		o.WorkerAdmissionWaitSecs = 0
	}
	b, _ := schedHarness(t, -1, pooledDoc, noWait)
	a, _ := schedHarness(t, -1, pooledDoc, func(o *Options) {
		noWait(o)
		o.PeerRouters = b.srv.URL
	})
	b.r.handoff.peers, _ = parsePeers(a.srv.URL)
	a.apply(e.worker(rooms(4), func(w *Worker) { w.WindowShare = 2 }))
	b.apply(other.worker(rooms(4), func(w *Worker) { w.WindowShare = 2 }))
	openRelease := gateOpen(t, release)

	answers := make(chan answer, 3)
	for range 2 {
		go func() { answers <- a.sendAs("sk-a", "", "flood") }()
	}
	waitUntil(t, func() bool { return e.hits.Load() == 2 })
	go func() { answers <- a.sendAs("sk-b", "", "steady") }()
	// b lent a room on w2, a gave it back and waits for one on w.
	waitUntil(t, func() bool { return a.waiters() == 1 })
	waitUntil(t, func() bool { return b.inFlight("w2") == 0 })
	if n := other.hits.Load(); n != 0 {
		t.Fatalf("w2 (unknown to a) got %d requests", n)
	}
	openRelease()
	for range 3 {
		if got := <-answers; got.status != http.StatusOK {
			t.Fatalf("answer %d %s", got.status, got.body)
		}
	}
	if e.hits.Load() != 3 || other.hits.Load() != 0 {
		t.Fatalf("w served %d, w2 %d: want all 3 on w", e.hits.Load(), other.hits.Load())
	}
}
