package router

import (
	"math/rand/v2"
	"sync/atomic"

	"github.com/smg-project/smg/router/admission"
)

// request is what selection needs to know about one request.
type request struct {
	model  string
	key    string // sticky routing key (header), may be empty
	prompt []byte // raw JSON of the prompt field, aliases the body; may be nil
	now    int64  // monotonic nanoseconds, for the breaker
	avoid  *workerState
	need   int64           // rooms the request takes in a window (0: no window applies)
	tokens int64           // tokens it holds under --worker-token-budget: prompt plus expected output (0: none)
	class  admission.Class // priority class (Default without the scheduler)
	ttftBy int64           // monotonic nanoseconds by which its TTFT objective wants a first token (0: none)
	own    int64           // its estimated prompt tokens (for TTFT predictions)
	proto  protocol        // the protocol a PD leg must speak (protoAny: either)
	pack   bool            // placed in the fleet's fixed order (Ticket.Packed), not by the policy
}

// selector runs the configured policy over a pool. Every method reads only
// the immutable view plus atomics: no lock, no allocation, no I/O.
type selector struct {
	policy          string
	cb              *breakerConfig
	cacheThreshold  float64
	balanceAbs      int64
	balanceRel      float64
	hotTokenUsage   float64
	prefixLoadLimit float64
	waitingCap      int64          // least_load: skip a worker at this waiting (0: off)
	prefillFirst    bool           // least_load: rank by prompt tokens ahead, then load
	affinity        *affinityTable // cache_aware: prompt prefix blocks -> worker
	sticky          *affinityTable // manual: routing key -> worker
}

// eligible: healthy, not vetoed, breaker passing, not the worker a retry
// avoids, and with room for the request when a window applies.
func (s *selector) eligible(v *view, i int32, q *request) bool { return s.eligibleHot(v.hot.at(i), q) }

func (s *selector) eligibleHot(h *hotWorker, q *request) bool {
	return h.eligible && h.st != q.avoid && (q.need == 0 || h.st.gate.HasRoom(q.need, q.tokens)) &&
		(q.proto == protoAny || q.proto == h.proto) && h.st.routable(s.cb, q.now) && q.meets(h)
}

// load is the reported load plus this router's dispatches since that report.
func (v *view) load(i int32) int64 { return v.hot.at(i).load() }

func (h *hotWorker) load() int64 { return h.reported + h.st.dispatched.Load() }

// pick returns the index (into v.workers) of the worker the policy chooses
// among eligible candidates, or -1 when none is eligible.
func (s *selector) pick(v *view, p *pool, q *request) int32 {
	if len(p.idx) == 0 {
		return -1
	}
	if q.pack && !s.keyed() {
		return s.packed(v, p, q)
	}
	switch s.policy {
	case PolicyRoundRobin:
		return s.roundRobin(v, p, q)
	case PolicyRandom:
		return s.random(v, p, q)
	case PolicyPowerOfTwo:
		return s.powerOfTwo(v, p, q)
	case PolicyLeastLoad:
		return s.leastLoad(v, p, q)
	case PolicyConsistentHashing:
		return s.consistentHash(v, p, q, false)
	case PolicyPrefixHash:
		return s.consistentHash(v, p, q, true)
	case PolicyManual:
		return s.manual(v, p, q)
	default:
		return s.cacheAware(v, p, q)
	}
}

// keyed reports whether the policy places by a key (sticky routing or a
// prompt hash): packing would move a key off its worker.
func (s *selector) keyed() bool {
	return s.policy == PolicyManual || s.policy == PolicyConsistentHashing || s.policy == PolicyPrefixHash
}

// packed returns the eligible worker first in the fleet's fixed order (the
// rank hashed from each worker's ID, the same on every router): a tenant
// over its weighted share fills its engines one after the other, and the
// engines it leaves keep the other tenants' headroom, out of reach of its
// full batches and prefills.
func (s *selector) packed(v *view, p *pool, q *request) int32 {
	best, bestRank := int32(-1), uint32(0)
	for _, i := range p.idx {
		h := v.hot.at(i)
		if s.eligibleHot(h, q) && (best < 0 || h.rank < bestRank) {
			best, bestRank = i, h.rank
		}
	}
	return best
}

func (s *selector) roundRobin(v *view, p *pool, q *request) int32 {
	n := uint64(len(p.idx))
	start := p.rr.Add(1) - 1
	for k := uint64(0); k < n; k++ {
		if i := p.idx[(start+k)%n]; s.eligible(v, i, q) {
			return i
		}
	}
	return -1
}

// random probes a few random candidates, then falls back to counting the
// eligible ones so a mostly vetoed pool still picks uniformly.
func (s *selector) random(v *view, p *pool, q *request) int32 {
	n := len(p.idx)
	for range 4 {
		if i := p.idx[rand.IntN(n)]; s.eligible(v, i, q) {
			return i
		}
	}
	count := 0
	for _, i := range p.idx {
		if s.eligible(v, i, q) {
			count++
		}
	}
	if count == 0 {
		return -1
	}
	k := rand.IntN(count)
	for _, i := range p.idx {
		if s.eligible(v, i, q) {
			if k == 0 {
				return i
			}
			k--
		}
	}
	return -1 // the breaker changed under us; treat as none
}

