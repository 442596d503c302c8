package router

import (
	"sync"
	"sync/atomic"
)

// ownReports are this router's recent reports of the prompt tokens it has
// in flight on one worker: its part of the control plane's sum ahead. The
// sum holds one of them (the report the control plane acknowledged last
// before the worker's state arrived, Worker.AheadReport), seldom the latest,
// so the part to subtract is looked up by report number. Only changes are
// kept: a report that repeats the count before it adds nothing.
type ownReports struct {
	latest  atomic.Int64                 // the latest report's count: the part when the report the sum holds is unknown
	changes atomic.Pointer[[]reportPart] // oldest first, at most maxOwnReports
	mu      sync.Mutex                   // serializes record
}

// reportPart is a count reported from report seq on (until the next change).
type reportPart struct {
	seq    uint64
	tokens int64
}

// maxOwnReports bounds the changes kept per worker: a worker's state is sent
// again within a load interval of a change of its sum, a few reports.
const maxOwnReports = 16

// record notes tokens as reported in report seq (0: not numbered).
func (o *ownReports) record(seq uint64, tokens int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.latest.Store(tokens)
	if seq == 0 {
		return
	}
	var cur []reportPart
	if p := o.changes.Load(); p != nil {
		cur = *p
	}
	if n := len(cur); n > 0 && (cur[n-1].tokens == tokens || cur[n-1].seq >= seq) {
		return
	}
	if len(cur) == maxOwnReports {
		cur = cur[1:]
	}
	next := make([]reportPart, 0, len(cur)+1)
	next = append(append(next, cur...), reportPart{seq, tokens})
	o.changes.Store(&next)
}

// at is the count this router reported in report seq, if it is still kept.
func (o *ownReports) at(seq uint64) (int64, bool) {
	p := o.changes.Load()
	if seq == 0 || p == nil {
		return 0, false
	}
	cs := *p
	for i := len(cs) - 1; i >= 0; i-- {
		if cs[i].seq <= seq {
			return cs[i].tokens, true
		}
	}
	return 0, false // older than every change kept
}

// part is this router's part of a sum that holds report seq: that report's
// count, or the latest report's when seq is 0 (a control plane that does
// not acknowledge reports) or no longer kept.
func (o *ownReports) part(seq uint64) int64 {
	if n, ok := o.at(seq); ok {
		return n
	}
	return o.latest.Load()
}

// JumpTokens is how far this router's prompt tokens in flight on a worker
// may move from its latest report before it asks to report early
// (ReportSoon): the control plane sends a jump of as much to the other
// routers at once (evidence.AheadJumpTokens). Rises and falls alike: the
// others under-predict behind a long prompt they have not heard of, and
// over-predict behind one already prefilled (learning too fast a rate from
// it).
const JumpTokens = 512

// ReportSoon is signalled when a dispatch or a first token moved this
// router's prompt tokens in flight on a worker by JumpTokens or more since
// its latest report: the watch client then sends a report without waiting
// for its tick (at most one early report per watchclient.MinEarlyReport).
func (r *Router) ReportSoon() <-chan struct{} { return r.reportSoon }

// addPrompt moves the prompt tokens in flight on st by tokens (a dispatch,
// or its first token or failure with -tokens) and asks for an early report
// when they jump.
func (r *Router) addPrompt(st *workerState, tokens int64) {
	if d := st.promptTokens.Add(tokens) - st.reported.latest.Load(); d < JumpTokens && d > -JumpTokens {
		return
	}
	select {
	case r.reportSoon <- struct{}{}:
	default: // one is pending: its report will carry this one too
	}
}
