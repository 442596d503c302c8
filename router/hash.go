package router

import (
	"cmp"
	"encoding/binary"
	"math/bits"
	"slices"
)

// Hashes here must agree across router replicas (a key should land on the same
// worker whichever router serves it), so they are deterministic, unlike maphash.

const (
	hashSeed  = 0x9e3779b97f4a7c15
	hashPrime = 0xff51afd7ed558ccd
)

func mix(h uint64) uint64 {
	h ^= h >> 33
	h *= hashPrime
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// hashBytes extends h with b, eight bytes at a time.
func hashBytes(h uint64, b []byte) uint64 {
	n := uint64(len(b))
	for len(b) >= 8 {
		h = (h ^ binary.LittleEndian.Uint64(b)) * hashPrime
		h ^= h >> 29
		b = b[8:]
	}
	for _, c := range b {
		h = (h ^ uint64(c)) * hashPrime
	}
	return mix(h ^ n)
}

func hashString(s string) uint64 {
	h, n := uint64(hashSeed), uint64(len(s))
	for len(s) >= 8 {
		w := uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
			uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
		h = (h ^ w) * hashPrime
		h ^= h >> 29
		s = s[8:]
	}
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * hashPrime
	}
	return mix(h ^ n)
}

// ringReplicas is the number of points each worker owns on a hash ring.
const ringReplicas = 64

type ringPoint struct {
	hash uint64
	slot uint32
}

// ring is a consistent-hash ring over worker state slots. It depends only on
// membership and the members' URLs, so it is shared by successive views
// while those are unchanged.
type ring struct {
	members []uint32 // the slots it was built from, in pool order
	bases   []uint64 // hashString of each member's URL, aligned with members
	points  []ringPoint
}

// newRing places ringReplicas points per member. Points derive from the
// worker URL (bases) so every router builds the same ring; equal hashes
// (two workers on one URL) are ordered by slot, so the ring is the same
// whatever order its members came in.
func newRing(slots []uint32, bases []uint64) *ring {
	point := func(i int) ringPoint {
		m := i / ringReplicas
		return ringPoint{hash: mix(bases[m] + uint64(i%ringReplicas)*hashSeed), slot: slots[m]}
	}
	return &ring{members: slots, bases: bases, points: sortedPoints(len(slots)*ringReplicas, point)}
}

// sortedPoints is the n points point(0..n-1) ordered by hash, then slot. A
// 10,000-worker ring is 640,000 points: a comparison sort of them was most
// of a router's join (about 100 ms of a 134 ms first snapshot). The hashes
// are mixed, so spread evenly: each point goes straight to its bucket by
// the hash's top bits (a few points a bucket; point is called twice, to
// count and to place), and each bucket is sorted alone. Points sharing a
// hash (members on one URL) share a bucket, which a comparison sort still
// orders.
func sortedPoints(n int, point func(int) ringPoint) []ringPoint {
	out := make([]ringPoint, n)
	if n < 1024 {
		for i := range out {
			out[i] = point(i)
		}
		slices.SortFunc(out, comparePoints)
		return out
	}
	top := min(bits.Len(uint(n))-2, 20) // about 2-4 points a bucket
	shift := 64 - top
	starts := make([]int32, 1<<top+1)
	for i := range n {
		starts[point(i).hash>>shift+1]++
	}
	for b := 1; b < len(starts); b++ {
		starts[b] += starts[b-1]
	}
	next := slices.Clone(starts[:len(starts)-1])
	for i := range n {
		p := point(i)
		b := p.hash >> shift
		out[next[b]] = p
		next[b]++
	}
	for b := range len(starts) - 1 {
		bucket := out[starts[b]:starts[b+1]]
		if len(bucket) > 12 {
			slices.SortFunc(bucket, comparePoints)
			continue
		}
		for i := 1; i < len(bucket); i++ { // insertion sort
			for k := i; k > 0 && comparePoints(bucket[k-1], bucket[k]) > 0; k-- {
				bucket[k-1], bucket[k] = bucket[k], bucket[k-1]
			}
		}
	}
	return out
}

// comparePoints orders by hash, then slot.
func comparePoints(a, b ringPoint) int {
	if c := cmp.Compare(a.hash, b.hash); c != 0 {
		return c
	}
	return cmp.Compare(a.slot, b.slot)
}

// search returns the position of the first point at or after h (wrapping).
func (r *ring) search(h uint64) int {
	lo, hi := 0, len(r.points)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if r.points[m].hash < h {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo == len(r.points) {
		return 0
	}
	return lo
}
