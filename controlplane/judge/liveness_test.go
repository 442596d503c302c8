package judge

import (
	"bytes"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/smg-project/smg/internal/cli"
)

// The fake clock: every event carries an explicit offset from t0.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// never marks "no progress seen yet" in a router observation.
const never = time.Duration(math.MinInt64)

const (
	ms = time.Millisecond
	s  = time.Second
)

type event struct {
	name string
	do   func(l *Liveness, now time.Time, r *Rules) Change
}

type step struct {
	at    time.Duration
	ev    event
	want  Verdict
	cause CauseKind // checked when not CauseNone
}

func contact() event {
	return event{"contact", func(l *Liveness, now time.Time, r *Rules) Change { return l.Contact(now, r) }}
}

func fail(k FailureKind) event {
	return event{fmt.Sprintf("failure(%d)", k), func(l *Liveness, now time.Time, r *Rules) Change { return l.Failure(now, k, r) }}
}

func record(rec Record) event {
	return event{fmt.Sprintf("record%+v", rec), func(l *Liveness, now time.Time, r *Rules) Change { return l.Record(now, rec, r) }}
}

// pushed is a heartbeat or event-batch record from an agent on a step wire.
func pushed(waiting int64) event {
	return record(Record{Pushed: true, Waiting: waiting, StepWire: true})
}

// poll is an answered poll: contact and a waiting count, never pushed.
func poll(waiting int64) event { return record(Record{Waiting: waiting}) }

func routers(streams int64, progress time.Duration, prefill int64) event {
	o := RouterObservation{Streams: streams, PrefillTokens: prefill}
	if progress != never {
		o.LastProgress = t0.Add(progress)
	}
	return event{fmt.Sprintf("routers(streams=%d progress=%v prefill=%d)", streams, progress, prefill),
		func(l *Liveness, now time.Time, r *Rules) Change { return l.Routers(now, o, r) }}
}

func sweep() event {
	return event{"sweep", func(l *Liveness, now time.Time, r *Rules) Change { return l.Sweep(now, nil, r) }}
}

func rate(tokensPerSecond float64) event {
	return event{fmt.Sprintf("rate(%v)", tokensPerSecond), func(l *Liveness, now time.Time, r *Rules) Change {
		l.SetPrefillRate(tokensPerSecond)
		return l.Sweep(now, nil, r)
	}}
}

// run feeds steps to a fresh Liveness and checks the verdict, the cause and
// that Change reports exactly the moves.
func run(t *testing.T, r Rules, steps []step) {
	t.Helper()
	var l Liveness
	prev := Live
	for i, st := range steps {
		ch := st.ev.do(&l, t0.Add(st.at), &r)
		if ch.Verdict != st.want || ch.Previous != prev || ch.Changed() != (st.want != prev) {
			t.Fatalf("step %d at %v %s: got %v (previous %v, changed %v, cause %q), want %v (previous %v)",
				i, st.at, st.ev.name, ch.Verdict, ch.Previous, ch.Changed(), ch.Cause, st.want, prev)
		}
		if st.cause != CauseNone && ch.Cause.Kind != st.cause {
			t.Fatalf("step %d at %v %s: cause %d %q, want kind %d", i, st.at, st.ev.name, ch.Cause.Kind, ch.Cause, st.cause)
		}
		if v, c := l.Status(); v != ch.Verdict || c != ch.Cause {
			t.Fatalf("step %d: Status() = %v %v, Change = %v %v", i, v, c, ch.Verdict, ch.Cause)
		}
		prev = st.want
	}
}

type scenario struct {
	name  string
	rules func(*Rules)
	steps []step
}

func runAll(t *testing.T, cases []scenario) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := DefaultLivenessConfig().Rules()
			if c.rules != nil {
				c.rules(&r)
			}
			run(t, r, c.steps)
		})
	}
}

func stall(d time.Duration) func(*Rules) { return func(r *Rules) { r.Stall = d } }
func stale(d time.Duration) func(*Rules) { return func(r *Rules) { r.Stale = d } }
func wedge(d time.Duration) func(*Rules) { return func(r *Rules) { r.Wedge = d } }

