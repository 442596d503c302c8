package router

import "slices"

// A view's per-worker arrays are cut into chunks of chunkLen entries, so a
// change to a few workers copies the chunks they sit in and the chunk
// directory, not the whole fleet: at 10,000 workers a verdict flip copies
// one chunk of 64 entries and a directory of 157 pointers.
const (
	chunkShift = 6
	chunkLen   = 1 << chunkShift
	chunkMask  = chunkLen - 1
)

// chunked is an array of n entries in chunks (the last one's tail unused).
// Once a view holding it is published it is immutable; patch makes a
// copy-on-write successor. A chunk is a fixed-size array behind a pointer,
// so an access is one bounds check and one load more than a flat slice's.
type chunked[T any] struct {
	c []*[chunkLen]T
	n int
}

// newChunked allocates the chunks of n entries in one backing array.
func newChunked[T any](n int) chunked[T] {
	backing := make([][chunkLen]T, (n+chunkMask)>>chunkShift)
	c := make([]*[chunkLen]T, len(backing))
	for k := range backing {
		c[k] = &backing[k]
	}
	return chunked[T]{c: c, n: n}
}

// chunkedOf copies s.
func chunkedOf[T any](s []T) chunked[T] {
	c := newChunked[T](len(s))
	for k := range c.c {
		copy(c.c[k][:], s[k<<chunkShift:])
	}
	return c
}

// at is entry i. Entries of a published array must not be written.
func (c chunked[T]) at(i int32) *T { return &c.c[i>>chunkShift][i&chunkMask] }

// flat copies the entries into one slice.
func (c chunked[T]) flat() []T {
	out := make([]T, 0, c.n)
	for k, ch := range c.c {
		out = append(out, ch[:min(chunkLen, c.n-k<<chunkShift)]...)
	}
	return out
}

// cow builds a successor of a chunked array: it shares every chunk until
// one of its entries is set, then that chunk alone is copied.
type cow[T any] struct {
	chunked[T]
	own map[int32]bool // chunks copied already
}

func newCow[T any](from chunked[T]) *cow[T] {
	return &cow[T]{chunked: chunked[T]{c: slices.Clone(from.c), n: from.n}, own: map[int32]bool{}}
}

// set writes entry i, copying its chunk first if still shared.
func (w *cow[T]) set(i int32, v T) {
	k := i >> chunkShift
	if !w.own[k] {
		ch := *w.c[k]
		w.c[k] = &ch
		w.own[k] = true
	}
	w.c[k][i&chunkMask] = v
}
