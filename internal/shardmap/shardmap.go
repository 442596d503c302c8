// Package shardmap is a concurrent map from strings to values, in shards of
// sync.Map: sync.Map finds without a lock, but its LoadOrStore locks a node
// of its trie, at first the root for every key, so a fleet's first reports
// (10,000 workers' state made at once, from every agent stream) would queue
// there. Spread over shards by a seeded hash, they do not.
//
// It knows nothing of workers: it is a map.
package shardmap

import (
	"hash/maphash"
	"sync"
)

// shards is how many sync.Maps a Map spreads its keys over.
const shards = 64

// Map is a concurrent map from strings to V. Make one with New.
type Map[V any] struct {
	seed   maphash.Seed
	shards [shards]sync.Map
}

// New returns an empty map.
func New[V any]() *Map[V] { return &Map[V]{seed: maphash.MakeSeed()} }

func (m *Map[V]) shard(key string) *sync.Map {
	return &m.shards[maphash.String(m.seed, key)%shards]
}

// Load returns key's value, and whether it has one.
func (m *Map[V]) Load(key string) (V, bool) {
	v, ok := m.shard(key).Load(key)
	if !ok {
		var zero V
		return zero, false
	}
	return v.(V), true
}

// LoadOrStore returns key's value if it has one (loaded true), else stores
// and returns v.
func (m *Map[V]) LoadOrStore(key string, v V) (actual V, loaded bool) {
	a, loaded := m.shard(key).LoadOrStore(key, v)
	return a.(V), loaded
}

// CompareAndDelete deletes key if its value is old (V must be comparable
// at run time, as sync.Map's), and reports whether it did.
func (m *Map[V]) CompareAndDelete(key string, old V) bool {
	return m.shard(key).CompareAndDelete(key, old)
}

// Range calls f for every key and value, shard by shard, while f returns
// true; as sync.Map's Range, it sees each key once, whatever changes
// meanwhile.
func (m *Map[V]) Range(f func(key string, v V) bool) {
	for i := range m.shards {
		more := true
		m.shards[i].Range(func(k, v any) bool {
			more = f(k.(string), v.(V))
			return more
		})
		if !more {
			return
		}
	}
}
