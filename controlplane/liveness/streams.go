package liveness

import (
	"sync"
	"time"

	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
)

// Stream is how far the control plane has read one agent stream: its
// receive loop calls Read for every message and Applied when done with it;
// each sweep reads it to tell "the agent went silent" from "this process has
// not read what the agent sent" (judge.StreamRead). Open one with
// Tracker.OpenStream.
type Stream struct {
	id uint64

	mu     sync.Mutex
	readAt time.Time
	sentAt time.Time
	busy   bool
}

// Read notes a message read at now (the control plane's clock) that the
// agent sent at sentAt (its clock; zero: not said). The stream is busy until
// Applied. It returns what evidence from the message is heard as.
func (s *Stream) Read(now, sentAt time.Time) judge.Heard {
	s.mu.Lock()
	s.readAt, s.sentAt, s.busy = now, sentAt, true
	s.mu.Unlock()
	return judge.Heard{Stream: s.id, SentAt: sentAt}
}

// Applied notes that the receive loop is done with the message it read and
// waits for the next.
func (s *Stream) Applied() {
	s.mu.Lock()
	s.busy = false
	s.mu.Unlock()
}

func (s *Stream) state() *judge.StreamRead {
	s.mu.Lock()
	defer s.mu.Unlock()
	return &judge.StreamRead{Stream: s.id, ReadAt: s.readAt, SentAt: s.sentAt, Busy: s.busy}
}

// streams are the open agent streams.
type streams struct {
	mu   sync.Mutex
	next uint64
	open map[uint64]*Stream
}

// OpenStream registers a new agent stream; close it with CloseStream when
// the stream ends, so its workers' silence is no longer credited to it.
func (t *Tracker) OpenStream() *Stream {
	t.streams.mu.Lock()
	defer t.streams.mu.Unlock()
	t.streams.next++
	s := &Stream{id: t.streams.next}
	if t.streams.open == nil {
		t.streams.open = map[uint64]*Stream{}
	}
	t.streams.open[s.id] = s
	return s
}

// CloseStream forgets an ended stream.
func (t *Tracker) CloseStream(s *Stream) {
	t.streams.mu.Lock()
	defer t.streams.mu.Unlock()
	delete(t.streams.open, s.id)
}

// readStates returns every open stream's read state, for one sweep.
func (t *Tracker) readStates() map[uint64]*judge.StreamRead {
	t.streams.mu.Lock()
	open := make([]*Stream, 0, len(t.streams.open))
	for _, s := range t.streams.open {
		open = append(open, s)
	}
	t.streams.mu.Unlock()
	out := make(map[uint64]*judge.StreamRead, len(open))
	for _, s := range open {
		out[s.id] = s.state()
	}
	return out
}

// Heard records contact read on an agent stream (the agent vouches for the
// engine): like Contact, and the stream's read state then times the
// worker's silence.
func (t *Tracker) Heard(workerID string, h judge.Heard, now time.Time) {
	t.with(workerID, func(ev *registry.Evidence) { ev.Live.Heard(now, h, &t.rules) })
}
