package sim

import (
	"encoding/binary"
	"hash/fnv"
	"math/rand/v2"
	"sync"
	"time"
)

// kvBlockSize is the number of tokens in one simulated KV block.
const kvBlockSize = 16

// kvLogSize bounds the batches a rank keeps for subscribers that fall behind
// or resume from a sequence number.
const kvLogSize = 1024

// kvEvent is one KV cache event: blocks stored (with their token ids) or
// removed.
type kvEvent struct {
	id     uint64
	stored bool
	hashes []int64
	tokens [][]uint32 // stored: each block's token ids
}

// kvBatch is one rank's events of one scheduler pass, numbered per rank.
type kvBatch struct {
	rank   int
	seq    uint64
	at     time.Time
	events []kvEvent
}

// kvLog is an engine's KV event history. Ranks add under their own lock;
// subscribers read under the log's.
type kvLog struct {
	mu      sync.Mutex
	pending [][]kvEvent
	ring    []kvBatch // the last kvLogSize batches of every rank, oldest first
	seq     []uint64  // per rank: sequence number of its newest batch
	nextID  uint64
	changed chan struct{} // closed and replaced by every new batch
}

func newKVLog(ranks int) *kvLog {
	return &kvLog{pending: make([][]kvEvent, ranks), seq: make([]uint64, ranks), changed: make(chan struct{})}
}

func (l *kvLog) add(rank int, ev kvEvent) {
	l.mu.Lock()
	l.nextID++
	ev.id = l.nextID
	l.pending[rank] = append(l.pending[rank], ev)
	l.mu.Unlock()
}

// flush turns a rank's pending events into one batch.
func (l *kvLog) flush(rank int, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.pending[rank]) == 0 {
		return
	}
	l.seq[rank]++
	if n := len(l.ring); n >= kvLogSize*len(l.seq) { // drop the older half, not one per batch
		l.ring = append(l.ring[:0], l.ring[n/2:]...)
	}
	l.ring = append(l.ring, kvBatch{rank: rank, seq: l.seq[rank], at: now, events: l.pending[rank]})
	l.pending[rank] = nil
	close(l.changed)
	l.changed = make(chan struct{})
}

// since returns the kept batches after each rank's sequence number in
// after, and a channel closed when the next batch lands.
func (l *kvLog) since(after []uint64) ([]kvBatch, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []kvBatch
	for _, b := range l.ring {
		if b.seq > after[b.rank] {
			out = append(out, b)
		}
	}
	return out, l.changed
}

// newest is every rank's newest sequence number.
func (l *kvLog) newest() []uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]uint64(nil), l.seq...)
}

// blockHashes chains a hash over every full block of ids, as engines key
// their prefix cache: a block's hash covers its parent's.
func blockHashes(ids []uint32) ([]int64, [][]uint32) {
	n := len(ids) / kvBlockSize
	hashes := make([]int64, 0, n)
	tokens := make([][]uint32, 0, n)
	var prev uint64
	buf := make([]byte, 8+4*kvBlockSize)
	for i := range n {
		block := ids[i*kvBlockSize : (i+1)*kvBlockSize]
		binary.LittleEndian.PutUint64(buf, prev)
		for j, id := range block {
			binary.LittleEndian.PutUint32(buf[8+4*j:], id)
		}
		h := fnv.New64a()
		_, _ = h.Write(buf)
		prev = h.Sum64()
		hashes = append(hashes, int64(prev))
		tokens = append(tokens, block)
	}
	return hashes, tokens
}

// storeBlocks announces the full blocks of req's prompt once its prefill is
// done. A request without token ids (HTTP) gets ids drawn from its seed.
func (r *rank) storeBlocks(req *request) {
	if !r.eng.cfg.kvEvents || len(req.blocks) > 0 {
		return
	}
	ids := req.ids
	if ids == nil {
		rng := rand.New(rand.NewPCG(req.seed, 1))
		ids = make([]uint32, req.promptTokens)
		for i := range ids {
			ids[i] = uint32(rng.IntN(len(vocab)))
		}
	}
	hashes, tokens := blockHashes(ids)
	if len(hashes) == 0 {
		return
	}
	req.blocks = hashes
	r.eng.kvLog.add(r.id, kvEvent{stored: true, hashes: hashes, tokens: tokens})
}

// dropBlocks announces the removal of the blocks req held.
func (r *rank) dropBlocks(req *request) {
	if len(req.blocks) == 0 {
		return
	}
	r.eng.kvLog.add(r.id, kvEvent{hashes: req.blocks})
	req.blocks = nil
}

// hold counts a new streaming request; the first one starts the silence
// clock, so a frozen engine's first request counts silence too.
func (r *rank) hold(now time.Time) {
	if r.streamHeld == 0 {
		r.lastOut = now
	}
	r.streamHeld++
}

// silence is how long the rank has produced nothing for the streaming
// requests it holds (0 when it holds none).
func (r *rank) silence(now time.Time) time.Duration {
	if r.streamHeld == 0 {
		return 0
	}
	return max(now.Sub(r.lastOut), 0)
}

// prefillInHand is the prompt tokens the rank still has to compute.
func (r *rank) prefillInHand() int64 {
	var n int64
	for _, q := range [][]*request{r.waiting, r.running} {
		for _, req := range q {
			if req.state == stateWaiting || req.state == statePrefill {
				n += int64(req.need - req.computed)
			}
		}
	}
	return n
}
