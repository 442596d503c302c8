package judge

import (
	"flag"
	"fmt"
	"math"
	"strconv"
	"time"
)

// Flag names of the liveness rules, as the spec writes them.
const (
	FlagStallSecs = "worker-stall-secs"
	FlagWedgeSecs = "worker-wedge-secs"
	FlagStaleSecs = "worker-stale-secs"
)

const (
	DefaultStallSecs = 2
	DefaultWedgeSecs = 3
	DefaultStaleSecs = 15
	// SweepInterval is how often the caller should run Sweep, so that a
	// veto lands at its threshold rather than at the next event.
	SweepInterval = 250 * time.Millisecond
	DeepPile      = 4                 // a pile of streaming requests that is evidence on its own
	BoundCap      = 120 * time.Second // how far prefill in flight stretches the wedge bound
)

// LivenessConfig holds the liveness flags in whole seconds.
type LivenessConfig struct {
	StallSecs int // --worker-stall-secs; 0 removes the silence requirement
	WedgeSecs int // --worker-wedge-secs; 0 disables the wedge rule
	StaleSecs int // --worker-stale-secs; 0 disables the stale rule
}

// DefaultLivenessConfig returns stall 2 s, wedge 3 s, stale 15 s.
func DefaultLivenessConfig() LivenessConfig {
	return LivenessConfig{StallSecs: DefaultStallSecs, WedgeSecs: DefaultWedgeSecs, StaleSecs: DefaultStaleSecs}
}

// AddFlags registers the three liveness flags on fs, defaulting to c's values.
func (c *LivenessConfig) AddFlags(fs *flag.FlagSet) {
	fs.IntVar(&c.StallSecs, FlagStallSecs, c.StallSecs,
		"exclude a worker as unreachable when a connection to it fails and nothing has been heard from it for this many seconds; 0 excludes on the first connection failure")
	fs.IntVar(&c.WedgeSecs, FlagWedgeSecs, c.WedgeSecs,
		"exclude a worker as wedged when it holds streaming work yet produces no token for this many seconds (longer while prompts are still in prefill, up to 120); 0 disables the rule")
	fs.IntVar(&c.StaleSecs, FlagStaleSecs, c.StaleSecs,
		"exclude a worker that has pushed load records as unreachable when nothing arrives from it on any channel for this many seconds; keep above --load-monitor-interval; 0 disables the rule")
}

// Validate reports the first negative flag, naming it.
func (c LivenessConfig) Validate() error {
	for _, f := range []struct {
		name string
		v    int
	}{{FlagStallSecs, c.StallSecs}, {FlagWedgeSecs, c.WedgeSecs}, {FlagStaleSecs, c.StaleSecs}} {
		if f.v < 0 {
			return fmt.Errorf("--%s must be an integer >= 0, got %d", f.name, f.v)
		}
	}
	return nil
}

// Warnings returns advice to log at startup: a stale bound not above the
// load monitor interval excludes a worker fed by polls alone between them.
func (c LivenessConfig) Warnings(loadMonitorIntervalSecs int) []string {
	if c.StaleSecs > 0 && c.StaleSecs <= loadMonitorIntervalSecs {
		return []string{fmt.Sprintf("--%s %d is not above --load-monitor-interval %d: workers fed only by polls between pushes may be excluded as unreachable",
			FlagStaleSecs, c.StaleSecs, loadMonitorIntervalSecs)}
	}
	return nil
}

// Rules returns the durations the liveness rules compare against.
func (c LivenessConfig) Rules() Rules {
	return Rules{
		Stall:   time.Duration(c.StallSecs) * time.Second,
		Wedge:   time.Duration(c.WedgeSecs) * time.Second,
		Stale:   time.Duration(c.StaleSecs) * time.Second,
		ReadLag: time.Duration(c.StaleSecs) * time.Second,
	}
}