func (s *selector) powerOfTwo(v *view, p *pool, q *request) int32 {
	a := s.random(v, p, q)
	if a < 0 {
		return -1
	}
	b := a
	for range 4 {
		if b = s.random(v, p, q); b != a {
			break
		}
	}
	if v.load(b) < v.load(a) {
		return b
	}
	return a
}

// leastLoad scans from a random offset so ties spread instead of piling on
// the first worker. With --least-load-waiting-cap, a worker whose reported
// waiting plus this router's dispatches since that report reaches the cap is
// skipped; when every eligible worker is capped, the least loaded of them is
// taken (the cap steers, it never refuses). With --least-load-prefill-first
// the prompt tokens ahead rank first: a prompt sent where other prefills are
// under way shares the engine's prefill steps with them, and the count of
// requests, most of them decoding, does not tell where they are.
func (s *selector) leastLoad(v *view, p *pool, q *request) int32 {
	start := rand.IntN(len(p.idx))
	best, bestLoad := s.leastLoadIn(v, p.idx[start:], q, -1, 0, s.waitingCap)
	best, _ = s.leastLoadIn(v, p.idx[:start], q, best, bestLoad, s.waitingCap)
	if best < 0 && s.waitingCap > 0 {
		best, bestLoad = s.leastLoadIn(v, p.idx[start:], q, -1, 0, 0)
		best, _ = s.leastLoadIn(v, p.idx[:start], q, best, bestLoad, 0)
	}
	return best
}

func (s *selector) leastLoadIn(v *view, idx []int32, q *request, best int32, bestLoad, waitingCap int64) (int32, int64) {
	for _, i := range idx {
		h := v.hot.at(i)
		if !s.eligibleHot(h, q) {
			continue
		}
		if waitingCap > 0 && h.waiting+h.st.dispatched.Load() >= waitingCap {
			continue
		}
		l := h.load()
		if s.prefillFirst {
			l = min(max(workAhead(h), 0), 1<<40)<<rankLoadBits + min(max(l, 0), 1<<rankLoadBits-1)
		}
		if best < 0 || l < bestLoad {
			best, bestLoad = i, l
		}
	}
	return best, bestLoad
}

// rankLoadBits is the low bits of --least-load-prefill-first's rank that
// hold the load, the tie-break under the prompt tokens ahead.
const rankLoadBits = 16

// prefixHashBytes is how much of the prompt prefix_hash keys on.
const prefixHashBytes = 1024

// consistentHash walks the ring from the key's point to the first eligible
// worker: a vetoed worker's keys move to its ring successor while the veto
// lasts and come back when it ends, since the ring itself does not change.
// prefix_hash also passes over a worker loaded past mean x load factor +
// --balance-abs-threshold, so one hot prefix cannot pile onto a single worker.
func (s *selector) consistentHash(v *view, p *pool, q *request, prefix bool) int32 {
	var h uint64
	switch {
	case q.key != "":
		h = hashString(q.key)
	case len(q.prompt) > 0:
		b := q.prompt
		if prefix && len(b) > prefixHashBytes {
			b = b[:prefixHashBytes]
		}
		h = hashBytes(hashSeed, b)
	default:
		return s.random(v, p, q)
	}
	limit := int64(-1)
	if prefix {
		var total int64
		for _, i := range p.idx {
			total += v.load(i)
		}
		limit = int64(float64(total)/float64(len(p.idx))*s.prefixLoadLimit) + s.balanceAbs
	}
	r := p.ring
	first := int32(-1)
	for k, at := 0, r.search(h); k < len(r.points); k, at = k+1, at+1 {
		if at == len(r.points) {
			at = 0
		}
		i := v.indexOfSlot(r.points[at].slot)
		if i < 0 || !s.eligible(v, i, q) {
			continue
		}
		if limit < 0 || v.load(i) <= limit {
			return i
		}
		if first < 0 {
			first = i
		}
	}
	return first
}

// manual pins each routing key to a worker. While the pinned worker is out
// (vetoed, unhealthy, breaker open) the key goes elsewhere without losing its
// pin, so it returns once the worker does; a removed worker's keys re-pin.
func (s *selector) manual(v *view, p *pool, q *request) int32 {
	if q.key == "" {
		return s.random(v, p, q)
	}
	h := hashString(q.key) ^ p.salt()
	if slot, ok := s.sticky.get(h); ok {
		if i := v.indexOfSlot(slot); i >= 0 && p.contains(v, i) {
			if s.eligible(v, i, q) {
				return i
			}
			return s.random(v, p, q)
		}
	}
	i := s.random(v, p, q)
	if i >= 0 {
		s.sticky.put(h, v.states[i].slot)
	}
	return i
}

