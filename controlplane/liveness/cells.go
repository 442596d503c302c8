package liveness

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/smg-project/smg/controlplane/registry"
	"github.com/smg-project/smg/internal/shardmap"
)

// cells are the pending records of each Ready worker that pushed one, each
// under its own lock and found without one: 100 agent streams push 20,000
// messages a second, and one lock they all took would form a convoy behind
// any holder that was delayed (a GC assist, a preempted flush), handed over
// in FIFO order through every waiting stream.
type cells struct {
	byID *shardmap.Map[*cell]
	// added are the cells made since the last list, newest first: a
	// pusher adds its worker's without a lock (a fleet's first records
	// make 10,000 at once).
	added atomic.Pointer[cell]
	mu    sync.Mutex // the flush's and the sweep's, never a pusher's
	all   []*cell    // every cell in byID but the added; mu held
}

// cell is one worker's pending records: only its pushers, the flushes and
// the sweep lock it.
type cell struct {
	id   string
	mu   sync.Mutex
	p    pendingRecords // being filled
	has  atomic.Bool    // p has records: PendingIDs reads it without mu
	gone bool           // dropped from byID: a pusher that found it looks again
	next *cell          // in cells.added
}

// pendingRecords are a worker's records waiting for a flush, in order, and
// w, a scratch copy of base (the stored record they were predicted against)
// with them applied: a record that finds the same base stored applies
// itself alone.
type pendingRecords struct {
	recs []timedRecord
	base *registry.Worker
	w    registry.Worker
}

// maxKept bounds the room a worker's buffers keep: a burst's is not kept.
const maxKept = 64

// reset empties p, keeping its room.
func (p *pendingRecords) reset() {
	recs := p.recs[:0]
	if cap(recs) > maxKept {
		recs = nil
	}
	*p = pendingRecords{recs: recs}
}

func newCells() cells { return cells{byID: shardmap.New[*cell]()} }

// get returns id's cell, or nil.
func (cs *cells) get(id string) *cell {
	c, _ := cs.byID.Load(id)
	return c
}

// add returns id's cell, made if it has none (the caller checked that id
// is a Ready worker: a hostile agent's unknown ids make none).
func (cs *cells) add(id string) *cell {
	if c := cs.get(id); c != nil {
		return c
	}
	// Room for the records of one flush interval at a typical cadence.
	made := &cell{id: id, p: pendingRecords{recs: make([]timedRecord, 0, 8)}}
	if c, loaded := cs.byID.LoadOrStore(id, made); loaded {
		return c
	}
	for {
		made.next = cs.added.Load()
		if cs.added.CompareAndSwap(made.next, made) {
			return made
		}
	}
}

// list returns every cell; the caller only reads it.
func (cs *cells) list() []*cell {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.listLocked()
}

// listLocked is list with mu held: it moves the added cells to all. A
// slice it returned is never written below its length again.
func (cs *cells) listLocked() []*cell {
	for c := cs.added.Swap(nil); c != nil; {
		next := c.next
		c.next = nil
		cs.all = append(cs.all, c)
		c = next
	}
	return cs.all
}

// prune drops the cells of workers that keep says no longer pend (removed,
// or out of Ready: the registry dropped their evidence as they went), with
// their records. keep is asked again under the cell's lock, where a pusher
// asks the registry too.
func (cs *cells) prune(keep func(id string) bool) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	old := cs.listLocked()
	if !slices.ContainsFunc(old, func(c *cell) bool { return !keep(c.id) }) {
		return // the usual case
	}
	kept := make([]*cell, 0, len(old))
	for _, c := range old {
		c.mu.Lock()
		if keep(c.id) {
			kept = append(kept, c)
		} else {
			c.gone = true
			cs.byID.CompareAndDelete(c.id, c)
			c.p = pendingRecords{}
			c.has.Store(false)
		}
		c.mu.Unlock()
	}
	cs.all = kept
}

// take hands the cell's records to the running flush transaction, with
// the prediction's work, and gives the cell buf (empty, nil: none yet)
// for the next; ok is false when it has none (buf is not taken then).
func (c *cell) take(buf []timedRecord) (tk takenRecords, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gone || len(c.p.recs) == 0 {
		return tk, false
	}
	tk = takenRecords{base: c.p.base, ev: c.p.w.Evidence, recs: c.p.recs}
	c.p = pendingRecords{recs: buf}
	c.has.Store(false)
	return tk, true
}

// takeInto appends the cell's records to into and empties it.
func (c *cell) takeInto(into []timedRecord) []timedRecord {
	c.mu.Lock()
	defer c.mu.Unlock()
	into = append(into, c.p.recs...)
	c.p.reset()
	c.has.Store(false)
	return into
}