// Rules are the liveness thresholds; build them with LivenessConfig.Rules.
type Rules struct {
	Stall time.Duration // silence after a connection failure; 0: none needed
	Wedge time.Duration // wedge bound floor; 0 disables the wedge rule
	Stale time.Duration // total silence of a pushing worker; 0 disables
	// ReadLag caps the silence put down to the control plane reading an
	// agent's stream late (StreamRead), whatever the agent's clock says.
	ReadLag time.Duration
}

// Verdict is the liveness opinion of one worker, in increasing precedence.
// Its String is the reason label of smg_worker_stalled.
type Verdict uint8

const (
	Live Verdict = iota
	Wedged
	Unreachable
)

func (v Verdict) String() string {
	switch v {
	case Wedged:
		return "wedged"
	case Unreachable:
		return "unreachable"
	}
	return "none"
}

// FailureKind classifies a failure seen on one of the worker's channels.
// Only ConnectionFailure arms the unreachable veto; the caller passes every
// failure it sees, so the rule stays here.
type FailureKind uint8

const (
	// ConnectionFailure: reset, refused, keepalive timeout or broken stream
	// of an agent poll, a KV event or load stream, or a router's upstream
	// connection to a gRPC worker.
	ConnectionFailure FailureKind = iota
	DeadlineExceeded              // slow, not gone
	EngineError                   // wrong, not gone
	HealthProbeFailed             // the health checker's
	HTTPPollFailed                // HTTP workers: health checks and the circuit breaker
	HTTPRequestFailed             // a router's request to an HTTP worker: its circuit breaker's
)

// Record is what one load report says to the liveness rules.
type Record struct {
	// Pushed: an agent pushed it (false: an answered poll); from then on
	// the worker is held to the push cadence (the stale rule).
	Pushed  bool
	Waiting int64 // the waiting queue, summed over DP ranks
	// Silence is how long the engine has produced nothing for the streaming
	// requests it holds; 0 when it reports none (older servicers, polls, a
	// generation reported only at its end).
	Silence       time.Duration
	PrefillInHand int64 // prompt tokens the servicer holds still in prefill
	// StepWire: the wire reports every scheduler step (vLLM with stats
	// logging); false for token batches only (SGLang, TokenSpeed, vLLM with
	// --disable-log-stats), where a long prefill is silent too.
	StepWire bool
	// Idle: the engine runs no request, so the prompts routers hold in
	// flight on it are not in prefill and do not stretch the wedge bound.
	Idle  bool
	Heard Heard // the agent stream that carried it (zero: a poll)
}

// Heard names the agent stream that carried a piece of evidence and the
// agent's clock when it sent it (ReportRequest.sent_at), which never stamps
// evidence: it is only compared with the same stream's later messages.
type Heard struct {
	Stream uint64    // the stream's id, unique in the process; 0: none
	SentAt time.Time // zero: the agent did not say (an older agent)
}

// StreamRead is how far the control plane has read one agent stream, at a
// sweep. Against the Heard of a worker's latest evidence on it, it tells
// how much of the worker's silence is the control plane not reading: the
// growth of the stream's read lag, plus the time the receive loop has been
// Busy or the process Stalled while it waited (capped at Rules.ReadLag).
type StreamRead struct {
	Stream  uint64
	ReadAt  time.Time     // the control plane's clock when its newest message was read
	SentAt  time.Time     // the agent's clock on that message
	Busy    bool          // the receive loop has been applying it since ReadAt
	Stalled time.Duration // the process stood still this long since ReadAt
}

// RouterObservation is what the routers see of one worker, summed by the
// caller, on its clock.
type RouterObservation struct {
	// Streams is the pile: streaming gRPC generations in flight (not HTTP
	// workers, PD legs or non-streaming generations).
	Streams int64
	// LastProgress is the latest token or completion any router saw
	// (zero: none yet).
	LastProgress  time.Time
	PrefillTokens int64 // prompts of in-flight requests without a first token yet
}

// CauseKind names the rule behind a verdict or a re-admission.
type CauseKind uint8