// "When a Worker Dies or Loses Its Link".
func TestUnreachable(t *testing.T) {
	runAll(t, []scenario{
		{name: "connection failure after stall-secs of silence vetoes at once", steps: []step{
			{0, contact(), Live, 0},
			{2 * s, fail(ConnectionFailure), Unreachable, CauseTransport},
		}},
		{name: "failure inside a recent contact is remembered; the sweep vetoes at the threshold", steps: []step{
			{0, contact(), Live, 0},
			{1 * s, fail(ConnectionFailure), Live, 0},
			{1999 * ms, sweep(), Live, 0},
			{2 * s, sweep(), Unreachable, CauseTransport},
		}},
		{name: "contact after the failure cancels the remembered failure", steps: []step{
			{0, contact(), Live, 0},
			{1 * s, fail(ConnectionFailure), Live, 0},
			{1500 * ms, contact(), Live, 0},
			{3500 * ms, sweep(), Live, 0},
			{10 * s, sweep(), Live, 0},
		}},
		{name: "first contact re-admits at once", steps: []step{
			{0, contact(), Live, 0},
			{3 * s, fail(ConnectionFailure), Unreachable, CauseTransport},
			{3100 * ms, contact(), Live, CauseContact},
		}},
		{name: "never heard from: a connection failure vetoes", steps: []step{
			{0, fail(ConnectionFailure), Unreachable, CauseTransport},
		}},
		{name: "stall 0: first failure vetoes regardless of recent contact", rules: stall(0), steps: []step{
			{0, contact(), Live, 0},
			{0, fail(ConnectionFailure), Unreachable, CauseTransport},
			{100 * ms, contact(), Live, CauseContact},
			{100 * ms, fail(ConnectionFailure), Unreachable, CauseTransport},
		}},
		{name: "deadlines, engine errors, failed probes and HTTP polls never arm the veto", steps: []step{
			{0, contact(), Live, 0},
			{5 * s, fail(DeadlineExceeded), Live, 0},
			{6 * s, fail(EngineError), Live, 0},
			{7 * s, fail(HealthProbeFailed), Live, 0},
			{8 * s, fail(HTTPPollFailed), Live, 0},
			{60 * s, sweep(), Live, 0},
		}},
		{name: "deadlines never arm even with stall 0", rules: stall(0), steps: []step{
			{0, fail(DeadlineExceeded), Live, 0},
			{0, fail(EngineError), Live, 0},
		}},
		{name: "a token re-admits", steps: []step{
			{0, contact(), Live, 0},
			{3 * s, fail(ConnectionFailure), Unreachable, 0},
			{4 * s, routers(1, 3900*ms, 0), Live, CauseContact},
		}},
		{name: "a token from before the failure, reported late, does not re-admit", steps: []step{
			{0, contact(), Live, 0},
			{3 * s, fail(ConnectionFailure), Unreachable, 0},
			{3500 * ms, routers(1, 2500*ms, 0), Unreachable, 0},
			{3600 * ms, routers(0, 3600*ms, 0), Live, CauseContact}, // a completion: a response
		}},
		{name: "an answered poll re-admits", steps: []step{
			{0, fail(ConnectionFailure), Unreachable, 0},
			{1 * s, poll(0), Live, CauseContact},
		}},
		{name: "a pushed load record re-admits", steps: []step{
			{0, fail(ConnectionFailure), Unreachable, 0},
			{1 * s, pushed(0), Live, CauseContact},
		}},
		{name: "a passing health probe re-admits", steps: []step{
			{0, fail(ConnectionFailure), Unreachable, 0},
			{1 * s, contact(), Live, CauseContact},
		}},
	})
}

