package registry

import (
	"time"

	"github.com/smg-project/smg/controlplane/judge"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// decide sets w's verdicts from the evidence stored with it, against old,
// the record it replaces (nil for a new worker). It is the one place a
// verdict is decided, and it runs inside the write transaction that commits
// it, so no writer can store a verdict its evidence does not support:
//
//   - a new URL is another engine: its evidence starts afresh;
//   - the rules judge Ready workers only: a worker not Ready keeps no
//     liveness evidence and gets no veto (fail open);
//   - an external worker (a provider) has no load feed: it is never
//     flagged nor judged by liveness, whatever evidence reaches it;
//   - the verdicts themselves are judged's;
//   - leaving unreachable bumps ContactSeq (routers close the worker's
//     breaker).
//
// Reasons are formatted only when the figures behind them change, so the
// ingest hot path does not allocate for them.
func decide(old, w *Worker) {
	if old != nil && old.Spec.GetUrl() != w.Spec.GetUrl() {
		w.Evidence = Evidence{}
	}
	if !w.Ready() || w.External() {
		w.Evidence.Live, w.Evidence.Routers, w.Evidence.PushedAt = judge.Liveness{}, nil, time.Time{}
	}
	w.PromptTokensAhead = w.Evidence.Live.PromptTokensAhead()
	v := judged(w)
	switch {
	case !v.over:
		w.Overloaded, w.OverloadReason = false, ""
	case old != nil && old.Overloaded && old.Thresholds == w.Thresholds &&
		old.Load.GetWaitingRequests() == w.Load.GetWaitingRequests() && old.Load.GetTokenUsage() == w.Load.GetTokenUsage():
		w.Overloaded, w.OverloadReason = true, old.OverloadReason
	default:
		w.Overloaded, w.OverloadReason = true, v.reason.String()
	}

	w.Liveness = VetoOf(v.live)
	switch {
	case v.live == judge.Live:
		w.LivenessReason = ""
	case old != nil && old.Liveness == w.Liveness && sameCause(old, v.cause):
		w.LivenessReason = old.LivenessReason
	default:
		w.LivenessReason = v.cause.String()
	}
	if old != nil && old.Liveness == smgv1.Veto_VETO_UNREACHABLE && w.Liveness != smgv1.Veto_VETO_UNREACHABLE {
		w.ContactSeq = max(w.ContactSeq, old.ContactSeq) + 1
	}
}

// verdicts is what the rules make of a record's evidence, before any reason
// is formatted.
type verdicts struct {
	over   bool
	reason judge.OverloadReason // the figures judge.Check compared
	live   judge.Verdict
	cause  judge.Cause
}

// judged applies the rules to w as it stands: overloaded =
// judge.Check(latest load, thresholds) for a Ready worker whose latest poll
// produced a report; the liveness verdict is Evidence.Live's for a Ready
// worker, Live otherwise (fail open).
func judged(w *Worker) (v verdicts) {
	if !w.Ready() || w.External() {
		return verdicts{live: judge.Live}
	}
	if !w.Evidence.NoReport && w.Load != nil {
		v.over, v.reason = judge.Check(int64(w.Load.GetWaitingRequests()), w.Load.GetTokenUsage(), w.Thresholds)
	}
	v.live, v.cause = w.Evidence.Live.Status()
	return v
}

// Stands reports whether c, a scratch copy of the stored record w moved by
// new evidence, keeps w's verdicts (and their causes): decide's own rules,
// run on c without storing it or formatting a reason. Writers that let
// evidence wait for a later commit ask it first: evidence that moves a
// verdict commits at once.
func Stands(w, c *Worker) bool {
	v := judged(c)
	return v.over == w.Overloaded && VetoOf(v.live) == w.Liveness && (v.live == judge.Live || sameCause(w, v.cause))
}

// OverloadFigures returns the figures the overload rule compares for w,
// whether or not they make it overloaded (for a log line).
func OverloadFigures(w *Worker) judge.OverloadReason { return judged(w).reason }

func sameCause(old *Worker, c judge.Cause) bool {
	_, oc := old.Evidence.Live.Status()
	return oc == c
}

// VetoOf is the routing veto of a liveness verdict.
func VetoOf(v judge.Verdict) smgv1.Veto {
	switch v {
	case judge.Unreachable:
		return smgv1.Veto_VETO_UNREACHABLE
	case judge.Wedged:
		return smgv1.Veto_VETO_WEDGED
	}
	return smgv1.Veto_VETO_UNSPECIFIED
}

// sameVisible reports whether a and b look the same to routers and the
// admin API: they differ at most in Evidence and Revision.
func sameVisible(a, b *Worker) bool {
	return a.Registered == b.Registered && a.State == b.State && a.Shares.same(&b.Shares)
}
