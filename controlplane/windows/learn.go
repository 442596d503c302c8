package windows

import (
	"sync"
	"time"
)

// Learning the window of an engine that does not report one (vLLM):
//
//   - the running count at which a waiting queue appears is the engine's
//     limit until the engine shows otherwise. A queue is read at once, from
//     every load report (ObserveLoad), and a lower limit is committed in a
//     round run at once, not at the next one;
//   - a queue with KV nearly full says the limit is KV (it shrinks with long
//     prompts and grows back as KV frees); a queue with KV to spare says it
//     is a cap on running requests (vLLM's --max-num-seqs), which does not
//     move while the engine runs;
//   - the limit grows only by a probe of one room, and only with evidence
//     (probe): the engine holds the whole window, KV has room for one more
//     request, no router waits for a room (a failed probe would move that
//     request into the engine's queue), the limit is not a confirmed cap,
//     and the back-off has passed. A probe is confirmed when the engine
//     runs its room with nothing waiting; it fails when the engine does not
//     run it for probeSpan while queueing (at once with KV full);
//   - an engine that comes back from a failure spell (possibly restarted
//     with another window) may be probed again.
//
// A queue below a limit the engine has run with nothing waiting, KV to
// spare, is requests caught between two scheduler steps: it lowers nothing.
//
// A report's running count is trusted only downward: an engine that keeps
// queueing while running at least the limit (it counts work it does not
// run, or other clients feed it) is held to the limit minus its queue.
const (
	// kvFullAt: KV usage past which one more request of the running ones'
	// mean size leaves the engine's KV nearly full: a queue then is put
	// down to KV. A probe needs that request to fit (usage <= 1).
	kvFullAt = 0.9
	// queueStreak is how many reports in a row must show a queue that KV
	// does not explain before it moves the limit: a request that arrives
	// between two scheduler steps waits for one step even on an engine
	// with room, and a report may catch it.
	queueStreak = 3
	// queueSpan is the least time such a streak must span, at the same
	// running count: reports that come back to back after the box stalled
	// (an agent catching up) or while a burst of requests is still coming
	// in (the running count rising) are one moment, not a lasting queue.
	queueSpan = 100 * time.Millisecond
	// probeBackoff is the wait before the first probe after the limit
	// changed; it doubles with each failed probe of a KV-bound engine, up
	// to probeBackoffMax.
	probeBackoff    = time.Second
	probeBackoffMax = 16 * time.Second
	// probeSpan is the least time a probe must see the engine queue
	// without running its room, KV to spare, before it counts as failed.
	probeSpan = time.Second
	// settle is how long after the limit went down a queue at or above it
	// is put down to requests admitted under the higher limit, not to the
	// engine.
	settle = 2 * time.Second
)

// Learned-window bases (Admission.LearnedBy): what fixed the limit last.
const (
	LearnedQueue = "queue" // the running count at which a queue appeared, KV to spare: a cap on running requests
	LearnedKV    = "kv"    // the running count at which a queue appeared with KV nearly full
	LearnedProbe = "probe" // a probe of one more room that the engine ran without a queue
)

// Observation is one engine load report as the learner reads it.
type Observation struct {
	Running, Waiting int64
	Usage            float64 // KV token usage, 0..1 (0: not reported)
}

// learner is one worker's learned window.
type learner struct {
	mu  sync.Mutex
	fed bool // ObserveLoad feeds it (else rounds read the registry's load)
	rev uint64

	limit    int64  // 0: none learned yet
	ran      int64  // the most the engine ran with nothing waiting (since its last contact change)
	basis    string // Learned* constant
	capped   bool   // a failed probe with KV to spare: a cap on running requests
	probeOf  int64  // the limit before the probe in flight (0: none)
	probeRan int64  // the most the engine ran since
	last     Observation
	seen     bool // last is set

	logged   int64  // the limit last logged
	loggedBy string // and its basis

	below, above int       // reports in a row queueing below / at or above the limit
	belowRun     int64     // the running count of the below streak
	belowSince   time.Time // its first report
	backoff      time.Duration
	nextProbe    time.Time
	loweredAt    time.Time
	contact      uint64 // the worker's contact sequence when last seen
	contactKnown bool
}

// kvWith is the KV usage o's engine would have with one more request of
// the running ones' mean size (0 when usage is not reported).
func kvWith(o Observation) float64 {
	if o.Usage <= 0 || o.Running <= 0 {
		return 0
	}
	return o.Usage * float64(o.Running+1) / float64(o.Running)
}

// kvFull reports whether KV would be nearly full with one more request.
func kvFull(o Observation) bool { return kvWith(o) > kvFullAt }

// kvSpare reports KV room for one more request: only a reported usage is
// evidence.
func kvSpare(o Observation) bool { return kvWith(o) > 0 && kvWith(o) <= 1+1e-9 }

