// Package spread staggers the control plane's periodic contacts with many
// workers (health probes, load polls) over their interval, as Prometheus
// spreads scrapes: each worker has a stable phase, a hash of the control
// plane's seed and its id, so ten thousand workers registered at once are
// contacted over one interval, not at one instant. A few new workers at a
// time still get their first contact at once, from a small burst budget.
//
// It owns the phase arithmetic and the schedule of contacts (Schedule, Loop):
// it reads no registry and contacts no worker.
package spread

import (
	"container/heap"
	"context"
	"hash/fnv"
	"maps"
	"time"

	"golang.org/x/time/rate"

	"github.com/smg-project/smg/internal/backoff"
)

// Phase is one worker's place in an interval: its contacts recur at the
// instants t with t ≡ offset (mod interval), counted from the Unix epoch so
// that the grid does not depend on when the control plane started.
type Phase struct {
	offset, interval int64 // nanoseconds
}

// PhaseOf returns the phase of key (a purpose and a worker id) under seed
// (the control plane's identity) in interval. A non-positive interval is
// treated as one nanosecond (no spreading).
func PhaseOf(seed, key string, interval time.Duration) Phase {
	iv := max(int64(interval), 1)
	return Phase{offset: int64(hash(seed, key) % uint64(iv)), interval: iv}
}

// PhaseAt returns the phase that recurs at t (a worker's first contact,
// granted by the burst budget).
func PhaseAt(t time.Time, interval time.Duration) Phase {
	iv := max(int64(interval), 1)
	return Phase{offset: mod(t.UnixNano(), iv), interval: iv}
}

// Next returns the first instant strictly after t at which the phase
// recurs: t < Next(t) <= t + interval.
func (p Phase) Next(t time.Time) time.Time {
	return t.Add(time.Duration(p.interval - mod(t.UnixNano()-p.offset, p.interval)))
}

// mod is a modulo n in [0, n).
func mod(a, n int64) int64 {
	r := a % n
	if r < 0 {
		r += n
	}
	return r
}

// hash is 64-bit FNV-1a over seed, a separator and key, finished with
// splitmix64's mixer so that ids differing in their last character (w00001,
// w00002) land far apart rather than in neighbouring offsets.
func hash(seed, key string) uint64 {
	f := fnv.New64a()
	f.Write([]byte(seed))
	f.Write([]byte{0xff}) // never in UTF-8: seed "a"+key "b" differs from "ab"+""
	f.Write([]byte(key))
	h := f.Sum64()
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}

// Burst is the budget of first contacts started at once: size at a time,
// refilled at size per per; beyond it, a worker waits for its phase. It
// bounds how many contacts start together, never how many are in flight.
type Burst struct{ tokens *rate.Limiter }

// The first contacts started at once, and per DefaultBurstPer, before the
// rest wait for their phase.
const (
	DefaultBurstSize = 64
	DefaultBurstPer  = time.Second
)

// NewBurst returns a full budget of size contacts, refilled at size per per.
func NewBurst(size int, per time.Duration) *Burst {
	size = max(size, 0)
	return &Burst{rate.NewLimiter(rate.Limit(float64(size)/max(per, time.Nanosecond).Seconds()), size)}
}

// Take spends one contact from the budget at now, or reports that it is
// spent.
func (b *Burst) Take(now time.Time) bool { return b.tokens.AllowN(now, 1) }

// Schedule is one loop's workers, each with the state S the loop keeps of it
// and the instant of its next contact, earliest first. Not safe for
// concurrent use.
type Schedule[S any] struct {
	slots map[string]*Slot[S]
	h     entries // (instant, id), earliest first; one not matching its slot is stale
	gen   uint64  // Sweep's pass
}

// Slot is one worker's place in a Schedule.
type Slot[S any] struct {
	ID    string
	State S
	next  time.Time // zero: none scheduled (a contact in flight)
	gen   uint64
}

