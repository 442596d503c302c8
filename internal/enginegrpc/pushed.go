package enginegrpc

import (
	"errors"
	"fmt"
	"sync"
	"time"

	commonpb "github.com/smg-project/smg/gen/smg/grpc/common"
)

// Pushed is the load record a KV event batch carried (the field
// extensions, docs/grpc.md), read and checked.
type Pushed struct {
	Load RankLoad
	// Silence is the servicer's engine-silence figure; nil when it reports
	// none (an older servicer: the signal stays quiet).
	Silence  *time.Duration
	Prefill  int64
	StepWire bool
}

// maxSilence bounds a believable silence figure (a year).
const maxSilence = 365 * 24 * time.Hour

// ReadPushed reads b's load record. ok is false for a batch without one (a
// servicer that attaches none). An error names what cannot be believed: a
// rank outside the engine's or not the batch's, a negative count, a usage
// that is not a fraction, a negative, NaN or absurd silence or prefill.
func ReadPushed(b *commonpb.KvEventBatch) (p Pushed, ok bool, err error) {
	l := b.GetLoad()
	if l == nil {
		return Pushed{}, false, nil
	}
	p = Pushed{Load: PushedRankLoad(l), Prefill: l.GetPrefillTokensInHand(), StepWire: l.GetStepWire()}
	if err := p.Load.Check(MaxRanks); err != nil {
		return Pushed{}, true, err
	}
	if b.DpRank != nil && int(b.GetDpRank()) != p.Load.Rank {
		return Pushed{}, true, fmt.Errorf("batch of dp_rank %d carries the load of rank %d", b.GetDpRank(), p.Load.Rank)
	}
	if p.Prefill < 0 {
		return Pushed{}, true, fmt.Errorf("rank %d: negative prefill in hand %d", p.Load.Rank, p.Prefill)
	}
	if l.EngineSilenceSeconds != nil {
		s := l.GetEngineSilenceSeconds()
		if !(s >= 0 && s <= maxSilence.Seconds()) {
			return Pushed{}, true, fmt.Errorf("rank %d: engine silence %v s", p.Load.Rank, s)
		}
		d := time.Duration(s * float64(time.Second))
		p.Silence = &d
	}
	return p, true, nil
}

// Ranks is what a worker's pushing ranks last delivered. Safe for
// concurrent use.
type Ranks struct {
	mu sync.Mutex
	m  map[int]rankPush
}

type rankPush struct {
	p  Pushed
	at time.Time
}

// Merged is a worker's record over its pushing ranks.
type Merged struct {
	Loads []RankLoad
	// Silence is the longest figure a rank reports (nil: none reports one).
	Silence  *time.Duration
	Prefill  int64 // summed over ranks
	StepWire bool  // every rank's wire reports steps
}

// errNoRanks is Add's error before any rank pushed (never: Add stores one).
var errNoRanks = errors.New("no pushing rank")

// Add stores a rank's record at now and returns the worker's record over
// every rank that pushed.
func (r *Ranks) Add(p Pushed, now time.Time) (Merged, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[int]rankPush{}
	}
	r.m[p.Load.Rank] = rankPush{p, now}
	if len(r.m) == 0 {
		return Merged{}, errNoRanks
	}
	m := Merged{StepWire: true}
	for _, rp := range r.m {
		m.Loads = append(m.Loads, rp.p.Load)
		m.Prefill += rp.p.Prefill
		m.StepWire = m.StepWire && rp.p.StepWire
		if s := rp.p.Silence; s != nil && (m.Silence == nil || *s > *m.Silence) {
			m.Silence = s
		}
	}
	return m, nil
}

// Covers reports whether every rank that pushes has delivered within d of
// now: the spec's "a gRPC worker whose pushing ranks have each delivered a
// load record within the interval is skipped by that tick".
func (r *Ranks) Covers(d time.Duration, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.m) == 0 {
		return false
	}
	for _, rp := range r.m {
		if now.Sub(rp.at) >= d {
			return false
		}
	}
	return true
}

// Reset forgets every rank (the stream ended: the poll takes over).
func (r *Ranks) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(r.m)
}
