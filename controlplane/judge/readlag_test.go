package judge

import (
	"fmt"
	"testing"
	"time"
)

// The agent's clock runs an hour and a bit behind the control plane's: only
// differences on one stream matter, never the skew.
var agentT0 = t0.Add(-time.Hour - 1234*ms)

// heardRec is a pushed record read on stream 1, sent at agent time sent.
func heardRec(sent time.Duration) event {
	return heardRecAt(agentT0.Add(sent))
}

func heardRecAt(sentAt time.Time) event {
	rec := Record{Pushed: true, StepWire: true, Heard: Heard{Stream: 1, SentAt: sentAt}}
	return event{fmt.Sprintf("record(sent %v)", sentAt.Sub(agentT0)), func(l *Liveness, now time.Time, r *Rules) Change { return l.Record(now, rec, r) }}
}

// silentRec is a pushed record on stream 1 reporting the engine silent for d.
func silentRec(sent, d time.Duration) event {
	rec := Record{Pushed: true, StepWire: true, Silence: d, Heard: Heard{Stream: 1, SentAt: agentT0.Add(sent)}}
	return event{fmt.Sprintf("record(sent %v, silence %v)", sent, d), func(l *Liveness, now time.Time, r *Rules) Change { return l.Record(now, rec, r) }}
}

// sweepRead sweeps with stream 1 read up to a message sent at agent time
// sent, read at read; busy: the receive loop is still applying it.
func sweepRead(read, sent time.Duration, busy bool) event {
	return sweepReadAt(read, agentT0.Add(sent), busy)
}

func sweepReadAt(read time.Duration, sentAt time.Time, busy bool) event {
	v := StreamRead{Stream: 1, ReadAt: t0.Add(read), SentAt: sentAt, Busy: busy}
	return event{fmt.Sprintf("sweep(read %v, sent %v, busy %v)", read, sentAt.Sub(agentT0), busy),
		func(l *Liveness, now time.Time, r *Rules) Change { return l.Sweep(now, &v, r) }}
}

// sweepStalled sweeps with stream 1 waiting for its next message since it
// read one sent at agent time sent at read, the process stood still for
// stalled since.
func sweepStalled(read, sent, stalled time.Duration) event {
	v := StreamRead{Stream: 1, ReadAt: t0.Add(read), SentAt: agentT0.Add(sent), Stalled: stalled}
	return event{fmt.Sprintf("sweep(read %v, sent %v, stalled %v)", read, sent, stalled),
		func(l *Liveness, now time.Time, r *Rules) Change { return l.Sweep(now, &v, r) }}
}

// sweepGone sweeps after the worker's stream ended (no read state).
func sweepGone() event {
	return event{"sweep(stream gone)", func(l *Liveness, now time.Time, r *Rules) Change { return l.Sweep(now, nil, r) }}
}

// A control plane behind on its agent's stream (records queued unread)
// vetoes nothing: the silence it did not read is not counted.
func TestReadLateVetoesNothing(t *testing.T) {
	runAll(t, []scenario{
		{name: "the receive loop blocked for 16 s, then reads the queue", steps: []step{
			{0, heardRec(0), Live, 0},
			// The message after it, sent at 0.5 s, is read at 0.5 s and its
			// apply blocks (a convoy on a lock, a starved process) until 16.5 s.
			{15 * s, sweepRead(500*ms, 500*ms, true), Live, 0},
			{16 * s, sweepRead(500*ms, 500*ms, true), Live, 0},
			// Reading again: the queue, sent at 1-2 s, read 15.5 s late.
			{16600 * ms, sweepRead(16600*ms, 1*s, false), Live, 0},
			{16700 * ms, heardRec(2 * s), Live, 0},
			{20 * s, sweepRead(19*s, 5*s, false), Live, 0},
		}},
		{name: "reading slowly: each message read later than the one before", steps: []step{
			{0, heardRec(0), Live, 0},
			{15 * s, sweepRead(10*s, 1*s, false), Live, 0},
			{20 * s, sweepRead(20*s, 2*s, false), Live, 0},
			{25 * s, sweepRead(24*s, 3*s, false), Live, 0},
			{26 * s, heardRec(4 * s), Live, 0},
		}},
		{name: "the process stood still 20 s: the first sweep after it comes before the stream is read", steps: []step{
			{0, heardRec(0), Live, 0},
			{1 * s, sweepStalled(500*ms, 500*ms, 0), Live, 0},
			{21 * s, sweepStalled(500*ms, 500*ms, 19750*ms), Live, 0},
			{21010 * ms, heardRec(1 * s), Live, 0},
		}},
		{name: "the engine's silence is not extrapolated over the unread stretch", steps: []step{
			{0, silentRec(0, 1*s), Live, 0},
			{3 * s, sweepRead(500*ms, 500*ms, true), Live, 0},
			{10 * s, sweepRead(500*ms, 500*ms, true), Live, 0},
			{10100 * ms, silentRec(1*s, 0), Live, 0}, // it stepped again, long ago
		}},
	})
}

