package registry

import (
	"slices"
	"strings"
)

// tree is the workers, ordered by id: immutable once published, copied on
// write by a transaction leaf by leaf. A flush stores every reporting
// worker four times a second, and go-memdb's radix tree copied each
// insert's path from its root (about 2 µs and several allocations a
// worker); here a transaction copies the leaf list and each leaf once.
type tree struct {
	leaves []*leaf // ordered, none empty
	n      int     // workers
	gen    uint64  // the transaction that made this copy and may write it
}

// leaf is a run of at most maxLeaf workers, ordered by id.
type leaf struct {
	ws  []*Worker
	gen uint64 // as tree.gen
}

// maxLeaf bounds a leaf: a transaction that writes one worker copies its
// leaf and the leaf list (about 80 leaves of 64-128 at 10,000 workers).
const maxLeaf = 128

// get returns the worker with id, or nil.
func (t *tree) get(id string) *Worker {
	li, i, found := t.find(id)
	if !found {
		return nil
	}
	return t.leaves[li].ws[i]
}

// find returns the leaf that holds id or would take it, and id's place in
// it.
func (t *tree) find(id string) (li, i int, found bool) {
	if len(t.leaves) == 0 {
		return 0, 0, false
	}
	// The first leaf whose last id is >= id; past the end, the last leaf.
	li, _ = slices.BinarySearchFunc(t.leaves, id, func(l *leaf, id string) int {
		return strings.Compare(l.ws[len(l.ws)-1].ID, id)
	})
	li = min(li, len(t.leaves)-1)
	i, found = slices.BinarySearchFunc(t.leaves[li].ws, id, func(w *Worker, id string) int {
		return strings.Compare(w.ID, id)
	})
	return li, i, found
}

// list returns every worker, ordered by id.
func (t *tree) list() []*Worker {
	out := make([]*Worker, 0, t.n)
	for _, l := range t.leaves {
		out = append(out, l.ws...)
	}
	return out
}

// writable returns t, or a copy of it that gen may write.
func (t *tree) writable(gen uint64) *tree {
	if t.gen == gen {
		return t
	}
	return &tree{leaves: slices.Clone(t.leaves), n: t.n, gen: gen}
}

// leafAt returns leaf li, copied first unless gen made it (t is gen's).
func (t *tree) leafAt(li int, gen uint64) *leaf {
	l := t.leaves[li]
	if l.gen != gen {
		l = &leaf{ws: slices.Grow(slices.Clone(l.ws), 1), gen: gen}
		t.leaves[li] = l
	}
	return l
}

// put stores w (replacing the worker with its id) in t, which gen may
// write.
func (t *tree) put(w *Worker, gen uint64) {
	li, i, found := t.find(w.ID)
	if len(t.leaves) == 0 {
		t.leaves = append(t.leaves, &leaf{ws: []*Worker{w}, gen: gen})
		t.n++
		return
	}
	l := t.leafAt(li, gen)
	if found {
		l.ws[i] = w
		return
	}
	l.ws = slices.Insert(l.ws, i, w)
	t.n++
	if len(l.ws) > maxLeaf {
		half := len(l.ws) / 2
		right := &leaf{ws: slices.Clone(l.ws[half:]), gen: gen}
		clear(l.ws[half:]) // the records moved right are not kept alive here
		l.ws = slices.Clip(l.ws[:half])
		t.leaves = slices.Insert(t.leaves, li+1, right)
	}
}

// del removes the worker with id from t, which gen may write, and reports
// whether there was one.
func (t *tree) del(id string, gen uint64) bool {
	li, i, found := t.find(id)
	if !found {
		return false
	}
	l := t.leafAt(li, gen)
	l.ws = slices.Delete(l.ws, i, i+1)
	t.n--
	if len(l.ws) == 0 {
		t.leaves = slices.Delete(t.leaves, li, li+1)
	}
	return true
}