const (
	CauseNone CauseKind = iota
	// Vetoes.
	CauseTransport     // connection failure, then silence for the stall bound
	CauseStale         // a pushing worker silent on every channel
	CauseWaitingQueue  // waiting queue with streams in flight, no progress
	CausePile          // pile that grew or stands DeepPile deep, no progress
	CauseEngineSilence // the engine's own silence past its allowance
	// Re-admissions.
	CauseContact       // unreachable cleared by contact
	CauseProgress      // wedged cleared by a token or completion
	CausePileEmpty     // wedged cleared: nothing left in flight
	CauseEngineResumed // wedged cleared: the record no longer reports silence
)

// Cause explains a verdict with the figures behind it: plain data, formatted
// by String only for the log.
type Cause struct {
	Kind    CauseKind
	Silence time.Duration // nothing heard / no progress / engine silent for
	Bound   time.Duration // the threshold passed
	Streams int64         // the pile
	PileLow int64         // the pile grew from this
	Waiting int64         // the waiting queue
	Never   bool          // CauseTransport: nothing ever heard
	// Unread is the silence not counted because the control plane was
	// behind reading the agent's stream (CauseStale, CauseEngineSilence).
	Unread time.Duration
}

// String is the cause in the liveness veto and re-admission log lines.
func (c Cause) String() string {
	switch c.Kind {
	case CauseTransport:
		if c.Never {
			return "connection failed and nothing has been heard from the worker"
		}
		return "connection failed and nothing heard for " + c.Silence.String() + " (stall " + c.Bound.String() + ")"
	case CauseStale:
		return "nothing heard on any channel for " + c.Silence.String() + " after pushed load records (stale " + c.Bound.String() + ")" + c.unread()
	case CauseWaitingQueue:
		return "waiting queue of " + itoa(c.Waiting) + " with " + itoa(c.Streams) + " streaming requests in flight and no progress for " +
			c.Silence.String() + " (bound " + c.Bound.String() + ")"
	case CausePile:
		shape := "deep"
		if c.Streams < DeepPile || c.Streams > c.PileLow {
			shape = "grew from " + itoa(c.PileLow)
		}
		return itoa(c.Streams) + " streaming requests in flight (" + shape + ") and no progress for " +
			c.Silence.String() + " (bound " + c.Bound.String() + ")"
	case CauseEngineSilence:
		return "engine reports no output for " + c.Silence.String() + " while holding streaming requests (bound " + c.Bound.String() + ")" + c.unread()
	}
	return readmissions[c.Kind]
}

// readmissions are the re-admission causes' log text (no figures behind them).
var readmissions = map[CauseKind]string{CauseContact: "contact", CauseProgress: "progress",
	CausePileEmpty: "nothing left in flight", CauseEngineResumed: "engine producing again"}