// "When a Worker Goes Silent Entirely".
func TestStale(t *testing.T) {
	streaming := []step{{0, pushed(0), Live, 0}}
	for i := 1; i <= 30; i++ { // tokens every second, sweeps between; the agent is gone
		streaming = append(streaming,
			step{time.Duration(i) * s, routers(2, time.Duration(i)*s, 0), Live, 0},
			step{time.Duration(i)*s + 500*ms, sweep(), Live, 0})
	}
	streaming = append(streaming,
		step{44999 * ms, sweep(), Live, 0},
		step{45 * s, sweep(), Unreachable, CauseStale})

	runAll(t, []scenario{
		{name: "a worker that pushed a record and then goes silent is unreachable at the threshold", steps: []step{
			{0, pushed(0), Live, 0},
			{14999 * ms, sweep(), Live, 0},
			{15 * s, sweep(), Unreachable, CauseStale},
			{20 * s, sweep(), Unreachable, 0},
			{20500 * ms, contact(), Live, CauseContact},
		}},
		{name: "a worker that never pushed is not judged by silence", steps: []step{
			{0, poll(0), Live, 0},
			{0, contact(), Live, 0},
			{100 * s, sweep(), Live, 0},
		}},
		{name: "stale 0 disables the rule", rules: stale(0), steps: []step{
			{0, pushed(0), Live, 0},
			{1000 * s, sweep(), Live, 0},
		}},
		{name: "answered polls keep a pushing worker reachable once its stream stops", steps: []step{
			{0, pushed(0), Live, 0},
			{10 * s, poll(0), Live, 0},
			{20 * s, poll(0), Live, 0},
			{34999 * ms, sweep(), Live, 0},
			{35 * s, sweep(), Unreachable, CauseStale},
			{40 * s, poll(0), Live, CauseContact},
		}},
		{name: "a worker still streaming tokens is never stale", steps: streaming},
	})
}

