package registry

import (
	"maps"
	"sync/atomic"
)

// latest is every worker's current record by id, read without a lock
// (Registry.Get: three reads per agent record, from every agent stream on
// every core; a reader lock's counter, written by each read, moved between
// the cores on every one). Each worker has a cell that the writer stores
// its record in as each commit lands; the maps from ids to cells are
// immutable once published and change only when a worker is added or
// removed: such a change copies the small overlay, and folds it into a new
// base once it has grown to about the square root of the fleet, so a fleet
// registered one worker at a time costs a few hundred map writes each, not
// a copy of the whole map.
type latest struct {
	maps atomic.Pointer[cellMaps]
}

// cellMaps is one published generation of the id → cell maps.
type cellMaps struct {
	base    map[string]*cell // never nil cells
	overlay map[string]*cell // changes since base; a nil cell: removed
}

// cell holds a worker's current record.
type cell struct{ w atomic.Pointer[Worker] }

func newLatest() *latest {
	l := &latest{}
	l.maps.Store(&cellMaps{base: map[string]*cell{}, overlay: map[string]*cell{}})
	return l
}

// find returns id's cell, or nil.
func (m *cellMaps) find(id string) *cell {
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
			next.overlay[id] = nil
			continue
		}
		c = &cell{}
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
		next = &cellMaps{base: base, overlay: map[string]*cell{}}
	}
	l.maps.Store(next)
}