func (c Cause) unread() string {
	if c.Unread <= 0 {
		return ""
	}
	return "; " + c.Unread.String() + " more not counted: the control plane was behind reading the agent's stream"
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

// Change is the result of every Liveness method: the verdict now, the one
// before, and the cause of the newer one (a re-admission's when Live).
type Change struct {
	Verdict  Verdict
	Previous Verdict
	Cause    Cause
	// Held: a sweep found a stale or engine-silence veto due on the control
	// plane's clock alone and held it off for the read credit.
	Held bool
}

// Changed reports whether the verdict moved (to log, count and commit).
func (c Change) Changed() bool { return c.Verdict != c.Previous }

// Liveness is one worker's liveness evidence and verdict: plain data, the
// zero value a worker never heard from. The caller serializes calls on it
// with non-decreasing now values. Every method re-judges and returns the
// Change; Sweep catches thresholds reached by time passing alone.
type Liveness struct {
	lastContact stamp
	failedAt    stamp // latest connection failure not yet followed by contact

	// The latest evidence read on an agent stream: which stream, when the
	// control plane read it, how long after the agent's clock says it sent it.
	heardStream uint64
	heardAt     stamp
	heardLag    time.Duration // bounded by span
	// staleContact is lastContact when the stale veto was set: the veto
	// holds until newer contact, whatever the read credit does meanwhile.
	staleContact stamp

	waiting       int64
	recordAt      stamp
	engineSilent  stamp // when the engine's reported silence began; zero: none
	enginePrefill int64

	streams       int64
	pileSince     stamp // when the pile last went from empty to non-empty
	pileLow       int64 // smallest pile since the last progress or pile start
	lastProgress  stamp
	prefillTokens int64
	prefillRate   float64 // tokens/s; 0 until measured

	cause          Cause
	progressAtVeto stamp // lastProgress when the wedge veto was set
	verdict        Verdict
	pushed         bool
	stepWire       bool
	engineIdle     bool
}

// stamp is a time as nanoseconds since epoch plus 2^63 (ordered as the
// times are); 0: none. A time.Time's location pointer would have the
// collector scan every stored worker's Liveness. Counted from a monotonic
// reading, stamps ignore wall-clock jumps.
type stamp uint64

// epoch is what stamps count from, never a decision's now.
var epoch = time.Now()

func stampOf(t time.Time) stamp {
	if t.IsZero() {
		return 0
	}
	return stamp(uint64(max(t.Sub(epoch), math.MinInt64+1)) ^ 1<<63)
}

func (s stamp) Add(d time.Duration) stamp { return stampOf(s.time().Add(d)) }
func (s stamp) time() time.Time           { return epoch.Add(time.Duration(uint64(s) ^ 1<<63)) }

// Sub is s-o, saturating as time.Time.Sub does.
func (s stamp) Sub(o stamp) time.Duration {
	if s >= o {
		return time.Duration(min(uint64(s-o), math.MaxInt64))
	}
	return -time.Duration(min(uint64(o-s), math.MaxInt64))
}

// Status returns the current verdict and its cause.
func (l *Liveness) Status() (Verdict, Cause) { return l.verdict, l.cause }

// HeardStream is the stream of the worker's latest agent evidence (0:
// none), whose read state the caller passes to Sweep.
func (l *Liveness) HeardStream() uint64 { return l.heardStream }

// Contact records contact at now that carries no load (a passing probe,
// any answer). It clears unreachable at once, not wedged (that needs
// progress).
func (l *Liveness) Contact(at time.Time, r *Rules) Change { return l.ContactAt(at, at, r) }

// ContactAt records contact at at (an at after now counts as now) learned
// at now (a router's report of an answer): an answer older than a
// connection failure heard meanwhile does not clear it.
func (l *Liveness) ContactAt(at, now time.Time, r *Rules) Change {
	t := stampOf(now)
	l.contact(min(stampOf(at), t))
	return l.judge(t, r, nil, false)
}

// Heard is Contact read on an agent stream (h): an answered poll or
// heartbeat the agent vouches for.
func (l *Liveness) Heard(at time.Time, h Heard, r *Rules) Change {
	now := stampOf(at)
	l.contact(now)
	l.heard(at, h)
	return l.judge(now, r, nil, true) // the stream's newest evidence: no credit
}

// heard notes evidence read at now on h's stream; evidence without the
// agent's clock gets no credit.
func (l *Liveness) heard(now time.Time, h Heard) {
	if h.Stream == 0 || h.SentAt.IsZero() {
		l.heardStream = 0
		return
	}
	l.heardStream, l.heardAt, l.heardLag = h.Stream, stampOf(now), span(now.Sub(h.SentAt))
}

// Failure records a failure at now. Only ConnectionFailure arms unreachable:
// immediately when nothing has been heard for r.Stall (always when r.Stall is
// 0), otherwise Sweep vetoes once r.Stall passes without further contact.
func (l *Liveness) Failure(at time.Time, kind FailureKind, r *Rules) Change {
	now := stampOf(at)
	if kind == ConnectionFailure {
		l.failedAt = max(l.failedAt, now)
	}
	return l.judge(now, r, nil, false)
}

// Record ingests a load report received at now (pushed, or an answered
// poll): contact, and a pushed one holds the worker to the stale rule.
func (l *Liveness) Record(at time.Time, rec Record, r *Rules) Change {
	now := stampOf(at)
	l.contact(now)
	l.pushed = l.pushed || rec.Pushed
	l.waiting = rec.Waiting
	l.recordAt = now
	l.engineSilent = 0
	if rec.Silence > 0 {
		l.engineSilent = now.Add(-rec.Silence)
	}
	l.enginePrefill = rec.PrefillInHand
	l.stepWire = rec.StepWire
	l.engineIdle = rec.Idle
	if rec.Heard.Stream != 0 || rec.Pushed {
		l.heard(at, rec.Heard)
	}
	// The record is the newest evidence: nothing since it went unread.
	return l.judge(now, r, nil, true)
}

// Routers ingests the routers' summed view of the worker at now. A newer
// LastProgress is progress and contact.
func (l *Liveness) Routers(at time.Time, o RouterObservation, r *Rules) Change {
	now := stampOf(at)
	if p := stampOf(o.LastProgress); p > l.lastProgress {
		p = min(p, now)
		l.lastProgress = p
		l.contact(p)
		l.pileLow = o.Streams
	}
	switch {
	case o.Streams <= 0:
		l.streams, l.pileLow, l.pileSince = 0, 0, 0
	case l.streams <= 0:
		l.streams, l.pileLow, l.pileSince = o.Streams, o.Streams, now
	default:
		l.streams = o.Streams
		l.pileLow = min(l.pileLow, o.Streams)
	}
	l.prefillTokens = max(o.PrefillTokens, 0)
	return l.judge(now, r, nil, false)
}

// PromptTokensAhead is the prompt tokens waiting for prefill on the worker:
// the routers' sum or the engine's own count, the larger (they count the
// same requests).
func (l *Liveness) PromptTokensAhead() int64 { return max(l.prefillTokens, l.enginePrefill, 0) }

// SetPrefillRate records the prefill rate measured on the worker (prompt
// tokens/s; a value not positive and finite is ignored). Until one is
// known, a token-batch wire's silence passes no verdict.
func (l *Liveness) SetPrefillRate(tokensPerSecond float64) {
	if tokensPerSecond > 0 && !math.IsInf(tokensPerSecond, 1) {
		l.prefillRate = tokensPerSecond
	}
}

// Sweep re-judges the worker at now, every SweepInterval, with how far the
// caller has read the stream of its latest agent evidence (nil: gone or
// none). Silence the read lag accounts for does not count, up to
// r.ReadLag: only a sweep enters the stale or engine-silence veto before
// r.ReadLag has passed on its bound.
func (l *Liveness) Sweep(now time.Time, s *StreamRead, r *Rules) Change {
	return l.judge(stampOf(now), r, s, true)
}

// readCredit is how much of the silence since the worker's latest agent
// evidence the control plane spent behind on its stream, capped at
// r.ReadLag (outside sweeps, known false: the cap, so no call vetoes
// before a sweep would).
func (l *Liveness) readCredit(now stamp, s *StreamRead, known bool, r *Rules) time.Duration {
	if l.heardStream == 0 || r.ReadLag <= 0 {
		return 0
	}
	if !known {
		return r.ReadLag
	}
	if s == nil || s.Stream != l.heardStream || s.SentAt.IsZero() {
		return 0
	}
	// Each term is bounded first, so no lie about time overflows the sum.
	c := span(s.ReadAt.Sub(s.SentAt)) - l.heardLag
	if s.Busy { // the time it has been busy includes any stall
		c += span(now.Sub(stampOf(s.ReadAt)))
	} else {
		c += span(s.Stalled)
	}
	return min(max(c, 0), r.ReadLag)
}

// span bounds d to a year either way.
func span(d time.Duration) time.Duration {
	const year = 365 * 24 * time.Hour
	return min(max(d, -year), year)
}

// contact notes contact at t; it answers a connection failure not after t.
func (l *Liveness) contact(t stamp) {
	l.lastContact = max(l.lastContact, t)
	if l.failedAt != 0 && t >= l.failedAt {
		l.failedAt = 0
	}
}

// judge sets the verdict from the evidence at now (s and known: see
// readCredit). Unreachable takes precedence and drops a wedge veto (its
// streams are gone with the connection); a wedge veto is entered on
// evidence and held until progress, an empty pile, or an engine record no
// longer reporting silence.
func (l *Liveness) judge(now stamp, r *Rules, s *StreamRead, known bool) Change {
	prev := l.verdict
	credit := l.readCredit(now, s, known, r)
	if c, ok := l.unreachable(now, credit, r); ok {
		if c.Kind == CauseStale && (prev != Unreachable || l.cause.Kind != CauseStale) {
			l.staleContact = l.lastContact
		}
		l.verdict, l.cause = Unreachable, c
		return Change{Verdict: Unreachable, Previous: prev, Cause: c}
	}
	if r.Wedge > 0 {
		if prev == Wedged {
			if c, ok := l.stillWedged(now, r); !ok {
				l.verdict, l.cause = Live, c
				return Change{Verdict: Live, Previous: prev, Cause: c}
			}
			return Change{Verdict: Wedged, Previous: prev, Cause: l.cause}
		}
		if c, ok := l.wedged(now, credit, r); ok {
			l.verdict, l.cause, l.progressAtVeto = Wedged, c, l.lastProgress
			return Change{Verdict: Wedged, Previous: prev, Cause: c}
		}
	}
	l.verdict = Live
	if prev != Live {
		l.cause = Cause{Kind: CauseContact} // out of unreachable (or a wedge with the rule off)
	}
	return Change{Verdict: Live, Previous: prev, Cause: l.cause, Held: known && credit > 0 && l.dueWithoutCredit(now, r)}
}

// dueWithoutCredit reports whether the stale or the engine-silence veto
// would be due on the control plane's clock alone.
func (l *Liveness) dueWithoutCredit(now stamp, r *Rules) bool {
	if l.pushed && r.Stale > 0 && now.Sub(l.lastContact) >= r.Stale {
		return true
	}
	_, ok := l.engineSilence(now, 0, r)
	return ok && r.Wedge > 0
}

// unreachable applies the transport rule, on the control plane's clock
// alone (a broken stream is no reading lag), then the stale rule, whose
// silence since the latest agent evidence does not count the credit.
func (l *Liveness) unreachable(now stamp, credit time.Duration, r *Rules) (Cause, bool) {
	silence := now.Sub(l.lastContact)
	if l.failedAt != 0 {
		// Once set, only contact at or after the failure lifts it: a token
		// reported late, from before the failure, does not.
		if l.verdict == Unreachable && l.cause.Kind == CauseTransport {
			return l.cause, true
		}
		if l.lastContact == 0 || silence >= r.Stall {
			return Cause{Kind: CauseTransport, Silence: silence, Bound: r.Stall, Never: l.lastContact == 0}, true
		}
	}
	if !l.pushed || r.Stale <= 0 {
		return Cause{}, false
	}
	if l.verdict == Unreachable && l.cause.Kind == CauseStale && l.lastContact <= l.staleContact {
		return l.cause, true // held until contact: a credit that grows lifts no veto
	}
	heard := l.lastContact
	if l.heardStream != 0 {
		heard = max(heard, l.heardAt.Add(credit))
	}
	if silence := now.Sub(heard); silence >= r.Stale {
		return Cause{Kind: CauseStale, Silence: silence, Bound: r.Stale, Unread: heard.Sub(l.lastContact)}, true
	}
	return Cause{}, false
}

// wedged looks for any of the three kinds of evidence; credit applies to
// the engine's silence extrapolated from a record read on an agent stream.
func (l *Liveness) wedged(now stamp, credit time.Duration, r *Rules) (Cause, bool) {
	if l.streams > 0 {
		silence := now.Sub(max(l.lastProgress, l.pileSince))
		prefill := max(l.prefillTokens, l.enginePrefill)
		if l.notPrefilling() {
			prefill = 0 // the engine itself says so: the bound is the wedge bound
		}
		bound := r.pileBound(prefill, l.prefillRate)
		if silence >= bound {
			c := Cause{Silence: silence, Bound: bound, Streams: l.streams, PileLow: l.pileLow, Waiting: l.waiting}
			switch {
			case l.waiting > 0: // a queue that grew since the last report is > 0 too
				c.Kind = CauseWaitingQueue
				return c, true
			case l.streams >= DeepPile || l.streams > l.pileLow:
				c.Kind = CausePile
				return c, true
			}
		}
	}
	return l.engineSilence(now, credit, r)
}

// notPrefilling reports whether the engine's own latest record, newer than
// the pile and not refuted by progress since, says it runs no request: the
// prefill stretch of the wedge bound then does not apply.
func (l *Liveness) notPrefilling() bool {
	if l.recordAt == 0 || l.recordAt < l.pileSince || l.lastProgress > l.recordAt {
		return false
	}
	return l.engineIdle
}

// stillWedged holds a wedge veto while its evidence stands and returns the
// re-admission cause when it does not.
func (l *Liveness) stillWedged(now stamp, r *Rules) (Cause, bool) {
	if l.lastProgress > l.progressAtVeto {
		return Cause{Kind: CauseProgress}, false
	}
	if l.streams > 0 { // a silent pile of our own
		return Cause{}, true
	}
	if _, ok := l.engineSilence(now, 0, r); ok { // held on the control plane's clock
		return Cause{}, true
	}
	if l.cause.Kind == CauseEngineSilence {
		return Cause{Kind: CauseEngineResumed}, false
	}
	return Cause{Kind: CausePileEmpty}, false
}

// engineSilence applies the engine's own silence, extrapolated from its
// last record (refuted by progress seen since). A record read on an agent
// stream earns credit: one saying the engine stepped again may be unread.
func (l *Liveness) engineSilence(now stamp, credit time.Duration, r *Rules) (Cause, bool) {
	if l.engineSilent == 0 || l.lastProgress > l.recordAt {
		return Cause{}, false
	}
	bound := r.Wedge
	if !l.stepWire {
		if l.prefillRate <= 0 {
			return Cause{}, false // token-batch wire: no verdict before a rate is measured
		}
		// The prefill in hand: the servicer's figure, or what the routers
		// hold in prefill on the worker when the engine reports none (an
		// agent reading SGLang's load endpoints sees no prompt tokens).
		bound = max(bound, prefillTime(2*float64(max(l.enginePrefill, l.prefillTokens)), l.prefillRate))
	}
	if l.heardStream == 0 || l.heardAt != l.recordAt {
		credit = 0 // a poll's record, or one re-read since on no stream
	}
	silence := now.Sub(l.engineSilent) - credit
	if silence < bound {
		return Cause{}, false
	}
	return Cause{Kind: CauseEngineSilence, Silence: silence, Bound: bound, Streams: l.streams, Unread: credit}, true
}

// pileBound is the wedge bound for the pile and queue evidence: Wedge or,
// when longer, the time the prompts in flight still need to prefill, capped.
// With prompts in flight and no measured rate, that time is unknown and the
// cap applies, so a first long prefill is not judged wedged.
func (r *Rules) pileBound(prefillTokens int64, rate float64) time.Duration {
	if prefillTokens <= 0 {
		return r.Wedge
	}
	if rate <= 0 {
		return max(r.Wedge, BoundCap)
	}
	return max(r.Wedge, prefillTime(float64(prefillTokens), rate))
}

// prefillTime is tokens/rate, capped at BoundCap.
func prefillTime(tokens, rate float64) time.Duration {
	secs := tokens / rate
	if !(secs < BoundCap.Seconds()) { // also catches NaN
		return BoundCap
	}
	return time.Duration(secs * float64(time.Second))
}
