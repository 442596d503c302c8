package watch

import (
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
)

// Shared writers: a goroutine per stream costs one wake-up per router per
// change, about a third of a change's cost at 1,000 routers, so a few
// writers each own a shard of the streams and, at each change, pass every
// stream of their shard in turn.
//
// One router must not hold the others back, and gRPC's SendMsg blocks once
// a router stops taking bytes. A router more than WriterBudget behind on its
// acks goes back to its stream's own goroutine, which blocks alone. One that
// acks without reading can still block a send: a watchdog sees it outlast
// WriterStall and gives the rest of the shard to a new writer; the stream
// then stays on its own goroutine for a while.

const (
	// How long a stream a send stalled on stays on its own goroutine: 1 s,
	// doubling with each stall, up to a minute.
	stallWaitMin = time.Second
	stallWaitMax = time.Minute
	stallLeeway  = 4                     // a late watchdog waits on a send up to 4 WriterStalls
	writerTick   = 10 * time.Millisecond // streams due within a tick are passed in one round
)

// shard is a set of streams and the writer serving them.
type shard struct {
	s       *Server
	mu      sync.Mutex
	members []*watcher
	w       *writer       // the running writer; nil when the shard is empty
	kick    chan struct{} // buffered 1: the members changed: a round over all
}

// writer is one goroutine serving a shard, until it is empty or replaced.
type writer struct {
	sh    *shard
	round []*watcher

	mu        sync.Mutex
	active    bool      // in a round: the watchdog's timer is armed
	cur       *watcher  // the stream a send is on; nil between sends
	since     time.Time // when that send began
	abandoned bool      // the watchdog gave the shard to a new writer
	watchdog  *time.Timer
	checkAt   time.Time // when the watchdog should run next
}

// share gives w, held by its own goroutine, to a shared writer.
func (s *Server) share(w *watcher) {
	sh := s.shards[s.nextShard.Add(1)%uint64(len(s.shards))]
	w.shard = sh
	sh.mu.Lock()
	sh.members = append(sh.members, w)
	if sh.w == nil {
		sh.start()
	} else {
		sh.poke()
	}
	sh.mu.Unlock()
	s.metrics.shared.Inc()
	if s.joined != nil {
		s.joined(w.rec.id)
	}
}

// drop takes w out of the shard (no-op if it is not in it).
func (sh *shard) drop(w *watcher) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if i := slices.Index(sh.members, w); i >= 0 {
		sh.members = slices.Delete(sh.members, i, i+1)
		sh.s.metrics.shared.Dec()
		sh.poke() // an empty shard's writer ends
	}
}

// start runs a new writer for the shard. Caller holds sh.mu.
func (sh *shard) start() {
	wr := &writer{sh: sh}
	wr.watchdog = time.AfterFunc(time.Hour, wr.check)
	wr.watchdog.Stop() // armed for each round
	sh.w = wr
	go wr.run()
}

func (sh *shard) poke() {
	select {
	case sh.kick <- struct{}{}:
	default:
	}
}

// run serves the shard: a round over every stream at each routing change or
// change of members, over the streams due otherwise.
func (wr *writer) run() {
	s := wr.sh.s
	wake := time.NewTimer(time.Hour)
	defer wake.Stop()
	all := true
	var changed <-chan struct{}
	for {
		// Taken before a full round reads the registry, so no commit slips
		// between; a timed round keeps the last full round's channel, so a
		// commit since is not missed.
		if all {
			changed = s.changed()
		}
		wr.sh.mu.Lock()
		if wr.sh.w != wr || len(wr.sh.members) == 0 {
			if wr.sh.w == wr {
				wr.sh.w = nil
			}
			wr.sh.mu.Unlock()
			return
		}
		wr.round = append(wr.round[:0], wr.sh.members...)
		wr.sh.mu.Unlock()
		next, ok := wr.serve(all)
		clear(wr.round) // do not keep ended streams alive
		if !ok {
			return
		}
		wake.Reset(next.Sub(s.opts.Now()))
		all = true
		select {
		case <-changed:
		case <-wr.sh.kick:
		case <-wake.C: // only the streams due, unless a change came too
			select {
			case <-changed:
			default:
				all = false
			}
		}
	}
}

