package router

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/smg-project/smg/router/admission"
)

// Room loans between routers. Routers that share a worker's window each hold
// a share of it; a room freed at one router idles until that router's next
// arrival, while another router, its own share full, sheds. With
// --peer-routers, a router that finds no room in its shares asks its peers,
// all at once, to lend one: a peer with a room free now (and nobody of its
// own waiting for it) takes it in its own gate and names the worker; the
// borrower sends the request there itself and holds the loan open until the
// answer ends, when the peer gets the room back. The room never leaves the
// lender's count, so a window stays bounded fleet-wide, and the answer takes
// no extra hop.

// LendPath is the route a router lends rooms on (--peer-routers only).
const LendPath = "/smg/lend"

// LentWorkerHeader names the worker whose room a peer lent.
const LentWorkerHeader = "X-SMG-Lent-Worker"

// CodeNotAPeer refuses a loan asked from an address that is not one of
// --peer-routers.
const CodeNotAPeer = "not_a_peer"

// Results of smg_router_room_loans_total.
const (
	loanBorrowed = "borrowed" // a peer lent this router a room
	loanNone     = "none"     // every peer was full or unreachable: shed here
	loanLent     = "lent"     // this router lent a room to a peer
)

// parsePeers reads --peer-routers: http(s) base URLs, comma-separated.
func parsePeers(s string) ([]*url.URL, error) {
	var out []*url.URL
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		u, err := url.Parse(strings.TrimSuffix(p, "/"))
		if err != nil {
			return nil, fmt.Errorf("%q: %v", p, err)
		}
		if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			return nil, fmt.Errorf("%q: want http(s)://host:port of a router", p)
		}
		out = append(out, u)
	}
	return out, nil
}

// handoff is this router's side of room loans: asking peers, and knowing
// which addresses may ask it.
type handoff struct {
	peers                  []*url.URL
	client                 *http.Client
	borrowed, none, lent   prometheus.Counter
	mu                     sync.Mutex
	ips                    map[string]bool // the peers' addresses, as last resolved
	resolved               time.Time
	resolveEvery, holdMost time.Duration
	now                    func() time.Time
}