// "When an Engine Freezes": the three kinds of evidence and the bound.
func TestWedgedEvidence(t *testing.T) {
	runAll(t, []scenario{
		{name: "waiting queue with streams in flight and no progress for the bound", steps: []step{
			{0, routers(1, never, 0), Live, 0},
			{0, pushed(2), Live, 0},
			{1 * s, pushed(2), Live, 0}, // heartbeats are contact, not progress
			{2 * s, pushed(3), Live, 0},
			{2999 * ms, sweep(), Live, 0},
			{3 * s, sweep(), Wedged, CauseWaitingQueue},
		}},
		{name: "waiting queue without streams in flight is no evidence", steps: []step{
			{0, pushed(50), Live, 0},
			{10 * s, pushed(50), Live, 0},
		}},
		{name: "a pile standing four deep", steps: []step{
			{0, routers(4, never, 0), Live, 0},
			{2999 * ms, sweep(), Live, 0},
			{3 * s, sweep(), Wedged, CausePile},
		}},
		{name: "a pile standing below four deep without growth is no evidence", steps: []step{
			{0, routers(3, never, 0), Live, 0},
			{60 * s, sweep(), Live, 0},
		}},
		{name: "a pile that grows", steps: []step{
			{0, routers(1, never, 0), Live, 0},
			{1 * s, routers(2, never, 0), Live, 0},
			{2999 * ms, sweep(), Live, 0},
			{3 * s, sweep(), Wedged, CausePile},
		}},
		{name: "a pile that grew back after a cancel is no growth", steps: []step{
			{0, routers(2, never, 0), Live, 0},
			{1 * s, routers(1, never, 0), Live, 0},
			{2 * s, routers(2, never, 0), Live, 0}, // grew from 1: evidence
			{3 * s, sweep(), Wedged, CausePile},
		}},
		{name: "growth is measured from the last progress", steps: []step{
			{0, routers(1, never, 0), Live, 0},
			{1 * s, routers(2, 1*s, 0), Live, 0}, // a token with the second request: base is 2
			{10 * s, sweep(), Live, 0},
		}},
		{name: "nothing arriving is measured from the pile's start, not from old progress", steps: []step{
			{0, routers(0, 0, 0), Live, 0},
			{10 * s, routers(4, 0, 0), Live, 0},
			{12999 * ms, sweep(), Live, 0},
			{13 * s, sweep(), Wedged, CausePile},
		}},
		{name: "a long prefill is not wedged: bound stretches to prefill in flight / rate", steps: []step{
			{0, rate(1000), Live, 0},
			{0, routers(4, never, 20000), Live, 0}, // 20 s of prefill
			{19999 * ms, sweep(), Live, 0},
			{15 * s, routers(4, 15*s, 0), Live, 0}, // first tokens: prefill done
			{17999 * ms, sweep(), Live, 0},
			{18 * s, sweep(), Wedged, CausePile},
		}},
		{name: "a prefill that outlasts its bound is wedged", steps: []step{
			{0, rate(1000), Live, 0},
			{0, routers(4, never, 20000), Live, 0},
			{19999 * ms, sweep(), Live, 0},
			{20 * s, sweep(), Wedged, CausePile},
		}},
		{name: "the prefill bound is capped at 120 s", steps: []step{
			{0, rate(10), Live, 0},
			{0, routers(4, never, 1_000_000), Live, 0},
			{119999 * ms, sweep(), Live, 0},
			{120 * s, sweep(), Wedged, CausePile},
		}},
		{name: "prompts in flight and no rate measured: bound is the cap", steps: []step{
			{0, routers(4, never, 5000), Live, 0},
			{119999 * ms, sweep(), Live, 0},
			{120 * s, sweep(), Wedged, CausePile},
		}},
		{name: "prompts in flight, no rate, and the engine itself runs nothing: the wedge bound (frozen fresh engine)", steps: []step{
			{0, routers(2, never, 5000), Live, 0},
			{0, record(Record{Pushed: true, Waiting: 2, Idle: true}), Live, 0}, // queued, nothing running: not in prefill
			{2999 * ms, sweep(), Live, 0},
			{3 * s, sweep(), Wedged, CauseWaitingQueue},
		}},
		{name: "an idle record older than the pile says nothing of its prompts: the cap stands", steps: []step{
			{0, record(Record{Idle: true}), Live, 0},
			{1 * s, routers(4, never, 5000), Live, 0},
			{60 * s, sweep(), Live, 0},
		}},
		{name: "the engine running its prompts keeps the prefill stretch", steps: []step{
			{0, routers(4, never, 5000), Live, 0},
			{0, record(Record{Waiting: 0}), Live, 0}, // running, not idle
			{60 * s, sweep(), Live, 0},
		}},
		{name: "the servicer's prefill in hand stretches the queue bound too", steps: []step{
			{0, rate(1000), Live, 0},
			{0, routers(1, never, 0), Live, 0},
			{0, record(Record{Waiting: 3, PrefillInHand: 10000, StepWire: true}), Live, 0},
			{9999 * ms, sweep(), Live, 0},
			{10 * s, sweep(), Wedged, CauseWaitingQueue},
		}},
		{name: "a frozen engine holding one request is caught through its own silence (step wire)", steps: []step{
			{0, routers(1, never, 0), Live, 0},
			{0, record(Record{Pushed: true, Silence: 1 * s, StepWire: true}), Live, 0},
			{1999 * ms, sweep(), Live, 0},
			{2 * s, sweep(), Wedged, CauseEngineSilence}, // 1 s reported + 2 s since: the bound
		}},
		{name: "engine silence vetoes with nothing of ours in flight (another replica's load)", steps: []step{
			{0, record(Record{Pushed: true, Silence: 3 * s, StepWire: true}), Wedged, CauseEngineSilence},
		}},
		{name: "step wire: wedge-secs alone bounds the engine's silence", steps: []step{
			{0, rate(1000), Live, 0},
			{0, record(Record{Pushed: true, Silence: 3 * s, PrefillInHand: 1_000_000, StepWire: true}), Wedged, CauseEngineSilence},
		}},
		{name: "token-batch wire: no verdict until a rate is measured", steps: []step{
			{0, record(Record{Pushed: true, Silence: 60 * s}), Live, 0},
			{10 * s, sweep(), Live, 0},
			{10 * s, rate(1000), Wedged, CauseEngineSilence},
		}},
		{name: "token-batch wire: silence allowed is twice prefill in hand at the measured rate", steps: []step{
			{0, rate(1000), Live, 0},
			{0, record(Record{Pushed: true, Silence: 1 * s, PrefillInHand: 3000}), Live, 0}, // 2 × 3 s = 6 s
			{4999 * ms, sweep(), Live, 0},
			{5 * s, sweep(), Wedged, CauseEngineSilence},
		}},
		{name: "token-batch wire: the routers' prompts in prefill stretch it when the servicer reports none", steps: []step{
			{0, rate(1000), Live, 0},
			{0, routers(1, never, 3000), Live, 0},                      // 3,000 prompt tokens in flight: 2 × 3 s
			{0, record(Record{Pushed: true, Silence: 1 * s}), Live, 0}, // an agent reading SGLang: no prefill figure
			{2 * s, sweep(), Live, 0},
			{4999 * ms, sweep(), Live, 0},
			{5 * s, sweep(), Wedged, CauseEngineSilence},
		}},
		{name: "token-batch wire: never below wedge-secs", steps: []step{
			{0, rate(1_000_000), Live, 0},
			{0, record(Record{Pushed: true, Silence: 2999 * ms, PrefillInHand: 10}), Live, 0},
			{3 * s, record(Record{Pushed: true, Silence: 3 * s, PrefillInHand: 10}), Wedged, CauseEngineSilence},
		}},
		{name: "token-batch wire: stretch capped at 120 s", steps: []step{
			{0, rate(100), Live, 0},
			{0, record(Record{Pushed: true, Silence: 100 * s, PrefillInHand: 1_000_000}), Live, 0},
			{5 * s, record(Record{Pushed: true, Silence: 105 * s, PrefillInHand: 1_000_000}), Live, 0},
			{10 * s, record(Record{Pushed: true, Silence: 110 * s, PrefillInHand: 1_000_000}), Live, 0},
			{19999 * ms, sweep(), Live, 0},
			{20 * s, sweep(), Wedged, CauseEngineSilence},
		}},
		{name: "an older servicer reports no silence: the signal stays quiet", steps: []step{
			{0, record(Record{Pushed: true, StepWire: true}), Live, 0},
			{10 * s, sweep(), Live, 0},
		}},
		{name: "wedge 0 disables every wedge rule", rules: wedge(0), steps: []step{
			{0, rate(1000), Live, 0},
			{0, routers(10, never, 0), Live, 0},
			{0, record(Record{Pushed: true, Waiting: 5, Silence: 100 * s, StepWire: true}), Live, 0},
			{10 * s, sweep(), Live, 0},
		}},
	})
}

