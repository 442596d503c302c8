// Package readbudget bounds the memory that a process's concurrent engine
// reads hold: each answer is capped on its own, and this caps their sum. A
// read is charged for the bytes it reads times Cost (what parsing them
// holds), before it reads them, and gives its charge back when it is done;
// a read that does not fit waits (under its context's deadline).
//
// It owns the budget and its metrics; reading and parsing are the engine
// package's.
package readbudget

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/semaphore"
)

// Cost is what one byte of an answer holds while it is read and parsed: a
// Prometheus text page of short lines holds about 6 times its size once
// parsed, and allocates about 11 times it on the way.
const Cost = 8

// DefaultMiB is the default budget, in MiB (--engine-read-budget-mib): one
// 15 MiB page of short lines at a time, or hundreds of ordinary pages.
const DefaultMiB = 128

// Small is what a read of unknown length is charged for first; one that
// turns out longer is charged for the largest answer allowed at once, and
// a read that waits holds nothing meanwhile, so reads cannot keep each
// other waiting.
const Small = 64 << 10

// warnEvery bounds the warnings of reads waiting.
const warnEvery = 10 * time.Second

// Budget is the memory all engine reads of a process share. A nil Budget
// bounds nothing.
type Budget struct {
	limit int64
	sem   *semaphore.Weighted
	log   *slog.Logger

	inUse prometheus.Gauge
	waits prometheus.Counter

	mu       sync.Mutex
	warnedAt time.Time
}

// New returns a budget of limit bytes (at least 1 MiB); its metrics register
// on reg (nil: nowhere).
func New(limit int64, reg prometheus.Registerer, log *slog.Logger) (*Budget, error) {
	limit = max(limit, 1<<20)
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := &Budget{limit: limit, sem: semaphore.NewWeighted(limit), log: log,
		inUse: prometheus.NewGauge(prometheus.GaugeOpts{Name: "smg_engine_read_budget_bytes",
			Help: "memory held by engine reads in flight (bytes read times their parsing cost), out of --engine-read-budget-mib"}),
		waits: prometheus.NewCounter(prometheus.CounterOpts{Name: "smg_engine_read_budget_waits_total",
			Help: "engine reads that waited for the read budget"}),
	}
	limitG := prometheus.NewGauge(prometheus.GaugeOpts{Name: "smg_engine_read_budget_limit_bytes",
		Help: "the engine read budget (--engine-read-budget-mib)"})
	limitG.Set(float64(limit))
	for _, c := range []prometheus.Collector{b.inUse, b.waits, limitG} {
		if reg == nil {
			break
		}
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// InUse is the gauge of the memory held (tests).
func (b *Budget) InUse() prometheus.Gauge { return b.inUse }

// Waits is the counter of reads that waited (tests).
func (b *Budget) Waits() prometheus.Counter { return b.waits }

// Lease is one read's charge. Its methods are for one goroutine.
type Lease struct {
	b    *Budget
	held int64
	used int64
}

// Lease starts a read's charge (nil for a nil budget; a nil Lease charges
// nothing).
func (b *Budget) Lease() *Lease {
	if b == nil {
		return nil
	}
	return &Lease{b: b}
}

// Reserve charges the lease for n more bytes to read (Cost each): an
// answer's length when known; Small, then the largest answer allowed, when
// not. It waits while the budget is spent, until ctx ends.
func (l *Lease) Reserve(ctx context.Context, n int64) error {
	if l == nil {
		return nil
	}
	want := min(l.used+n*Cost, l.b.limit) // a read larger than the budget runs alone
	l.used = want
	if want <= l.held {
		return nil
	}
	return l.acquire(ctx, want)
}

// acquire brings the lease's charge to want. A lease that must wait gives
// back what it holds first: waiting leases hold nothing, so they cannot keep
// each other waiting (what it read so far, at most Small, goes unaccounted
// meanwhile).
func (l *Lease) acquire(ctx context.Context, want int64) error {
	b := l.b
	if b.sem.TryAcquire(want - l.held) {
		b.inUse.Add(float64(want - l.held))
		l.held = want
		return nil
	}
	b.waits.Inc()
	b.warn(want)
	l.release()
	if err := b.sem.Acquire(ctx, want); err != nil {
		return err
	}
	l.held = want
	b.inUse.Add(float64(want))
	return nil
}

func (b *Budget) warn(n int64) {
	b.mu.Lock()
	now := time.Now()
	due := now.Sub(b.warnedAt) >= warnEvery
	if due {
		b.warnedAt = now
	}
	b.mu.Unlock()
	if due {
		b.log.Warn("Engine reads wait for memory: the reads in flight hold the read budget (--engine-read-budget-mib); polls may time out and fail open",
			"budget_bytes", b.limit, "wanted_bytes", n)
	}
}

// Release gives the lease's charge back.
func (l *Lease) Release() {
	if l == nil {
		return
	}
	l.release()
	l.used = 0
}

func (l *Lease) release() {
	if l.held == 0 {
		return
	}
	// The gauge first: released before it, the room could be taken and
	// counted by another read while this one is still counted (the gauge
	// would read above the budget the semaphore keeps).
	l.b.inUse.Sub(float64(l.held))
	l.b.sem.Release(l.held)
	l.held = 0
}