func newHandoff(peers []*url.URL, opts Options, reg prometheus.Registerer) (*handoff, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "smg_router_room_loans_total",
		Help: "Room loans between routers (--peer-routers), by result: borrowed (a request with no room here got a peer's room), none (every peer was full or unreachable: shed here, or, asked by the scheduler for a tenant under its weighted share, the request waits here), lent (this router lent a room to a peer).",
	}, []string{"result"})
	if err := reg.Register(c); err != nil {
		return nil, err
	}
	h := &handoff{peers: peers, borrowed: c.WithLabelValues(loanBorrowed), none: c.WithLabelValues(loanNone),
		lent: c.WithLabelValues(loanLent), resolveEvery: time.Second,
		holdMost: time.Duration(opts.RequestTimeoutSecs) * time.Second, now: opts.Now}
	if len(peers) > 0 {
		h.client = &http.Client{
			Transport: &http.Transport{
				DialContext:           (&net.Dialer{Timeout: opts.UpstreamDialTimeout, KeepAlive: 30 * time.Second}).DialContext,
				MaxIdleConnsPerHost:   64,
				IdleConnTimeout:       90 * time.Second,
				ResponseHeaderTimeout: 2 * time.Second, // a peer answers a loan at once: it never waits for a room
			},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	return h, nil
}

// loan is a room borrowed from a peer: held until release.
type loan struct {
	worker string // the worker's ID
	body   io.ReadCloser
}

// release gives the room back: closing the loan's exchange ends the
// lender's hold.
func (l *loan) release() { l.body.Close() }

// askWait bounds how long a request without a room waits for its peers'
// answers: a peer lends or refuses at once, so a slower one is in trouble.
const askWait = 250 * time.Millisecond

// borrow asks every peer at once for need rooms in model's pool and keeps
// the first loan granted (the others are given back at once); nil when none
// lends. The loan lives at most as long as ctx. A packed request (its tenant
// over its weighted share) asks the lender to place it packed too.
func (h *handoff) borrow(ctx context.Context, model string, need, tokens int64, pack bool) *loan {
	return h.borrowAs(ctx, model, need, tokens, "", admission.Default, pack)
}

// borrowFor is borrow for a request of tenant in class that the scheduler's
// door admits on a peer's room (pooled headroom): the lender's scheduler
// admits it by its fair-share rules. An empty tenant asks for a room alone.
func (h *handoff) borrowFor(ctx context.Context, model string, need, tokens int64, tenant string, class admission.Class) *loan {
	return h.borrowAs(ctx, model, need, tokens, tenant, class, false)
}

func (h *handoff) borrowAs(ctx context.Context, model string, need, tokens int64, tenant string, class admission.Class, pack bool) *loan {
	if len(h.peers) == 0 {
		return nil
	}
	vals := url.Values{"model": {model}, "need": {strconv.FormatInt(need, 10)}}
	if tokens > 0 {
		vals.Set("tokens", strconv.FormatInt(tokens, 10))
	}
	if pack {
		vals.Set("pack", "1")
	}
	if tenant != "" {
		vals.Set("tenant", tenant)
		vals.Set("class", class.String())
	}
	q := vals.Encode()
	answers := make(chan *loan, len(h.peers))
	for _, p := range h.peers {
		go func() { answers <- h.ask(ctx, p.String()+LendPath+"?"+q) }()
	}
	// The first loan is taken as it comes, and a peer slow to answer delays
	// the shed by askWait at most: late answers are given back as they come.
	waited := time.NewTimer(askWait)
	defer waited.Stop()
	var got *loan
	pending := len(h.peers)
wait:
	for got == nil && pending > 0 {
		select {
		case got = <-answers:
			pending--
		case <-waited.C:
			break wait
		}
	}
	if pending > 0 {
		go func() {
			for range pending {
				if l := <-answers; l != nil {
					l.release()
				}
			}
		}()
	}
	if got == nil {
		h.none.Inc()
		return nil
	}
	h.borrowed.Inc()
	return got
}

// ask asks one peer for a loan.
func (h *handoff) ask(ctx context.Context, u string) *loan {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, nil)
	if err != nil {
		return nil
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return nil
	}
	id := resp.Header.Get(LentWorkerHeader)
	if resp.StatusCode != http.StatusOK || id == "" {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
		resp.Body.Close()
		return nil
	}
	return &loan{worker: id, body: resp.Body}
}

// peer reports whether remoteAddr is one of the peers' addresses. The
// peers' names are resolved again at most every resolveEvery on a miss, so
// a peer that moved is recognized.
func (h *handoff) peer(ctx context.Context, remoteAddr string) bool {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ips[host] {
		return true
	}
	if now := h.now(); h.ips == nil || now.Sub(h.resolved) >= h.resolveEvery {
		h.resolved = now
		h.ips = map[string]bool{}
		for _, p := range h.peers {
			addrs, err := net.DefaultResolver.LookupHost(ctx, p.Hostname())
			if err != nil {
				continue
			}
			for _, a := range addrs {
				h.ips[a] = true
			}
		}
	}
	return h.ips[host]
}

