package evidence

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// cell is one worker's inbox: the evidence that reached the control plane
// and is not stored yet. Its lock is a leaf: its methods take no other
// lock, call no callback and never reach the registry. One lock per worker:
// agent streams behind one lock would convoy behind any delayed holder.
type cell struct {
	lock     sync.Mutex
	load     *smgv1.EngineLoad // the latest report; nil: none
	noReport bool              // a no-report older than load
	refresh  bool              // the engine confirmed the stored load: move its revision
	rec      timedRecord       // the newest pushed record (each sets what the last did)
	recorded bool
	spare    *smgv1.EngineLoad // made by the flush for the next report to copy into
	// scratch is base (the stored record the pending evidence was last
	// judged against; nil: none) moved by it: while base is stored, an
	// observation moves scratch alone, with no copy.
	base    *registry.Worker
	scratch registry.Worker
	// dead: the flush dropped the cell (its worker left the registry or
	// Ready); whoever holds it looks again. Read without the lock.
	dead atomic.Bool
}

// timedRecord is a pushed record not yet stored.
type timedRecord struct {
	rec judge.Record
	at  time.Time
}

// predictLocked returns scratch: w (the stored record) moved by everything
// pending, made again only when w is not its base.
func (c *cell) predictLocked(w *registry.Worker, r *judge.Rules) *registry.Worker {
	if c.base != w {
		c.scratch = *w
		if c.load != nil {
			setLoad(&c.scratch, c.load)
		}
		if c.recorded {
			applyPushed(&c.scratch.Evidence, c.rec, r)
		}
		c.base = w
	}
	return &c.scratch
}

// pend makes load (nil: none; copied into the cell's memory when copied)
// and rec (nil: none) pending, and reports whether they leave w's verdicts
// as they are. A report after a no-report never stands: it ends the
// fail-open spell. dead: the cell was dropped, nothing pends.
func (c *cell) pend(w *registry.Worker, load *smgv1.EngineLoad, copied bool, waiting int64, usage float64, rec *timedRecord, r *judge.Rules) (stands, dead bool) {
	c.lock.Lock()
	defer c.lock.Unlock()
	if c.dead.Load() {
		return false, true
	}
	stands = true
	if load != nil {
		if copied {
			dst := c.load
			if dst == nil {
				dst, c.spare = c.spare, nil
			}
			load = CopyLoad(dst, load)
		}
		// The signals from the ranks, over the aggregates the sender filled in.
		load.WaitingRequests, load.TokenUsage = int32(min(waiting, math.MaxInt32)), usage
		c.load, c.refresh = load, false
		if c.base == w {
			c.scratch.Load = load // the rest of scratch is as it was
		}
		stands = !c.noReport && !w.Evidence.NoReport
	}
	s := c.predictLocked(w, r)
	if rec != nil {
		c.rec, c.recorded = *rec, true
		applyPushed(&s.Evidence, *rec, r)
	}
	return stands && registry.Stands(w, s), false
}

// pendNoReport makes "no report" pending, over any load or refresh.
func (c *cell) pendNoReport() (dead bool) {
	c.lock.Lock()
	defer c.lock.Unlock()
	c.load, c.refresh, c.noReport, c.base = nil, false, true, nil
	return c.dead.Load()
}

// pendRefresh asks the next store to move the load revision, unless a
// pending load does.
func (c *cell) pendRefresh() (dead bool) {
	c.lock.Lock()
	defer c.lock.Unlock()
	if c.load == nil {
		c.refresh = true
	}
	return c.dead.Load()
}

// pending reports whether the cell holds anything to store.
func (c *cell) pending() bool {
	c.lock.Lock()
	defer c.lock.Unlock()
	return c.load != nil || c.noReport || c.refresh || c.recorded
}

// stands reports whether what the cell holds (if anything) leaves w's
// verdicts as they are.
func (c *cell) stands(w *registry.Worker, r *judge.Rules) bool {
	c.lock.Lock()
	defer c.lock.Unlock()
	if c.load == nil && !c.noReport && !c.refresh && !c.recorded {
		return true
	}
	return !c.noReport && registry.Stands(w, c.predictLocked(w, r))
}

// takeOnto moves what the cell holds onto c, a clone of w (the stored
// record), and empties it, reporting whether c moved and whether the cell
// wants a spare. Only a registry transaction calls it (the lock order).
func (cl *cell) takeOnto(w, c *registry.Worker, r *judge.Rules) (moved, wantsSpare bool) {
	cl.lock.Lock()
	defer cl.lock.Unlock()
	if cl.noReport && !c.Evidence.NoReport {
		c.Evidence.NoReport, moved = true, true
	}
	switch {
	case cl.load != nil:
		setLoad(c, cl.load)
		moved, wantsSpare = true, cl.spare == nil
	case cl.refresh && c.Load != nil && !c.Evidence.NoReport: // a no-report has no load to confirm
		c.LoadRevision++
		moved = true
	}
	if cl.recorded && c.Ready() { // the rules judge Ready workers only
		if cl.base == w { // the prediction did the work: a record moves these two
			c.Evidence.Live, c.Evidence.PushedAt = cl.scratch.Evidence.Live, cl.scratch.Evidence.PushedAt
		} else {
			applyPushed(&c.Evidence, cl.rec, r)
		}
		moved = true
	}
	cl.clearLocked()
	return moved, wantsSpare
}

// clearLocked empties the cell, keeping its spare.
func (c *cell) clearLocked() {
	c.load, c.noReport, c.refresh, c.rec, c.recorded = nil, false, false, timedRecord{}, false
	c.base, c.scratch = nil, registry.Worker{}
}

// drop empties the cell (Rebuild: what it held is no one's signal now).
func (c *cell) drop() {
	c.lock.Lock()
	defer c.lock.Unlock()
	c.clearLocked()
}

// giveSpare hands the cell a load for its next report unless it has one
// (spare or pending), reporting whether it took it.
func (c *cell) giveSpare(l *smgv1.EngineLoad) bool {
	c.lock.Lock()
	defer c.lock.Unlock()
	if c.spare != nil || c.load != nil {
		return false
	}
	c.spare = l
	return true
}

// kill marks the cell dropped unless it holds evidence, and reports whether
// it did.
func (c *cell) kill() bool {
	c.lock.Lock()
	defer c.lock.Unlock()
	if c.load != nil || c.noReport || c.refresh || c.recorded {
		return false
	}
	c.dead.Store(true)
	return true
}