// observe folds one report in; it reports whether the limit went down or
// was learned (a round should commit it at once).
func (l *learner) observe(o Observation, now time.Time) bool {
	l.last, l.seen = o, true
	if o.Waiting <= 0 {
		l.ran = max(l.ran, o.Running)
	}
	if l.probeOf > 0 {
		return l.observeProbe(o, now)
	}
	if o.Waiting <= 0 {
		l.below, l.above = 0, 0
		return false
	}
	if o.Running <= 0 {
		return false // queued with nothing running: frozen, or one prompt too large for KV; says nothing of the limit
	}
	full := kvFull(o)
	if l.limit == 0 || o.Running < l.limit {
		l.above = 0
		if !full && l.limit > 0 && l.ran >= l.limit {
			l.below = 0 // between two scheduler steps
			return false
		}
		if l.below == 0 || o.Running != l.belowRun {
			l.below, l.belowRun, l.belowSince = 0, o.Running, now
		}
		l.below++
		if !full && (l.below < queueStreak || now.Sub(l.belowSince) < queueSpan) {
			return false
		}
		first := l.limit == 0
		l.limit, l.below = o.Running, 0
		l.basis, l.capped = LearnedQueue, first && !full // a first queue with KV to spare: the cap; a later one may be a slip
		if full {
			l.basis = LearnedKV
		}
		l.backoff, l.nextProbe, l.loweredAt = probeBackoff, now.Add(probeBackoff), now
		return true
	}
	// A queue while running at least the limit: what routers admitted
	// under a higher limit draining, or, once that had time to end, an
	// engine that holds more than it runs of ours (it counts work it does
	// not run, or other clients feed it: smg gives way).
	l.below = 0
	if now.Sub(l.loweredAt) < settle {
		l.above = 0
		return false
	}
	if l.above++; l.above < queueStreak {
		return false
	}
	l.limit, l.above = max(1, l.limit-o.Waiting), 0
	l.loweredAt, l.nextProbe = now, now.Add(l.backoff)
	return true
}

// observeProbe folds in a report while a probe is in flight. The engine
// running the probe's room with nothing waiting confirms it, and the next
// probe may follow at the next round. A running count beside a queue is not
// trusted upward (an engine that counts work it does not run would confirm
// every probe). With KV full a queue takes the probe back at once; with KV
// to spare only queueStreak reports over probeSpan do, never running the
// probe's room: under load most reports catch a room being refilled, so an
// engine that runs the probe's room can look capped for a few reports.
func (l *learner) observeProbe(o Observation, now time.Time) bool {
	if o.Running >= l.limit && o.Waiting <= 0 {
		l.probeOf, l.basis, l.below = 0, LearnedProbe, 0
		l.backoff, l.nextProbe = probeBackoff, now
		return false
	}
	l.probeRan = max(l.probeRan, o.Running)
	if o.Waiting <= 0 || o.Running <= 0 {
		return false
	}
	full := kvFull(o)
	if !full {
		if o.Running+o.Waiting < l.limit {
			return false // the probe's room is not in use yet: no evidence either way
		}
		if l.below == 0 {
			l.belowSince = now
		}
		if l.below++; l.below < queueStreak || now.Sub(l.belowSince) < probeSpan {
			return false
		}
	}
	old := l.limit
	switch {
	case full:
		l.limit, l.basis, l.backoff = min(l.probeOf, o.Running), LearnedKV, min(2*l.backoff, probeBackoffMax)
	case l.probeRan >= l.probeOf: // it ran all it had before, never the probe's room, and queued: that was the cap
		l.limit, l.basis, l.capped = l.probeOf, LearnedQueue, true
	default: // a queue below the old limit with KV to spare: try later
		l.limit = l.probeOf
	}
	l.probeOf = 0
	l.nextProbe, l.loweredAt = now.Add(l.backoff), now
	l.below, l.above = 0, 0
	return l.limit < old
}

// probe raises the limit by one room when the latest report shows evidence
// for it; routersWaiting is whether any router has a request waiting for a
// room on this worker.
func (l *learner) probe(now time.Time, routersWaiting bool) bool {
	o := l.last
	// The engine holds the whole window and queues none of it beyond its
	// free rooms (a request on its way in waits for one step).
	full := o.Running+o.Waiting >= l.limit && o.Waiting <= max(0, l.limit-o.Running)
	if l.limit <= 0 || l.capped || l.probeOf > 0 || !l.seen || routersWaiting || now.Before(l.nextProbe) ||
		!full || !kvSpare(o) {
		return false
	}
	l.probeOf, l.probeRan, l.below = l.limit, 0, 0
	l.limit++
	return true
}

// contactAgain re-opens probing when the worker came back from a failure
// spell (perhaps restarted with another window).
func (l *learner) contactAgain(seq uint64, now time.Time) {
	if l.contactKnown && seq == l.contact {
		return
	}
	known := l.contactKnown
	l.contact, l.contactKnown = seq, true
	if known && l.limit > 0 {
		l.capped, l.backoff, l.nextProbe, l.ran = false, probeBackoff, now, 0
		l.seen = false // what it reported before the spell is no evidence for a probe
	}
}