// serveLend lends a peer a room: POST /smg/lend?model=M&need=N. With a room
// free now in model's pool (and nobody of this router waiting for one), it
// takes the room, answers 200 naming the worker in X-SMG-Lent-Worker, and
// holds the room until the peer closes the exchange (its answer ended), the
// router stops or --request-timeout-secs passes. Otherwise it answers 503 at
// once. Only the addresses of --peer-routers may ask.
func (r *Router) serveLend(w http.ResponseWriter, req *http.Request) {
	if len(r.handoff.peers) == 0 || !r.handoff.peer(req.Context(), req.RemoteAddr) {
		writeError(w, http.StatusForbidden, CodeNotAPeer, "Rooms are lent only to the routers of --peer-routers", 0)
		return
	}
	q := req.URL.Query()
	need, err := strconv.ParseInt(q.Get("need"), 10, 64)
	if err != nil || need < 1 || need > 1<<20 {
		writeError(w, http.StatusBadRequest, CodeInvalidJSON, "need must be a positive integer", 0)
		return
	}
	var tokens int64 // the borrower's token claim (--worker-token-budget)
	if t := q.Get("tokens"); t != "" {
		if tokens, err = strconv.ParseInt(t, 10, 64); err != nil || tokens < 0 || tokens > maxRequestTokens {
			writeError(w, http.StatusBadRequest, CodeInvalidJSON, "tokens must be a non-negative integer", 0)
			return
		}
	}
	pack := false // the borrower's request is packed (pack_over_share)
	switch q.Get("pack") {
	case "":
	case "1":
		pack = true
	default:
		writeError(w, http.StatusBadRequest, CodeInvalidJSON, "pack must be 1 or absent", 0)
		return
	}
	tenant := q.Get("tenant")
	class := admission.Default
	if tenant != "" {
		var ok bool
		if class, ok = admission.ParseClass(q.Get("class")); !ok {
			writeError(w, http.StatusBadRequest, CodeInvalidJSON, "class must be a scheduler class", 0)
			return
		}
	}
	model := q.Get("model")
	v := r.view.Load()
	var p *pool
	if v != nil {
		p = v.poolOf(model, false)
	}
	if !r.gating() || p == nil || p.wl.Waiters() > 0 {
		writeError(w, http.StatusServiceUnavailable, CodeShed, "No room to lend", 0)
		return
	}
	if tenant != "" && r.sched != nil && r.schedFromFleet {
		// A request of tenant borrows this router's headroom: this
		// scheduler admits it as an arrival here, or lends nothing.
		t, res := r.sched.Lend(class, tenant, model)
		if res != admission.Admitted {
			writeError(w, http.StatusServiceUnavailable, CodeShed, "No room to lend", 0)
			return
		}
		defer r.sched.Release(t)
		pack = pack || t.Packed()
	}
	g, ok := r.tryRoom(model, false, &request{model: model, need: need, tokens: tokens, pack: pack})
	if !ok || g.i < 0 || g.out != chosen {
		if ok && g.i >= 0 {
			r.releaseRoom(g.v.states[g.i], need, tokens) // a fallback, not a room
		}
		writeError(w, http.StatusServiceUnavailable, CodeShed, "No room to lend", 0)
		return
	}
	st := g.v.states[g.i]
	defer r.releaseRoom(st, need, tokens)
	r.handoff.lent.Inc()
	w.Header()[LentWorkerHeader] = []string{g.v.worker(g.i).ID}
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(http.StatusOK)
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	hold := time.NewTimer(r.handoff.holdMost)
	defer hold.Stop()
	select {
	case <-req.Context().Done():
	case <-r.stopped.Done():
	case <-hold.C:
	}
}

// borrowRoom asks the peers for a room for q in model's pool after this
// router found none: the grant names the lent worker in the newest view.
func (r *Router) borrowRoom(ctx context.Context, model string, q *request) (roomGrant, *loan) {
	return r.loanGrant(model, r.handoff.borrow(ctx, model, q.need, q.tokens, q.pack))
}

// loanGrant is the grant of loan l (nil: none) in model's pool of the newest
// view; a loan of a worker this router does not know is given back.
func (r *Router) loanGrant(model string, l *loan) (roomGrant, *loan) {
	if l == nil {
		return roomGrant{}, nil
	}
	if v := r.view.Load(); v != nil {
		if p := v.poolOf(model, false); p != nil {
			for _, i := range p.idx {
				if v.worker(i).ID == l.worker {
					return roomGrant{v: v, i: i, out: chosen}, l
				}
			}
		}
	}
	l.release() // the lender knows a worker this router does not (yet)
	return roomGrant{}, nil
}

// roomClaim is the rooms and tokens a request asks of a lender, as its
// dispatch counts them.
func (r *Router) roomClaim(f *requestFields) (need, tokens int64) {
	need, _ = batchSize(f)
	if r.opts.WorkerTokenBudget {
		prompt := int64(len(f.prompt()) / r.opts.PromptBytesPerTokenGuess)
		tokens = requestTokens(prompt, expectedOutput(f, int64(r.opts.WorkerTokenBudgetOutputTokens)), need)
	}
	return need, tokens
}
