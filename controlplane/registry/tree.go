package registry

import (
	"slices"
	"strings"
)

// tree is a table of records ordered by key (workers, URLs, jobs): immutable
// once published, copied on write by a transaction leaf by leaf. A flush
// stores every reporting worker four times a second, and a radix tree copied
// each insert's path from its root (about 2 µs and several allocations a
// worker); here a transaction copies the leaf list and each leaf once.
type tree[T keyed] struct {
	leaves []*leaf[T] // ordered, none empty
	n      int        // records
	gen    uint64     // the transaction that made this copy and may write it
}

// leaf is a run of at most maxLeaf records, ordered by key.
type leaf[T keyed] struct {
	vs  []T
	gen uint64 // as tree.gen
}

// keyed is what a tree holds: records that know their key.
type keyed interface{ key() string }

func (w *Worker) key() string   { return w.ID }
func (j *Job) key() string      { return j.WorkerID }
func (u *urlEntry) key() string { return u.url }

// urlEntry maps a worker URL to its worker.
type urlEntry struct{ url, id string }

// maxLeaf bounds a leaf: a transaction that writes one record copies its
// leaf and the leaf list (about 80 leaves of 64-128 at 10,000 workers).
const maxLeaf = 128

// get returns the record with key, or the zero value (nil).
func (t *tree[T]) get(key string) T {
	li, i, found := t.find(key)
	if !found {
		var zero T
		return zero
	}
	return t.leaves[li].vs[i]
}

// find returns the leaf that holds key or would take it, and key's place in
// it.
func (t *tree[T]) find(key string) (li, i int, found bool) {
	if len(t.leaves) == 0 {
		return 0, 0, false
	}
	// The first leaf whose last key is >= key; past the end, the last leaf.
	li, _ = slices.BinarySearchFunc(t.leaves, key, func(l *leaf[T], key string) int {
		return strings.Compare(l.vs[len(l.vs)-1].key(), key)
	})
	li = min(li, len(t.leaves)-1)
	i, found = slices.BinarySearchFunc(t.leaves[li].vs, key, func(v T, key string) int {
		return strings.Compare(v.key(), key)
	})
	return li, i, found
}

// list returns every record, ordered by key (nil when none).
func (t *tree[T]) list() []T {
	out := slices.Grow([]T(nil), t.n)
	for _, l := range t.leaves {
		out = append(out, l.vs...)
	}
	return out
}

// writable returns t, or a copy of it that gen may write.
func (t *tree[T]) writable(gen uint64) *tree[T] {
	if t.gen == gen {
		return t
	}
	return &tree[T]{leaves: slices.Clone(t.leaves), n: t.n, gen: gen}
}

// leafAt returns leaf li, copied first unless gen made it (t is gen's).
func (t *tree[T]) leafAt(li int, gen uint64) *leaf[T] {
	l := t.leaves[li]
	if l.gen != gen {
		l = &leaf[T]{vs: slices.Grow(slices.Clone(l.vs), 1), gen: gen}
		t.leaves[li] = l
	}
	return l
}

// put stores v (replacing the record with its key) in t or, unless gen
// made t, a copy of it, and returns the tree written.
func (t *tree[T]) put(v T, gen uint64) *tree[T] {
	t = t.writable(gen)
	li, i, found := t.find(v.key())
	if len(t.leaves) == 0 {
		t.leaves = append(t.leaves, &leaf[T]{vs: []T{v}, gen: gen})
		t.n++
		return t
	}
	l := t.leafAt(li, gen)
	if found {
		l.vs[i] = v
		return t
	}
	l.vs = slices.Insert(l.vs, i, v)
	t.n++
	if len(l.vs) > maxLeaf {
		half := len(l.vs) / 2
		right := &leaf[T]{vs: slices.Clone(l.vs[half:]), gen: gen}
		clear(l.vs[half:]) // the records moved right are not kept alive here
		l.vs = slices.Clip(l.vs[:half])
		t.leaves = slices.Insert(t.leaves, li+1, right)
	}
	return t
}

// del removes the record with key from t as put writes it and returns the
// tree written (t itself when there was none).
func (t *tree[T]) del(key string, gen uint64) *tree[T] {
	li, i, found := t.find(key)
	if !found {
		return t
	}
	t = t.writable(gen) // the same leaves, in the same places
	l := t.leafAt(li, gen)
	l.vs = slices.Delete(l.vs, i, i+1)
	t.n--
	if len(l.vs) == 0 {
		t.leaves = slices.Delete(t.leaves, li, li+1)
	}
	return t
}
