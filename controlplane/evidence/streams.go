package evidence

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
)

// Stream is how far the control plane has read one agent stream: its
// receive loop calls Read for every message and Applied when done, so a
// sweep tells the agent's silence from its own lag (judge.StreamRead).
type Stream struct {
	id     uint64
	stalls *atomic.Int64 // the inbox's: process stall time so far, ns

	mu          sync.Mutex
	readAt      time.Time
	sentAt      time.Time
	busy        bool
	stallAtRead int64 // *stalls when the newest message was read
}

// Read notes a message read at now (the control plane's clock) that the
// agent sent at sentAt (its clock; zero: not said), busy until Applied,
// and returns what its evidence is heard as.
func (s *Stream) Read(now, sentAt time.Time) judge.Heard {
	stalls := s.stalls.Load()
	s.mu.Lock()
	s.readAt, s.sentAt, s.busy, s.stallAtRead = now, sentAt, true, stalls
	s.mu.Unlock()
	return judge.Heard{Stream: s.id, SentAt: sentAt}
}

// Applied notes that the receive loop is done with the message it read.
func (s *Stream) Applied() {
	s.mu.Lock()
	s.busy = false
	s.mu.Unlock()
}

// streams are the open agent streams, and how long the process has stood
// still: a sweep much later than its interval (the process was paused or
// starved of CPU) counts the excess, so a stream is not taken as read up to
// now before its receive loop had a chance to read what arrived meanwhile.
type streams struct {
	mu        sync.Mutex
	next      uint64
	open      map[uint64]*Stream
	stalls    atomic.Int64 // ns
	lastSweep time.Time
}

// stallAfter is how late a sweep must come to count as a stall of the
// process (scheduling jitter is not one).
const stallAfter = 4 * judge.SweepInterval

// OpenStream registers a new agent stream; close it with CloseStream when
// the stream ends, so its workers' silence is no longer credited to it.
func (in *Inbox) OpenStream() *Stream {
	in.streams.mu.Lock()
	defer in.streams.mu.Unlock()
	in.streams.next++
	s := &Stream{id: in.streams.next, stalls: &in.streams.stalls}
	in.streams.open[s.id] = s
	return s
}

// CloseStream forgets an ended stream.
func (in *Inbox) CloseStream(s *Stream) {
	in.streams.mu.Lock()
	defer in.streams.mu.Unlock()
	delete(in.streams.open, s.id)
}

// readStates returns every open stream's read state for one sweep at now,
// counting as a stall the previous sweep's lateness when stallAfter or more.
func (in *Inbox) readStates(now time.Time) map[uint64]*judge.StreamRead {
	ss := &in.streams
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if gap := now.Sub(ss.lastSweep); !ss.lastSweep.IsZero() && gap >= stallAfter {
		ss.stalls.Add(int64(gap - judge.SweepInterval))
	}
	if now.After(ss.lastSweep) {
		ss.lastSweep = now
	}
	stalls := ss.stalls.Load()
	out := make(map[uint64]*judge.StreamRead, len(ss.open))
	for id, s := range ss.open {
		s.mu.Lock() // a stream's lock is taken after the set's, never before
		out[id] = &judge.StreamRead{Stream: s.id, ReadAt: s.readAt, SentAt: s.sentAt, Busy: s.busy,
			Stalled: time.Duration(stalls - s.stallAtRead)}
		s.mu.Unlock()
	}
	return out
}

// Heard is Contact read on an agent stream (the agent vouches for the
// engine): the stream's read state then times the worker's silence.
func (in *Inbox) Heard(workerID string, h judge.Heard, now time.Time) {
	in.with(workerID, func(ev *registry.Evidence) { ev.Live.Heard(now, h, &in.rules) })
}