// serve runs one round and returns when the next timed round is due, or
// false when the watchdog replaced this writer.
func (wr *writer) serve(all bool) (time.Time, bool) {
	s := wr.sh.s
	wr.mu.Lock()
	wr.active = true
	wr.arm(s.opts.Now(), s.opts.WriterStall)
	wr.mu.Unlock()
	defer func() {
		wr.mu.Lock()
		wr.active = false
		wr.watchdog.Stop()
		wr.mu.Unlock()
	}()
	now := s.opts.Now()
	next := now.Add(time.Hour)
	due := now.Add(writerTick)
	for _, w := range wr.round {
		w.mu.Lock()
		if w.gone || (!all && w.due.After(due)) {
			if !w.gone {
				next = minTime(next, w.due)
			}
			w.mu.Unlock()
			continue
		}
		w.by = wr
		n, err := w.pass(s.opts.Now())
		w.by, w.due = nil, n
		wr.mu.Lock()
		abandoned := wr.abandoned
		wr.mu.Unlock()
		if abandoned {
			// The watchdog replaced this writer while this send stalled:
			// the stream stays on its own goroutine for a while.
			w.stallWait = min(max(2*w.stallWait, stallWaitMin), stallWaitMax)
			w.sharedAgain = s.opts.Now().Add(w.stallWait)
			w.mu.Unlock()
			w.back <- nil
			return now, false
		}
		giveBack := err != nil || w.unacked() > s.opts.WriterBudget
		w.mu.Unlock()
		if giveBack {
			wr.sh.drop(w)
			w.back <- err
			continue
		}
		next = minTime(next, n)
	}
	// Serve streams due within a tick of each other together.
	return next.Add(writerTick - 1).Truncate(writerTick), true
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// arm sets the watchdog to look in wait. Caller holds wr.mu.
func (wr *writer) arm(now time.Time, wait time.Duration) {
	wr.checkAt = now.Add(wait)
	wr.watchdog.Reset(wait)
}

// check is the watchdog: a send that has lasted WriterStall makes the
// writer give its shard to a new one, without the stream the send is on.
// A watchdog running late says the process is short of CPU, not that the
// router stopped reading: it looks again, up to stallLeeway times
// WriterStall into the send.
func (wr *writer) check() {
	s := wr.sh.s
	stall := s.opts.WriterStall
	wr.mu.Lock()
	if !wr.active || wr.abandoned {
		wr.mu.Unlock()
		return
	}
	now := s.opts.Now()
	late := now.Sub(wr.checkAt)
	wait := stall
	if wr.cur != nil {
		in := now.Sub(wr.since)
		wait = stall - in
		if wait <= 0 && late > stall/2 && in < stallLeeway*stall {
			wait = stall / 2
		}
	}
	if wait > 0 {
		wr.arm(now, wait)
		wr.mu.Unlock()
		return
	}
	wr.abandoned = true
	stuck := wr.cur
	wr.mu.Unlock()

	sh := wr.sh
	sh.s.metrics.stalls.Inc()
	sh.s.log.Info("watch: a send to a router stalled; its stream leaves the shared writer for a while",
		"router", stuck.rec.id, "stall", stall)
	sh.drop(stuck)
	sh.mu.Lock()
	if sh.w == wr {
		sh.start()
	}
	sh.mu.Unlock()
}

// writerStream times a shared writer's sends for its watchdog.
type writerStream struct {
	grpc.ServerStream
	w *watcher
}

func (ws *writerStream) SendMsg(m any) error {
	wr := ws.w.by
	if wr == nil {
		return ws.ServerStream.SendMsg(m)
	}
	wr.mu.Lock()
	wr.cur, wr.since = ws.w, wr.sh.s.opts.Now()
	wr.mu.Unlock()
	err := ws.ServerStream.SendMsg(m)
	wr.mu.Lock()
	wr.cur = nil
	wr.mu.Unlock()
	return err
}
