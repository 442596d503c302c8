package registry

import (
	"math"
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
//     breaker), and so does a restart of the engine (restarted): contact
//     that ends a failure spell however short it was.
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
	left := old != nil && old.Liveness == smgv1.Veto_VETO_UNREACHABLE && w.Liveness != smgv1.Veto_VETO_UNREACHABLE
	if restarted(old, w) || left {
		var seq uint64
		if old != nil {
			seq = old.ContactSeq
		}
		w.ContactSeq = max(w.ContactSeq, seq) + 1
	}
}

// startSlack is how far a reported start time may move without being a
// restart (a start time read off /proc moves by a clock tick at most; one
// that jitters more moves the trusted one forward only past its highest
// value so far, so a few times at most), and startAhead how far past the
// load's own time it may lie (clock skew).
const (
	startSlack = 0.01
	startAhead = time.Minute
)

// restartGap is the least time, by the loads' own clock, between two
// restarts the rule believes: an engine that claims a new start at every
// report forces one contact per gap, not one per report. A start time that
// moves within the gap is still trusted, so it is no restart later either.
const restartGap = 10 * time.Second

// restartMove is what the restart rule makes of the start time load
// reports against ev's trusted one (0: none): next to trust, and whether it
// is a restart or an untrusted value. A value that is not a finite positive
// number, lies more than startAhead past the load's own time (or comes
// without one), or goes backwards is never trusted, so a lying engine
// cannot force a contact at every report: one only when its start time
// moves forward, and a restart within restartGap of the last believed one
// counts as not trusted.
func restartMove(ev *Evidence, load *smgv1.EngineLoad) (next float64, restart, ignored bool) {
	s, held := load.GetProcessStartTimeSeconds(), ev.StartTime
	at := load.GetReportedAt()
	switch {
	case s == 0 || s == held:
		return held, false, false
	case !(s > 0) || math.IsInf(s, 1) || at == nil ||
		s > float64(at.AsTime().Add(startAhead).UnixNano())/1e9 || held > 0 && s < held-startSlack:
		return held, false, true
	case held == 0:
		return s, false, false
	case s <= held+startSlack:
		return held, false, false
	}
	if d := at.AsTime().Sub(ev.RestartAt); !ev.RestartAt.IsZero() && d < restartGap && d > -restartGap {
		return s, false, true
	}
	return s, true, false
}

// restarted applies the restart rule to w's load: the start time its
// evidence holds moves to a trusted new one, and the answer says whether
// that was a restart. A no-report keeps the last load visible, and a
// record whose load is old's was judged with it: neither is new.
func restarted(old, w *Worker) bool {
	if w.Evidence.NoReport || w.Load == nil || old != nil && old.Load == w.Load {
		return false
	}
	next, restart, ignored := restartMove(&w.Evidence, w.Load)
	w.Evidence.StartTime = next
	if ignored {
		w.Evidence.StartIgnored++
	}
	if restart {
		w.Evidence.RestartAt = w.Load.GetReportedAt().AsTime()
	}
	return restart
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
	if _, restart, _ := restartMove(&w.Evidence, c.Load); restart && !c.Evidence.NoReport {
		return false // a restart is contact: routers hear of it at once
	}
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
	return a.Registered == b.Registered && a.State == b.State && a.Shares.Equal(&b.Shares)
}