// An agent that really goes silent (its stream open, nothing on it) is
// vetoed at the stale bound, as on the control plane's clock alone; so is a
// worker its agent stops mentioning while the stream is read on time.
func TestReallySilentIsVetoedAtTheStaleBound(t *testing.T) {
	runAll(t, []scenario{
		{name: "nothing more on the stream", steps: []step{
			{0, heardRec(0), Live, 0},
			{14999 * ms, sweepRead(0, 0, false), Live, 0},
			{15 * s, sweepRead(0, 0, false), Unreachable, CauseStale},
		}},
		{name: "the stream read on time, the worker no longer mentioned", steps: []step{
			{0, heardRec(0), Live, 0},
			{14999 * ms, sweepRead(14900*ms, 14900*ms, false), Live, 0},
			{15 * s, sweepRead(14950*ms, 14950*ms, false), Unreachable, CauseStale},
		}},
		{name: "a stream read late and caught up again: only the lag it still has is credited", steps: []step{
			{0, heardRec(0), Live, 0},
			{10 * s, sweepRead(10*s, 2*s, false), Live, 0},  // 8 s behind
			{16 * s, sweepRead(16*s, 14*s, false), Live, 0}, // 2 s behind
			{16999 * ms, sweepRead(16*s, 14*s, false), Live, 0},
			{17 * s, sweepRead(16*s, 14*s, false), Unreachable, CauseStale},
		}},
		{name: "the engine's silence, read on time", steps: []step{
			{0, routers(1, never, 0), Live, 0},
			{0, silentRec(0, 1*s), Live, 0},
			{1999 * ms, sweepRead(0, 0, false), Live, 0},
			{2 * s, sweepRead(0, 0, false), Wedged, CauseEngineSilence},
		}},
		{name: "the stream ended: no credit", steps: []step{
			{0, heardRec(0), Live, 0},
			{14 * s, sweepRead(500*ms, 500*ms, true), Live, 0},
			{15 * s, sweepGone(), Unreachable, CauseStale},
		}},
		{name: "a stale veto holds until contact, however the credit moves", steps: []step{
			{0, heardRec(0), Live, 0},
			{15 * s, sweepRead(0, 0, false), Unreachable, CauseStale},
			{16 * s, sweepRead(16*s, 1*s, false), Unreachable, 0},
			{17 * s, sweepRead(16*s, 1*s, true), Unreachable, 0},
			{18 * s, heardRec(3 * s), Live, CauseContact},
		}},
	})
}

// A cut-off agent: the broken stream is a connection failure, judged on the
// control plane's clock alone, whatever the read state says.
func TestCutOffAgentIsVetoedByTheTransportRule(t *testing.T) {
	runAll(t, []scenario{
		{name: "stream broke while its receive loop was blocked", steps: []step{
			{0, heardRec(0), Live, 0},
			{1 * s, fail(ConnectionFailure), Live, 0},
			{1999 * ms, sweepRead(500*ms, 500*ms, true), Live, 0},
			{2 * s, sweepRead(500*ms, 500*ms, true), Unreachable, CauseTransport},
		}},
	})
}