// Next is when sl's next contact is due (zero: none scheduled).
func (sl *Slot[S]) Next() time.Time { return sl.next }

type entry struct {
	at time.Time
	id string
}

type entries []entry

func (e entries) Len() int           { return len(e) }
func (e entries) Less(i, j int) bool { return e[i].at.Before(e[j].at) }
func (e entries) Swap(i, j int)      { e[i], e[j] = e[j], e[i] }
func (e *entries) Push(x any)        { *e = append(*e, x.(entry)) }
func (e *entries) Pop() any {
	old := *e
	x := old[len(old)-1]
	*e = old[:len(old)-1]
	return x
}

// Get returns id's slot, nil if none.
func (s *Schedule[S]) Get(id string) *Slot[S] { return s.slots[id] }

// Keep returns id's slot (nil: none) and keeps it through the next Sweep.
func (s *Schedule[S]) Keep(id string) *Slot[S] {
	sl := s.slots[id]
	if sl != nil {
		sl.gen = s.gen
	}
	return sl
}

// Add gives id a new slot holding st, in place of any, kept through the
// next Sweep; the caller schedules its first contact.
func (s *Schedule[S]) Add(id string, st S) *Slot[S] {
	if s.slots == nil {
		s.slots = map[string]*Slot[S]{}
	}
	sl := &Slot[S]{ID: id, State: st, gen: s.gen}
	s.slots[id] = sl
	return sl
}

// Sweep forgets the slots neither added nor kept since the last Sweep.
func (s *Schedule[S]) Sweep() {
	maps.DeleteFunc(s.slots, func(_ string, sl *Slot[S]) bool { return sl.gen != s.gen })
	s.gen++
}

// At schedules sl's next contact at t, in place of any other.
func (s *Schedule[S]) At(sl *Slot[S], t time.Time) {
	sl.next = t
	heap.Push(&s.h, entry{at: t, id: sl.ID})
}

// Peek returns the earliest instant scheduled, and false when none is.
func (s *Schedule[S]) Peek() (time.Time, bool) {
	if len(s.h) == 0 {
		return time.Time{}, false
	}
	return s.h[0].at, true
}

// PopDue returns a slot whose contact is due at now, no longer scheduled,
// or nil when none is.
func (s *Schedule[S]) PopDue(now time.Time) *Slot[S] {
	for len(s.h) > 0 && !s.h[0].at.After(now) {
		e := heap.Pop(&s.h).(entry)
		if sl := s.slots[e.id]; sl != nil && sl.next.Equal(e.at) {
			sl.next = time.Time{}
			return sl
		}
	}
	return nil
}

// Wait is how long from now until the next contact due, at least
// Resolution and at most most.
func (s *Schedule[S]) Wait(now time.Time, most time.Duration) time.Duration {
	if at, ok := s.Peek(); ok {
		return min(max(at.Sub(now), Resolution), most)
	}
	return most
}

// Resolution is how finely a schedule is kept: a loop wakes at most once per
// Resolution, starting together the contacts due within it.
const Resolution = 10 * time.Millisecond

// Loop runs pass until ctx ends, at most once a Resolution: again when the
// wait it returned is over, on wake, or when membership changes (members is
// the registry's MembershipChanged); reconcile tells pass that membership
// may have changed since its last run.
func Loop(ctx context.Context, members func() <-chan struct{}, wake <-chan struct{}, pass func(reconcile bool) time.Duration) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	changed, reconcile := members(), true // before pass reads the registry: no change is missed
	for {
		start := time.Now()
		timer.Reset(pass(reconcile))
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-wake:
		case <-changed:
		}
		if d := Resolution - time.Since(start); d > 0 && !backoff.Sleep(ctx, d) || ctx.Err() != nil {
			return
		}
		select {
		case <-changed:
			changed, reconcile = members(), true
		default:
			reconcile = false
		}
	}
}
