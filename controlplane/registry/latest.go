package registry

import (
	"maps"
	"sync/atomic"
)

// latest is every worker's current record by id, read without a lock
// (Registry.Get and Handle: the agent records' path, from every core; a reader
// lock's counter moved between the cores on every one). Each worker has a
// handle the writer stores its record in; the id → handle maps are
// immutable once published. Adding or removing a worker copies the small
// overlay, folded into a new base once it reaches about the square root of
// the fleet, so a fleet registered one at a time is not a whole-map copy each.
type latest struct {
	maps atomic.Pointer[cellMaps]
}

// cellMaps is one published generation of the id → handle maps.
type cellMaps struct {
	base    map[string]*Handle // never nil handles
	overlay map[string]*Handle // changes since base; a nil handle: removed
}

// Handle holds one worker's current record (Registry.Handle): a hot path
// looks a worker up once and reads it through its handle after. It reads
// nil once the worker is removed; registered again, the worker has another.
type Handle struct{ w atomic.Pointer[Worker] }

// Get returns the worker's current record, or nil once it is removed.
func (h *Handle) Get() *Worker { return h.w.Load() }

func newLatest() *latest {
	l := &latest{}
	l.maps.Store(&cellMaps{base: map[string]*Handle{}, overlay: map[string]*Handle{}})
	return l
}

// find returns id's handle, or nil.
func (m *cellMaps) find(id string) *Handle {
	if c, ok := m.overlay[id]; ok {
		return c
	}
	return m.base[id]
}

// get returns id's current record, or nil.
func (l *latest) get(id string) *Worker {
	if c := l.maps.Load().find(id); c != nil {
		return c.w.Load()
	}
	return nil
}

// set stores the records a commit wrote (ws[i] is ids[i]'s; nil: removed).
// Only the writer calls it, in commit order.
func (l *latest) set(ids []string, ws []*Worker) {
	m := l.maps.Load()
	var next *cellMaps
	for i, id := range ids {
		w := ws[i]
		c := m.find(id)
		switch {
		case c != nil && w != nil:
			c.w.Store(w)
			continue
		case c == nil && w == nil:
			continue
		}
		if next == nil {
			next = &cellMaps{base: m.base, overlay: maps.Clone(m.overlay)}
		}
		if w == nil {
			c.w.Store(nil) // its holders see it go
			next.overlay[id] = nil
			continue
		}
		c = &Handle{}
		c.w.Store(w)
		next.overlay[id] = c
	}
	if next == nil {
		return
	}
	if n := len(next.overlay); n*n > len(next.base) && n > 16 {
		base := maps.Clone(next.base)
		for id, c := range next.overlay {
			if c == nil {
				delete(base, id)
			} else {
				base[id] = c
			}
		}
		next = &cellMaps{base: base, overlay: map[string]*Handle{}}
	}
	l.maps.Store(next)
}
