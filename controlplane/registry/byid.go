package registry

// byID is a transaction's entries keyed by worker id, in the order first
// added: searched in place while few (most transactions write one worker),
// indexed by a map once many (a flush writes a thousand). The registry
// reuses one across its transactions, so a flush does not grow a slice and
// a map afresh.
type byID[T any] struct {
	ids   []string
	vals  []T
	index map[string]int // kept across resets; holds every entry once there are indexAt
}

// indexAt is the size at which byID indexes its entries.
const indexAt = 16

// keepAt bounds the room a reset keeps: a transaction over the whole fleet
// (a rebuild) does not leave its bookkeeping's size behind.
const keepAt = 4096

// find returns id's place, if it has one.
func (b *byID[T]) find(id string) (int, bool) {
	if len(b.ids) >= indexAt {
		i, ok := b.index[id]
		return i, ok
	}
	for i, x := range b.ids {
		if x == id {
			return i, true
		}
	}
	return -1, false
}

// add appends id (not yet present) with v.
func (b *byID[T]) add(id string, v T) {
	b.ids = append(b.ids, id)
	b.vals = append(b.vals, v)
	switch {
	case len(b.ids) > indexAt:
		b.index[id] = len(b.ids) - 1
	case len(b.ids) == indexAt:
		if b.index == nil {
			b.index = make(map[string]int, 2*indexAt)
		}
		for i, x := range b.ids {
			b.index[x] = i
		}
	}
}

// reset empties b for the next transaction, dropping what it refers to.
func (b *byID[T]) reset() {
	if cap(b.ids) > keepAt {
		*b = byID[T]{}
		return
	}
	if len(b.ids) >= indexAt {
		clear(b.index)
	}
	clear(b.ids)
	clear(b.vals)
	b.ids, b.vals = b.ids[:0], b.vals[:0]
}