// "The veto ends with progress, or when the evidence behind it is gone".
func TestWedgedWaysOut(t *testing.T) {
	runAll(t, []scenario{
		{name: "progress: a token ends the veto; silence re-arms it", steps: []step{
			{0, routers(4, never, 0), Live, 0},
			{3 * s, sweep(), Wedged, CausePile},
			{3500 * ms, routers(4, 3400*ms, 0), Live, CauseProgress},
			{6399 * ms, sweep(), Live, 0},
			{6400 * ms, sweep(), Wedged, CausePile},
		}},
		{name: "progress: a completion ends the veto", steps: []step{
			{0, routers(4, never, 0), Live, 0},
			{3 * s, sweep(), Wedged, 0},
			{4 * s, routers(3, 4*s, 0), Live, CauseProgress},
		}},
		{name: "nothing left in flight ends it; the next requests re-arm within the bound", steps: []step{
			{0, routers(4, never, 0), Live, 0},
			{3 * s, sweep(), Wedged, CausePile},
			{5 * s, routers(0, never, 0), Live, CausePileEmpty},
			{6 * s, routers(4, never, 0), Live, 0},
			{8999 * ms, sweep(), Live, 0},
			{9 * s, sweep(), Wedged, CausePile},
		}},
		{name: "an empty pile does not end it while the engine's record still reports it stuck", steps: []step{
			{0, routers(2, never, 0), Live, 0},
			{0, record(Record{Pushed: true, Silence: 3 * s, StepWire: true}), Wedged, CauseEngineSilence},
			{1 * s, routers(0, never, 0), Wedged, 0},
			{2 * s, record(Record{Pushed: true, StepWire: true}), Live, CauseEngineResumed},
		}},
		{name: "a record no longer reporting silence past its bound ends it", steps: []step{
			{0, record(Record{Pushed: true, Silence: 5 * s, StepWire: true}), Wedged, CauseEngineSilence},
			{1 * s, record(Record{Pushed: true, Silence: 500 * ms, StepWire: true}), Live, CauseEngineResumed},
			{3 * s, sweep(), Live, 0},
			{3500 * ms, sweep(), Wedged, CauseEngineSilence}, // still silent since 0.5 s: 3 s later
		}},
		{name: "not while this gateway holds a silent pile of its own", steps: []step{
			{0, routers(1, never, 0), Live, 0},
			{0, record(Record{Pushed: true, Silence: 5 * s, StepWire: true}), Wedged, CauseEngineSilence},
			{1 * s, record(Record{Pushed: true, StepWire: true}), Wedged, 0},
			{1500 * ms, routers(1, 1500*ms, 0), Live, CauseProgress},
		}},
		{name: "a queue veto is held by the silent pile after the queue drains", steps: []step{
			{0, routers(1, never, 0), Live, 0},
			{0, pushed(2), Live, 0},
			{3 * s, sweep(), Wedged, CauseWaitingQueue},
			{4 * s, pushed(0), Wedged, 0},
			{5 * s, routers(0, never, 0), Live, CausePileEmpty},
		}},
		{name: "progress after the engine's record refutes its silence until the next record", steps: []step{
			{0, record(Record{Pushed: true, Silence: 5 * s, StepWire: true}), Wedged, CauseEngineSilence},
			{500 * ms, routers(0, 500*ms, 0), Live, CauseProgress},
			{2 * s, sweep(), Live, 0},
			{3 * s, record(Record{Pushed: true, Silence: 200 * ms, StepWire: true}), Live, 0},
			{5799 * ms, sweep(), Live, 0},
			{5800 * ms, sweep(), Wedged, CauseEngineSilence},
		}},
		{name: "transport failure then stall silence converts wedged to unreachable; contact clears", steps: []step{
			{0, routers(4, never, 0), Live, 0},
			{0, pushed(0), Live, 0},
			{3 * s, sweep(), Wedged, CausePile},
			{5 * s, pushed(0), Wedged, 0},
			{5500 * ms, fail(ConnectionFailure), Wedged, 0},
			{6999 * ms, sweep(), Wedged, 0},
			{7 * s, sweep(), Unreachable, CauseTransport},
			{8 * s, routers(0, never, 0), Unreachable, 0}, // streams torn down with the connection
			{9 * s, pushed(0), Live, CauseContact},
		}},
		{name: "total silence converts wedged to unreachable; contact clears", steps: []step{
			{0, routers(4, never, 0), Live, 0},
			{0, pushed(0), Live, 0},
			{3 * s, sweep(), Wedged, CausePile},
			{14999 * ms, sweep(), Wedged, 0},
			{15 * s, sweep(), Unreachable, CauseStale},
			{15500 * ms, routers(0, never, 0), Unreachable, 0},
			{16 * s, pushed(0), Live, CauseContact},
		}},
		{name: "after re-admission a still silent deep pile is wedged again", steps: []step{
			{0, routers(4, never, 0), Live, 0},
			{0, pushed(0), Live, 0},
			{15 * s, sweep(), Unreachable, CauseStale},
			{16 * s, pushed(0), Wedged, CausePile},
		}},
	})
}

