// Package spread staggers the control plane's periodic contacts with many
// workers (health probes, load polls) over their interval, as Prometheus
// spreads scrapes: each worker has a stable phase, a hash of the control
// plane's seed and its id, so ten thousand workers registered at once are
// contacted over one interval, not at one instant. A few new workers at a
// time still get their first contact at once, from a small burst budget.
//
// It owns the phase arithmetic only: it reads no registry and contacts no worker.
package spread

import (
	"container/heap"
	"context"
	"hash/fnv"
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

// Queue is a schedule of (instant, id) entries, earliest first. Entries are
// never removed early: the caller skips one that no longer matches the id's
// current instant.
type Queue struct{ h entries }

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

// Push schedules id at at.
func (q *Queue) Push(at time.Time, id string) { heap.Push(&q.h, entry{at: at, id: id}) }

// Peek returns the earliest instant, and false when the queue is empty.
func (q *Queue) Peek() (time.Time, bool) {
	if len(q.h) == 0 {
		return time.Time{}, false
	}
	return q.h[0].at, true
}

// PopDue removes and returns the earliest entry if it is due at now.
func (q *Queue) PopDue(now time.Time) (at time.Time, id string, ok bool) {
	if len(q.h) == 0 || q.h[0].at.After(now) {
		return time.Time{}, "", false
	}
	e := heap.Pop(&q.h).(entry)
	return e.at, e.id, true
}

// Reset empties the queue.
func (q *Queue) Reset() { q.h = q.h[:0] }

// Resolution is how finely a schedule is kept: a loop wakes at most once per
// Resolution, starting together the contacts due within it.
const Resolution = 10 * time.Millisecond

// Pace waits until Resolution has passed since start (when a loop's pass
// began), so a run of wake-ups costs one pass per Resolution. It reports
// false if ctx ended first.
func Pace(ctx context.Context, start time.Time) bool {
	d := Resolution - time.Since(start)
	if d <= 0 {
		return ctx.Err() == nil
	}
	return backoff.Sleep(ctx, d)
}
