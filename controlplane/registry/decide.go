package registry

import (
	"maps"
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
//   - overloaded = judge.Check(latest load, thresholds), unless the latest
//     poll produced no report;
//   - the liveness veto is the verdict of Evidence.Live, and leaving
//     unreachable bumps ContactSeq (routers close the worker's breaker).
//
// Reasons are formatted only when the figures behind them change, so the
// ingest hot path does not allocate for them.
func decide(old, w *Worker) {
	if old != nil && old.Spec.GetUrl() != w.Spec.GetUrl() {
		w.Evidence = Evidence{}
	}
	if !w.Ready() {
		w.Evidence.Live, w.Evidence.Routers, w.Evidence.PushedAt = judge.Liveness{}, nil, time.Time{}
	}

	var over bool
	var reason judge.OverloadReason
	if w.Ready() && !w.Evidence.NoReport && w.Load != nil {
		over, reason = judge.Check(int64(w.Load.GetWaitingRequests()), w.Load.GetTokenUsage(), w.Thresholds)
	}
	switch {
	case !over:
		w.Overloaded, w.OverloadReason = false, ""
	case old != nil && old.Overloaded && old.Thresholds == w.Thresholds &&
		old.Load.GetWaitingRequests() == w.Load.GetWaitingRequests() && old.Load.GetTokenUsage() == w.Load.GetTokenUsage():
		w.Overloaded, w.OverloadReason = true, old.OverloadReason
	default:
		w.Overloaded, w.OverloadReason = true, reason.String()
	}

	v, cause := w.Evidence.Live.Status()
	w.Liveness = VetoOf(v)
	switch {
	case v == judge.Live:
		w.LivenessReason = ""
	case old != nil && old.Liveness == w.Liveness && sameCause(old, cause):
		w.LivenessReason = old.LivenessReason
	default:
		w.LivenessReason = cause.String()
	}
	if old != nil && old.Liveness == smgv1.Veto_VETO_UNREACHABLE && w.Liveness != smgv1.Veto_VETO_UNREACHABLE {
		w.ContactSeq = max(w.ContactSeq, old.ContactSeq) + 1
	}
}

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
// admin API, i.e. they differ at most in Evidence and Revision. A field
// added to Worker must be added here (TestSameVisibleCoversEveryField).
func sameVisible(a, b *Worker) bool {
	return a.ID == b.ID && a.Spec == b.Spec && a.Model == b.Model && a.Type == b.Type &&
		a.Thresholds == b.Thresholds && a.Health == b.Health &&
		a.Load == b.Load && a.LoadRevision == b.LoadRevision &&
		a.Overloaded == b.Overloaded && a.OverloadReason == b.OverloadReason &&
		a.Liveness == b.Liveness && a.LivenessReason == b.LivenessReason && a.ContactSeq == b.ContactSeq &&
		a.AgentNode == b.AgentNode && maps.Equal(a.WindowShare, b.WindowShare) && (a.WindowShare == nil) == (b.WindowShare == nil) &&
		(a.Admission == b.Admission || a.Admission != nil && b.Admission != nil && *a.Admission == *b.Admission)
}