// "a slow worker that still streams does not flap in and out of routing".
func TestSlowWorkerNeverFlaps(t *testing.T) {
	r := DefaultLivenessConfig().Rules()
	var l Liveness
	l.SetPrefillRate(5000)
	lastToken := time.Duration(0)
	for now := time.Duration(0); now <= 60*s; now += 250 * ms {
		at := t0.Add(now)
		var changes []Change
		if now%(1*s) == 0 {
			changes = append(changes, l.Record(at, Record{Pushed: true, Waiting: 10, StepWire: true}, &r))
		}
		if now%(2500*ms) == 0 { // a token every 2.5 s, inside the 3 s bound
			lastToken = now
			changes = append(changes, l.Failure(at, DeadlineExceeded, &r))
		}
		changes = append(changes,
			l.Routers(at, RouterObservation{Streams: 8 + int64(now/s)%3, LastProgress: t0.Add(lastToken), PrefillTokens: 500}, &r),
			l.Sweep(at, nil, &r))
		for _, ch := range changes {
			if ch.Verdict != Live || ch.Changed() {
				t.Fatalf("at %v: %v (%q), want live throughout", now, ch.Verdict, ch.Cause)
			}
		}
	}
}

func TestCauseStrings(t *testing.T) {
	cases := []struct {
		c    Cause
		want string
	}{
		{Cause{Kind: CauseTransport, Silence: 2500 * ms, Bound: 2 * s}, "connection failed and nothing heard for 2.5s (stall 2s)"},
		{Cause{Kind: CauseTransport, Never: true}, "connection failed and nothing has been heard from the worker"},
		{Cause{Kind: CauseStale, Silence: 15 * s, Bound: 15 * s}, "nothing heard on any channel for 15s after pushed load records (stale 15s)"},
		{Cause{Kind: CauseWaitingQueue, Waiting: 5, Streams: 2, Silence: 3 * s, Bound: 3 * s},
			"waiting queue of 5 with 2 streaming requests in flight and no progress for 3s (bound 3s)"},
		{Cause{Kind: CausePile, Streams: 4, PileLow: 4, Silence: 3 * s, Bound: 3 * s}, "4 streaming requests in flight (deep) and no progress for 3s (bound 3s)"},
		{Cause{Kind: CausePile, Streams: 2, PileLow: 1, Silence: 3 * s, Bound: 3 * s}, "2 streaming requests in flight (grew from 1) and no progress for 3s (bound 3s)"},
		{Cause{Kind: CauseEngineSilence, Silence: 4 * s, Bound: 3 * s}, "engine reports no output for 4s while holding streaming requests (bound 3s)"},
		{Cause{Kind: CauseEngineResumed}, "engine producing again"},
	}
	for _, c := range cases {
		if got := c.c.String(); got != c.want {
			t.Errorf("got %q, want %q", got, c.want)
		}
	}
	for v, want := range map[Verdict]string{Live: "none", Wedged: "wedged", Unreachable: "unreachable"} {
		if v.String() != want {
			t.Errorf("Verdict(%d) = %q, want %q (smg_worker_stalled reason label)", v, v, want)
		}
	}
}

