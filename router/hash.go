package router

import (
	"encoding/binary"
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
	r := &ring{members: slots, bases: bases, points: make([]ringPoint, 0, len(slots)*ringReplicas)}
	for i, slot := range slots {
		for k := uint64(0); k < ringReplicas; k++ {
			r.points = append(r.points, ringPoint{hash: mix(bases[i] + k*hashSeed), slot: slot})
		}
	}
	slices.SortFunc(r.points, func(a, b ringPoint) int {
		switch {
		case a.hash != b.hash:
			if a.hash < b.hash {
				return -1
			}
			return 1
		case a.slot != b.slot:
			if a.slot < b.slot {
				return -1
			}
			return 1
		}
		return 0
	})
	return r
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