// Prompt prefixes are hashed in blocks; a hit on block k means the first k
// blocks were last sent to that worker.
const (
	affinityBlock     = 64
	affinityMaxBlocks = 128
)

// cacheAware keeps a prompt on the worker that served its longest known prefix
// (that worker likely holds it in KV cache) unless the load is out of balance
// or that worker's KV cache is hot; then it takes the least-loaded worker.
func (s *selector) cacheAware(v *view, p *pool, q *request) int32 {
	// One scan, from a random offset so ties spread: least-loaded worker and
	// the load spread.
	start := rand.IntN(len(p.idx))
	least, minLoad, maxLoad := s.spanLoads(v, p.idx[start:], q, -1, 0, 0)
	least, minLoad, maxLoad = s.spanLoads(v, p.idx[:start], q, least, minLoad, maxLoad)
	if least < 0 {
		return -1
	}
	prompt := q.prompt
	if len(prompt) > affinityBlock*affinityMaxBlocks {
		prompt = prompt[:affinityBlock*affinityMaxBlocks]
	}
	imbalanced := maxLoad-minLoad > s.balanceAbs && float64(maxLoad) > float64(minLoad)*s.balanceRel
	// Block hashes are cumulative: block k's hash covers the whole prefix.
	var hashes [affinityMaxBlocks]uint64
	blocks := 0
	h := uint64(hashSeed) ^ p.salt()
	for off := 0; off < len(prompt); off += affinityBlock {
		h = hashBytes(h, prompt[off:min(off+affinityBlock, len(prompt))])
		hashes[blocks] = h
		blocks++
	}
	chosen := int32(-1)
	if !imbalanced && blocks > 0 {
		matched, at := 0, int32(-1)
		for k, h := range hashes[:blocks] {
			end := min((k+1)*affinityBlock, len(prompt))
			slot, ok := s.affinity.get(h)
			if !ok {
				break
			}
			if i := v.indexOfSlot(slot); i >= 0 && p.contains(v, i) && s.eligible(v, i, q) {
				matched, at = end, i
			}
		}
		if at >= 0 && float64(matched) >= s.cacheThreshold*float64(len(prompt)) &&
			v.worker(at).TokenUsage < s.hotTokenUsage {
			chosen = at
		}
	}
	if chosen < 0 {
		chosen = least
	}
	slot := v.states[chosen].slot
	for _, h := range hashes[:blocks] {
		s.affinity.put(h, slot)
	}
	return chosen
}

// spanLoads extends a scan for the least-loaded eligible worker and the
// minimum and maximum eligible load.
func (s *selector) spanLoads(v *view, idx []int32, q *request, least int32, minLoad, maxLoad int64) (int32, int64, int64) {
	for _, i := range idx {
		h := v.hot.at(i)
		if !s.eligibleHot(h, q) {
			continue
		}
		l := h.load()
		if least < 0 || l < minLoad {
			least, minLoad = i, l
		}
		maxLoad = max(maxLoad, l)
	}
	return least, minLoad, maxLoad
}

// contains reports whether worker i belongs to the pool (same model, or the
// all-models pool, and the pool's kind: a PD leg's pool never takes a worker
// of the other leg that an affinity table remembers).
func (p *pool) contains(v *view, i int32) bool {
	w := v.worker(i)
	kind := w.Type
	if kind == TypeRegular {
		kind = ""
	}
	return (p.model == "" || w.Model == p.model) && kind == p.kind
}

// salt keys a pool's affinity entries apart from other pools': a PD
// request's prefill and decode legs share a prompt and a routing key, and
// each leg's pin must name a worker of its own pool, or the two legs would
// overwrite each other's pins on every request.
func (p *pool) salt() uint64 {
	switch p.kind {
	case TypePrefill:
		return 0x70726566696c6c00 // "prefill"
	case TypeDecode:
		return 0x6465636f64650000 // "decode"
	}
	return 0
}

// affinityTable is a fixed-size, lossy, lock-free map from a 64-bit hash to a
// worker slot. A collision overwrites an older entry, which only costs an
// affinity hint; memory stays bounded whatever the key space.
type affinityTable struct {
	entries []atomic.Uint64
	mask    uint64
}

const slotBits = 24 // up to 16M worker slots

func newAffinityTable(sizeLog2 uint) *affinityTable {
	return &affinityTable{entries: make([]atomic.Uint64, 1<<sizeLog2), mask: 1<<sizeLog2 - 1}
}

func (t *affinityTable) get(h uint64) (uint32, bool) {
	e := t.entries[h&t.mask].Load()
	if e == 0 || e>>slotBits != h>>slotBits {
		return 0, false
	}
	return uint32(e&(1<<slotBits-1)) - 1, true
}

func (t *affinityTable) put(h uint64, slot uint32) {
	e := h>>slotBits<<slotBits | uint64(slot+1)
	if t.entries[h&t.mask].Load() != e {
		t.entries[h&t.mask].Store(e)
	}
}