func TestLivenessConfig(t *testing.T) {
	if got := DefaultLivenessConfig().Rules(); got != (Rules{Stall: 2 * s, Wedge: 3 * s, Stale: 15 * s, ReadLag: 15 * s}) || DeepPile != 4 || BoundCap != 120*s {
		t.Fatalf("default rules %+v, deep pile %d, bound cap %v", got, DeepPile, BoundCap)
	}
	for _, c := range []struct {
		cfg  LivenessConfig
		want string
	}{
		{LivenessConfig{}, ""},
		{LivenessConfig{StallSecs: -1}, "--worker-stall-secs must be an integer >= 0, got -1"},
		{LivenessConfig{WedgeSecs: -2}, "--worker-wedge-secs must be an integer >= 0, got -2"},
		{LivenessConfig{StaleSecs: -3}, "--worker-stale-secs must be an integer >= 0, got -3"},
	} {
		if got := errString(c.cfg.Validate()); got != c.want {
			t.Errorf("%+v.Validate() = %q, want %q", c.cfg, got, c.want)
		}
	}
	if w := DefaultLivenessConfig().Warnings(10); len(w) != 0 {
		t.Errorf("defaults warn: %v", w)
	}
	if w := (LivenessConfig{StaleSecs: 10}).Warnings(10); len(w) != 1 || !strings.Contains(w[0], "--worker-stale-secs 10 is not above --load-monitor-interval 10") {
		t.Errorf("stale == interval: %v", w)
	}

	var out bytes.Buffer
	fs := cli.NewFlagSet("controlplane", "test", &out)
	cfg := DefaultLivenessConfig()
	cfg.AddFlags(fs)
	if err := cli.Parse(fs, []string{"--worker-stall-secs", "0", "--worker-wedge-secs=5", "--worker-stale-secs", "30"}); err != nil {
		t.Fatal(err)
	}
	if cfg != (LivenessConfig{0, 5, 30}) {
		t.Fatalf("parsed %+v", cfg)
	}
	fs.Usage()
	for _, want := range []string{"-worker-stall-secs int", "(default 2)", "(default 3)", "(default 15)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("help lacks %q:\n%s", want, out.String())
		}
	}
}
