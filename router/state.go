package router

import (
	"math"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/smg-project/smg/router/admission"
	"github.com/smg-project/smg/router/ttft"
)

// workerState holds what this router alone knows about a worker. It is keyed
// by worker ID and survives snapshot swaps; the snapshot entry stays immutable.
type workerState struct {
	id   string
	slot uint32 // small stable number used by the affinity tables
	rank uint32 // place in the fleet's fixed order for packed requests (packRank of id)

	// loadRevision is the report the dispatch count is relative to; written
	// only under Router.applyMu.
	loadRevision uint64
	dispatched   atomic.Int64 // dispatches since the last load report

	breaker breaker

	gate admission.Gate // this router's rooms in the worker's running window (decode, or any with --worker-admission-window)
	// wls are the waitlists of the pools this worker serves (its model's and
	// the all-models pool), poked when it frees a room; set by install.
	wls atomic.Pointer[[]*admission.Waitlist]

	// Observations for the control plane.
	streams      atomic.Int64  // the pile: streaming gRPC generations in flight
	promptTokens atomic.Int64  // estimated prompt tokens of requests in flight
	lastProgress atomic.Int64  // unix nanoseconds of the last chunk or completion
	connFailures atomic.Uint64 // connection-level upstream failures since the last Observations
	contacts     atomic.Uint64 // answers received since the last Observations (contact)
	lastContact  atomic.Int64  // unix nanoseconds of the latest answer
	prefillRate  atomic.Uint64 // float64 bits: prompt tokens/s measured to the first byte (EWMA)

	// TTFT prediction: the worker's prefill rate and step time, and the
	// prompt tokens in flight this router reported lately (its part of the
	// control plane's sum, by report).
	ttft     *ttft.Estimator
	reported ownReports

	base atomic.Pointer[baseURL] // the worker's URL, parsed once

	// grpcDownUntil (router nanoseconds): a gRPC worker whose tokenizer
	// cannot be loaded is not a candidate until then.
	grpcDownUntil atomic.Int64
}

// routable reports whether the breaker and the data path let a request
// through at now.
func (st *workerState) routable(cb *breakerConfig, now int64) bool {
	return st.breaker.allow(cb, now) && now >= st.grpcDownUntil.Load()
}

// baseURL is a worker URL as registered and as parsed.
type baseURL struct {
	raw string
	u   url.URL
}

// upstreamURL is in's path and query on the worker's URL raw, parsed only
// when the worker's URL changes.
func (st *workerState) upstreamURL(raw string, in *http.Request) (url.URL, error) {
	b := st.base.Load()
	if b == nil || b.raw != raw {
		u, err := url.Parse(strings.TrimSuffix(raw, "/"))
		if err != nil {
			return url.URL{}, err
		}
		b = &baseURL{raw: raw, u: *u}
		st.base.Store(b)
	}
	u := b.u
	u.Path, u.RawPath, u.RawQuery = b.u.Path+in.URL.Path, "", in.URL.RawQuery
	return u, nil
}

// notePrefill folds one measurement (tokens prefilled before the first byte,
// over that time) into the worker's prefill rate.
func (st *workerState) notePrefill(tokens int64, d time.Duration) {
	if tokens <= 0 || d <= 0 {
		return
	}
	sample := float64(tokens) / d.Seconds()
	for {
		old := st.prefillRate.Load()
		prev := math.Float64frombits(old)
		next := sample
		if prev > 0 {
			next = 0.8*prev + 0.2*sample
		}
		if st.prefillRate.CompareAndSwap(old, math.Float64bits(next)) {
			return
		}
	}
}

// waitlists returns the waitlists a freed room on this worker may serve.
func (st *workerState) waitlists() []*admission.Waitlist {
	if p := st.wls.Load(); p != nil {
		return *p
	}
	return nil
}

// answered notes an answer from the worker at now: contact, with its time
// (stored first, so a report that takes the count carries a time no older).
func (s *workerState) answered(now time.Time) {
	s.lastContact.Store(now.UnixNano())
	s.contacts.Add(1)
}