// What the agent says about time can delay a silent worker's veto by
// ReadLag at most (the stale bound again: 30 s in all), never more.
func TestLyingAgentDelaysTheVetoByReadLagAtMost(t *testing.T) {
	bound := 30 * s // Stale + ReadLag
	lie := func(name string, first event, sweeps func(at time.Duration) event) scenario {
		return scenario{name: name, steps: []step{
			{0, first, Live, 0},
			{bound - ms, sweeps(bound - ms), Live, 0},
			{bound, sweeps(bound), Unreachable, CauseStale},
		}}
	}
	// Messages keep coming, read on time, never mentioning the worker.
	honest := func(at time.Duration) event { return sweepRead(at-10*ms, at-10*ms, false) }
	runAll(t, []scenario{
		lie("evidence sent in the future", heardRecAt(agentT0.Add(24*time.Hour)), honest),
		lie("evidence sent centuries in the future", heardRecAt(time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)), honest),
		lie("a frozen clock", heardRec(0), func(at time.Duration) event { return sweepRead(at-10*ms, 0, false) }),
		lie("a clock that jumps back", heardRec(0), func(at time.Duration) event { return sweepRead(at-10*ms, -time.Hour, false) }),
		lie("a clock that jumps back to year 1", heardRec(0), func(at time.Duration) event { return sweepReadAt(at-10*ms, time.Time{}.Add(time.Second), false) }),
		lie("a receive loop that never returns", heardRec(0), func(time.Duration) event { return sweepRead(500*ms, 500*ms, true) }),
		lie("a process that keeps standing still", heardRec(0), func(at time.Duration) event { return sweepStalled(500*ms, 500*ms, at) }),
		{name: "a clock that jumps forward costs no credit", steps: []step{
			{0, heardRec(0), Live, 0},
			{14999 * ms, sweepRead(14*s, 14*s+time.Hour, false), Live, 0},
			{15 * s, sweepRead(14*s, 14*s+time.Hour, false), Unreachable, CauseStale},
		}},
		{name: "an agent that does not say its clock gets no credit", steps: []step{
			{0, heardRecAt(time.Time{}), Live, 0},
			{15 * s, sweepRead(500*ms, 500*ms, true), Unreachable, CauseStale},
		}},
	})
}

// Outside sweeps the read state is unknown: a router report, a probe or a
// failure never enters the stale veto before a sweep with the stream would.
func TestOnlySweepsUseTheStream(t *testing.T) {
	runAll(t, []scenario{
		{name: "a router report at the bound", steps: []step{
			{0, heardRec(0), Live, 0},
			{16 * s, routers(0, never, 0), Live, 0},
			{16 * s, sweepRead(0, 0, false), Unreachable, CauseStale},
		}},
		{name: "past the bound and its credit cap, any call vetoes", steps: []step{
			{0, heardRec(0), Live, 0},
			{30 * s, routers(0, never, 0), Unreachable, CauseStale},
		}},
	})
}

func TestStaleCauseSaysWhatWasNotCounted(t *testing.T) {
	var l Liveness
	r := DefaultLivenessConfig().Rules()
	l.Record(t0, Record{Pushed: true, Heard: Heard{Stream: 1, SentAt: agentT0}}, &r)
	ch := l.Sweep(t0.Add(25*s), &StreamRead{Stream: 1, ReadAt: t0.Add(20 * s), SentAt: agentT0.Add(10 * s)}, &r)
	if ch.Verdict != Unreachable || ch.Cause.Silence != 15*s || ch.Cause.Unread != 10*s {
		t.Fatalf("got %v %+v, want unreachable after 15s with 10s unread", ch.Verdict, ch.Cause)
	}
	want := "nothing heard on any channel for 15s after pushed load records (stale 15s); 10s more not counted: the control plane was behind reading the agent's stream"
	if got := ch.Cause.String(); got != want {
		t.Fatalf("cause %q, want %q", got, want)
	}
}

// A sweep says when it held a veto off for the read credit (the control
// plane counts those workers: smg_liveness_held_for_read_lag_workers).
func TestSweepSaysWhenItHeldAVeto(t *testing.T) {
	r := DefaultLivenessConfig().Rules()
	for _, c := range []struct {
		name string
		at   time.Duration
		read StreamRead
		want bool
	}{
		{"due on the clock, held for a busy stream", 16 * s, StreamRead{Stream: 1, ReadAt: t0.Add(s), SentAt: agentT0.Add(s), Busy: true}, true},
		{"due on the clock, held for a lagging stream", 16 * s, StreamRead{Stream: 1, ReadAt: t0.Add(10 * s), SentAt: agentT0.Add(s)}, true},
		{"not due yet", 10 * s, StreamRead{Stream: 1, ReadAt: t0.Add(s), SentAt: agentT0.Add(s), Busy: true}, false},
		{"due and read on time: vetoed, not held", 16 * s, StreamRead{Stream: 1, ReadAt: t0.Add(s), SentAt: agentT0.Add(s)}, false},
	} {
		var l Liveness
		l.Record(t0, Record{Pushed: true, Heard: Heard{Stream: 1, SentAt: agentT0}}, &r)
		if ch := l.Sweep(t0.Add(c.at), &c.read, &r); ch.Held != c.want {
			t.Errorf("%s: held %v (verdict %v), want %v", c.name, ch.Held, ch.Verdict, c.want)
		}
	}
}
