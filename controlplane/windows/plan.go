// Package windows splits each worker's running window into shares, one per
// router, so that the fleet never holds more requests in flight on a worker
// than its window, however many routers feed it. One allocator serves PD
// decode windows and, with --worker-admission-window, the running window of
// every worker (from the spec, the engine's report, or learned here).
//
// Plan is the pure rule; Allocator runs it against the registry, tracks
// what every router may still hold, and writes shares (the watch stream
// carries them to routers).
//
// The guarantee: the sum over routers of the rooms each may occupy never
// exceeds the window. A router occupies at most the largest share it has
// been granted and not yet acknowledged giving up, or what it reported in
// flight after acknowledging a lower share (a router over its share admits
// nothing until it is back under). Capacity taken from one router is granted
// to another only once the first has applied its lower share and reported
// what it still holds. Two cases fall outside it: a window that shrinks
// (shares shrink at once, requests in flight finish), and a router cut off
// from the control plane past the stale bound, which keeps its last share
// while the control plane hands that share to others.
//
// It owns the window shares and the routers' acknowledgements; it writes
// shares to the registry and never touches loads or vetoes.
package windows

import (
	"cmp"
	"slices"
)

// RouterInput is one router's standing on one decode worker.
type RouterInput struct {
	ID string
	// Demand is rooms in flight plus rooms waiting in the router's gate.
	Demand int64
	// Waiting is the part of Demand still waiting; ties go to the most waiting.
	Waiting int64
	// WaitingByClass splits Waiting by priority class, highest first (empty:
	// all of Waiting is of the default class). Higher classes are served
	// first, across routers.
	WaitingByClass []int64
	// Share is the share granted now.
	Share int64
	// Held bounds the rooms the router may occupy now (>= Share): a share it
	// has not yet acknowledged giving up, or its last in-flight count.
	Held int64
}

// Plan returns the next share of each router (aligned with routers) for a
// window of size window. Demand is met max-min fairly; room nobody asks for
// is spread evenly as a floor, so an idle router can start a burst without a
// round trip. Shares shrink at once; they grow only out of capacity no
// router may still hold, so sum(max(share, held)) never exceeds the window
// (given it did not before).
func Plan(window int64, routers []RouterInput) []int64 {
	n := len(routers)
	next := make([]int64, n)
	if n == 0 || window <= 0 {
		return next
	}
	target := fairTargets(window, routers)
	var reserved int64
	for i, r := range routers {
		next[i] = min(r.Share, target[i])
		reserved += max(next[i], r.Held)
	}
	free := max(0, window-reserved)
	// Grow the routers that wait most first, then by the largest shortfall.
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		if c := compareWaiting(routers[a], routers[b]); c != 0 {
			return c
		}
		return cmp.Compare(target[b]-next[b], target[a]-next[a])
	})
	for _, i := range order {
		want := target[i] - next[i]
		if want <= 0 {
			continue
		}
		// Growth up to what the router already holds costs nothing.
		slack := max(0, routers[i].Held-next[i])
		give := min(want, slack+free)
		free -= max(0, give-slack)
		next[i] += give
	}
	return next
}

// Classes in a demand vector, highest first; unclassified waiting and rooms
// in flight are of classDefault (an interactive request waiting on one
// router comes before another's running bulk; what runs is never taken
// back, its share only stops growing).
const (
	numClasses   = 4
	classDefault = 2
)

// classWaiting returns r's waiting rooms by class.
func classWaiting(r RouterInput) (out [numClasses]int64) {
	if len(r.WaitingByClass) == 0 {
		out[classDefault] = r.Waiting
		return out
	}
	for c, n := range r.WaitingByClass {
		out[min(c, numClasses-1)] += max(0, n)
	}
	return out
}

// compareClasses orders routers by the highest class they wait in (negative:
// a first), whatever the amounts.
func compareClasses(a, b RouterInput) int {
	ca, cb := classWaiting(a), classWaiting(b)
	for c := range numClasses {
		if x := cmp.Compare(min(cb[c], 1), min(ca[c], 1)); x != 0 {
			return x
		}
	}
	return 0
}

// compareWaiting orders routers by who waits in the highest class first,
// then by the most waiting (negative: a first).
func compareWaiting(a, b RouterInput) int {
	ca, cb := classWaiting(a), classWaiting(b)
	for c := range numClasses {
		if x := cmp.Compare(cb[c], ca[c]); x != 0 {
			return x
		}
	}
	return cmp.Compare(b.Waiting, a.Waiting)
}

// fairTargets is the max-min fair split of window over demand, class by
// class (each class's demand met across routers before the next class's),
// with the rest spread evenly (lowest ids first for the remainder).
func fairTargets(window int64, routers []RouterInput) []int64 {
	n := len(routers)
	t := make([]int64, n)
	caps := make([]int64, n)
	left := window
	for c := 0; c < numClasses && left > 0; c++ {
		for i, r := range routers {
			caps[i] += classWaiting(r)[c]
			if c == classDefault {
				caps[i] += max(0, r.Demand-r.Waiting) // in flight
			}
		}
		left = fill(t, caps, left, routers)
	}
	if left > 0 {
		// Nobody asks for the rest: an even floor for everyone.
		ids := make([]int, n)
		for i := range ids {
			ids[i] = i
		}
		slices.SortFunc(ids, func(a, b int) int { return cmp.Compare(routers[a].ID, routers[b].ID) })
		each, extra := left/int64(n), left%int64(n)
		for k, i := range ids {
			t[i] += each
			if int64(k) < extra {
				t[i]++
			}
		}
	}
	return t
}

// fill raises t toward caps max-min fairly out of left rooms and returns
// what is left.
func fill(t, caps []int64, left int64, routers []RouterInput) int64 {
	for left > 0 {
		var unmet []int
		for i := range t {
			if caps[i] > t[i] {
				unmet = append(unmet, i)
			}
		}
		if len(unmet) == 0 {
			return left
		}
		level := left / int64(len(unmet))
		if level == 0 {
			// Fewer rooms than routers asking: one each, by highest class
			// waiting, then to routers holding the room now (a moved room
			// idles for an acknowledgement's round trip), then by most
			// waiting.
			slices.SortStableFunc(unmet, func(a, b int) int {
				if c := compareClasses(routers[a], routers[b]); c != 0 {
					return c
				}
				if c := cmp.Compare(routers[b].Share-t[b], routers[a].Share-t[a]); c != 0 {
					return c
				}
				if c := compareWaiting(routers[a], routers[b]); c != 0 {
					return c
				}
				return cmp.Compare(caps[b]-t[b], caps[a]-t[a])
			})
			for _, i := range unmet[:left] {
				t[i]++
			}
			return 0
		}
		for _, i := range unmet {
			give := min(level, caps[i]-t[i])
			t[i] += give
			left -= give
		}
	}
	return left
}
