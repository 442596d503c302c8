package evidence

import (
	"time"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// ObserveAll is Observe of each record in order; failed, when set, hears
// a load's error.
func (in *Inbox) ObserveAll(obs []Observed, now time.Time, failed func(i int, err error)) {
	for i := range obs {
		if err := in.Observe(&obs[i], now); err != nil && failed != nil {
			failed(i, err)
		}
	}
}

// BetweenChunks sets a hook run between a flush's transactions.
func BetweenChunks(in *Inbox, f func()) { in.betweenChunks = f }

// InFlush sets a hook run inside each flush transaction, after its cells
// are taken.
func InFlush(in *Inbox, f func()) { in.inFlush = f }

// Unlocked reports whether the lock of id's cell is free now (true when it
// has none).
func Unlocked(in *Inbox, id string) bool {
	c := in.cell(id)
	if c == nil {
		return true
	}
	if !c.lock.TryLock() {
		return false
	}
	c.lock.Unlock()
	return true
}

// Cells is how many workers have a cell kept.
func Cells(in *Inbox) int {
	n := 0
	in.cells.Range(func(string, *Slot) bool { n++; return true })
	return n
}

// PendingLoad returns id's pending load (nil: none).
func PendingLoad(in *Inbox, id string) *smgv1.EngineLoad {
	c := in.cell(id)
	if c == nil {
		return nil
	}
	c.lock.Lock()
	defer c.lock.Unlock()
	return c.load
}
