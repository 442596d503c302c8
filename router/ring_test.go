package router

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// The bucket sort gives the ring the comparison sort gave: points by hash,
// equal hashes (members on one URL) by slot, whatever the members' order.
func TestRingSortEqualsComparisonSort(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 60 {
		n := []int{1, 3, 4, 5, 17, 100, 1000}[trial%7]
		slots := make([]uint32, n)
		bases := make([]uint64, n)
		for i := range slots {
			slots[i] = uint32(i)
			switch rng.IntN(4) {
			case 0: // shares a URL with an earlier member
				if i > 0 {
					bases[i] = bases[rng.IntN(i)]
					continue
				}
				fallthrough
			default:
				bases[i] = rng.Uint64()
			}
			if trial%5 == 0 { // hashes alike in their low bits
				bases[i] &^= 0xffff
			}
		}
		rng.Shuffle(n, func(i, j int) { slots[i], slots[j], bases[i], bases[j] = slots[j], slots[i], bases[j], bases[i] })
		got := newRing(slots, bases).points
		want := slices.Clone(got)
		rng.Shuffle(len(want), func(i, j int) { want[i], want[j] = want[j], want[i] })
		slices.SortFunc(want, comparePoints)
		if !slices.Equal(got, want) {
			t.Fatalf("trial %d, %d members: the ring's points differ from the comparison sort's", trial, n)
		}
		if len(got) != n*ringReplicas {
			t.Fatalf("trial %d: %d points for %d members", trial, len(got), n)
		}
	}
}

// Many points sharing few hashes (a bucket of many) come out in (hash,
// slot) order.
func TestRingSortTiesBySlot(t *testing.T) {
	const n = 5000
	points := sortedPoints(n, func(i int) ringPoint { return ringPoint{hash: uint64(i%7) << 60, slot: uint32(n - i)} })
	if len(points) != n || !slices.IsSortedFunc(points, comparePoints) {
		t.Fatal("points not in (hash, slot) order")
	}
}

// BenchmarkRing10k is a 10,000-member ring built (a router's first
// snapshot builds one), and the comparison sort it used to take.
func BenchmarkRing10k(b *testing.B) {
	const n = 10000
	slots := make([]uint32, n)
	bases := make([]uint64, n)
	for i := range slots {
		slots[i], bases[i] = uint32(i), hashString(fmt.Sprintf("http://10.0.%d.%d:8000", i/250, i%250))
	}
	b.Run("bucket", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			newRing(slots, bases)
		}
	})
	b.Run("comparison", func(b *testing.B) {
		points := newRing(slots, bases).points
		shuffled := slices.Clone(points)
		rand.New(rand.NewPCG(1, 2)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		for b.Loop() {
			copy(points, shuffled)
			slices.SortFunc(points, comparePoints)
		}
	})
}
