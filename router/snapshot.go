package router

import (
	"slices"
	"sync/atomic"

	"github.com/smg-project/smg/router/admission"
)

// Veto says why the control plane took a worker out of routing. The router
// never computes one; it only reads the value from its snapshot.
type Veto uint8

const (
	VetoNone        Veto = iota // routable
	VetoOverload                // at or above a load ceiling
	VetoUnreachable             // transport failure plus silence, or stale
	VetoWedged                  // evidence of work but no progress
)

// String returns the spec's reason label ("overload", "unreachable", "wedged") or "".
func (v Veto) String() string {
	switch v {
	case VetoOverload:
		return "overload"
	case VetoUnreachable:
		return "unreachable"
	case VetoWedged:
		return "wedged"
	}
	return ""
}

// liveness reports whether the veto comes from the liveness tracker.
func (v Veto) liveness() bool { return v == VetoUnreachable || v == VetoWedged }

// Worker types.
const (
	TypeRegular = "regular"
	TypePrefill = "prefill"
	TypeDecode  = "decode"
)

// Worker is one entry of a snapshot. It is immutable once published: the
// router's own per-worker counters (dispatches, breaker, pile) live in a
// separate state that survives snapshot swaps.
type Worker struct {
	ID, URL, Model, Type string // Type: "regular" (or ""), "prefill", "decode"
	Priority             int32
	Cost                 float64
	Healthy              bool
	Veto                 Veto
	VetoReason           string
	// Overloaded: over its overload ceiling whatever Veto says (a liveness
	// veto outranks overload in Veto); a shedding router never steers to it.
	Overloaded     bool
	OverloadReason string
	// Load summary from the last report.
	Waiting, Running int64
	TokenUsage       float64
	MaxRunning       int64
	// LoadRevision changes whenever a new report arrived; it resets this
	// router's count of dispatches since the last report.
	LoadRevision  uint64
	BootstrapPort int32  // PD prefill
	APIKey        string // sent to the worker as its bearer token, when set
	// WindowShare is this router's share of the worker's window (a decode
	// worker's MaxRunning, or AdmissionRooms), granted by the control plane:
	// > 0 rooms, < 0 none, 0 no share allocated (the router counts against
	// the whole window alone).
	WindowShare int64
	// AdmissionRooms is a worker's running window plus the queue allowance
	// (--worker-admission-window on the control plane; 0: none known). The
	// router gates on it with --worker-admission-window.
	AdmissionRooms int64
	// TokenBudget is the worker's token budget (its KV capacity in tokens,
	// --worker-token-budget on the control plane; 0: none known) and
	// TokenShare this router's share of it, as WindowShare.
	TokenBudget, TokenShare int64
	// PromptTokensAhead is the prompt tokens waiting for prefill on the
	// worker, summed over routers by the control plane (this router's own
	// last report included); TTFT predictions start from it.
	PromptTokensAhead int64
	// AheadReport is the report of this router's own that PromptTokensAhead
	// holds: the latest the control plane had acknowledged when the
	// worker's state arrived (0: unknown, the latest report is subtracted).
	AheadReport uint64
	// Held: kept from the previous control plane epoch, without vetoes,
	// while the new control plane refills its registry (warming_secs).
	Held bool
	// Provider is set for an external worker (an OpenAI-compatible
	// provider); nil for an engine. Shared, never written.
	Provider *Provider
}

// Snapshot is the fleet as the control plane last described it. The router
// takes ownership on Apply: the caller must not modify it afterwards.
type Snapshot struct {
	Epoch    string
	Revision uint64
	Workers  []Worker
	// Settings are the control plane's values this router must share with
	// it; nil until the control plane has sent them.
	Settings *FleetSettings
}

// FleetSettings are values a router takes from its control plane, so a split
// fleet answers as one; the router's own flags apply only before the first
// snapshot that carries them.
type FleetSettings struct {
	// LoadMonitorIntervalSecs is the control plane's --load-monitor-interval:
	// the Retry-After of a shed answer.
	LoadMonitorIntervalSecs int
	// WorkerStaleSecs is the control plane's --worker-stale-secs: how long
	// it may stay silent before the router fails open (0: never).
	WorkerStaleSecs int
}

// Delta is a change to the workers of the snapshot (or delta) applied last:
// the watch client hands one to ApplyDelta for each delta of the control
// plane, so a router applies a change in time proportional to the change.
// The router takes ownership of it.
type Delta struct {
	Epoch    string
	Revision uint64
	Upserts  []Worker // new or changed workers, by ID; a later entry wins
	Removed  []string // IDs that leave (unknown IDs are ignored)
}

// view is a snapshot compiled for selection: pools per model, rings, and the
// per-worker states aligned with workers. Immutable once stored: a delta
// builds its successor by copy-on-write (patch), sharing what it leaves.
type view struct {
	epoch    string
	revision uint64
	workers  chunked[Worker]    // as sent, or a veto-free copy after FailOpen
	sent     chunked[Worker]    // as sent: workers unless failOpen
	hot      chunked[hotWorker] // aligned with workers: what a pool scan touches
	states   []*workerState     // aligned with workers
	bySlot   []int32            // state slot -> index into workers, -1 when absent
	pools    map[string]*pool
	all      *pool               // every regular worker, for requests that name no model
	pd       map[string]*pdPools // PD disaggregation: prefill and decode pools per model
	pdAll    *pdPools            // every PD worker, for requests that name no model
	models   []string            // sorted, for /v1/models
	failOpen bool
	spill    map[string][]int32 // --spill-over: external workers by model (spill.go)
}

// worker is entry i of the view (not to be written).
func (v *view) worker(i int32) *Worker { return v.workers.at(i) }

// size is the number of workers.
func (v *view) size() int32 { return int32(len(v.states)) }

// hotWorker packs the fields selection reads per candidate next to each
// other, so scanning a 1,000-worker pool stays in cache.
type hotWorker struct {
	st          *workerState
	reported    int64 // Waiting + Running from the last report
	waiting     int64 // Waiting from the last report (least_load's waiting cap)
	eligible    bool  // Healthy and not vetoed (the breaker is checked live)
	healthy     bool
	veto        Veto
	over        bool   // over its overload ceiling, whatever veto says
	ahead       int64  // PromptTokensAhead (TTFT objectives)
	aheadReport uint64 // AheadReport
	proto       protocol
	rank        uint32 // place in the fleet's fixed order for packed requests (packRank)
}

// pool is the set of candidates a request for one model draws from.
type pool struct {
	model string
	kind  string  // "" (regular), TypePrefill or TypeDecode
	idx   []int32 // indexes into view.workers
	ring  *ring   // shared with the previous view while membership is unchanged
	rr    *atomic.Uint64
	wl    *admission.Waitlist // requests waiting for a room in this pool (set by install)
}

// indexOfSlot returns the worker index of a state slot in this view, or -1.
func (v *view) indexOfSlot(slot uint32) int32 {
	if int(slot) >= len(v.bySlot) {
		return -1
	}
	return v.bySlot[slot]
}

// buildView compiles the workers of a snapshot. prev (may be nil) donates
// rings and round-robin counters of pools whose membership did not change.
// states maps each worker to its long-lived state.
// With spillApart (--spill-over), external workers are in no pool: they
// are kept by model in spill, and a model they alone serve gets an empty
// pool (its requests go straight to spill-over).
func buildView(s *Snapshot, workers []Worker, states []*workerState, prev *view, maxSlot uint32, spillApart bool) *view {
	v := &view{
		epoch:    s.Epoch,
		revision: s.Revision,
		workers:  chunkedOf(workers),
		hot:      newChunked[hotWorker](len(workers)),
		states:   states,
		bySlot:   make([]int32, maxSlot),
		pools:    make(map[string]*pool),
	}
	v.sent = v.workers
	for i := range v.bySlot {
		v.bySlot[i] = -1
	}
	members := make(map[string][]int32)
	var all []int32
	pdm := newPDMembers()
	for i := range workers {
		w := &workers[i]
		*v.hot.at(int32(i)) = hotOf(w, states[i])
		v.bySlot[states[i].slot] = int32(i)
		if w.Type != "" && w.Type != TypeRegular {
			pdm.add(w, int32(i)) // PD legs are not regular candidates
			continue
		}
		if spillApart && w.Provider != nil {
			v.addSpill(w.Model, int32(i))
			if _, ok := members[w.Model]; !ok {
				members[w.Model] = nil // the model's pool exists, empty if it has no engine
			}
			continue
		}
		members[w.Model] = append(members[w.Model], int32(i))
		all = append(all, int32(i))
	}
	var like *ring
	for model, idx := range members {
		v.pools[model] = v.newPool(model, idx, prevPool(prev, model, false), nil)
		v.models = append(v.models, model)
		like = v.pools[model].ring
	}
	v.buildPD(pdm, prev)
	slices.Sort(v.models)
	if len(members) != 1 {
		like = nil
	}
	// With one model, the all-models pool has its members: one ring serves both.
	v.all = v.newPool("", all, prevPool(prev, "", true), like)
	return v
}

// hotOf is the selection summary of w.
func hotOf(w *Worker, st *workerState) hotWorker {
	return hotWorker{aheadReport: w.AheadReport, st: st, reported: w.Waiting + w.Running, waiting: w.Waiting, eligible: w.Healthy && w.Veto == VetoNone,
		healthy: w.Healthy, veto: w.Veto, over: w.Overloaded || w.Veto == VetoOverload, ahead: w.PromptTokensAhead,
		proto: protocolOf(w.URL), rank: st.rank}
}

// packRank is a worker's place in the order packed requests fill workers:
// FNV-1a of its ID, so every router, and every view after a change of
// membership, orders the same workers the same way.
func packRank(id string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(id); i++ {
		h ^= uint32(id[i])
		h *= 16777619
	}
	return h
}

// sameIndexes reports whether w may replace old in place: every index of a
// view (pools, rings, PD pairs, models) depends on a worker's identity,
// URL, model and type alone, never on its verdict or load.
func sameIndexes(old, w *Worker) bool {
	return old.ID == w.ID && old.URL == w.URL && old.Model == w.Model && old.Type == w.Type
}

func prevPool(prev *view, model string, all bool) *pool {
	if prev == nil {
		return nil
	}
	if all {
		return prev.all
	}
	return prev.pools[model]
}

// newPool builds a pool over idx, sharing old's round-robin counter, and
// old's ring or like's (either may be nil) when built over the same members
// and URLs.
func (v *view) newPool(model string, idx []int32, old *pool, like *ring) *pool {
	p := &pool{model: model, idx: idx}
	slots := make([]uint32, len(idx))
	bases := make([]uint64, len(idx))
	for i, wi := range idx {
		slots[i] = v.states[wi].slot
		bases[i] = hashString(v.worker(wi).URL)
	}
	if old != nil {
		p.rr = old.rr
		if old.ring != nil && slices.Equal(old.ring.members, slots) && slices.Equal(old.ring.bases, bases) {
			p.ring = old.ring
		}
	} else {
		p.rr = new(atomic.Uint64)
	}
	if p.ring == nil && like != nil && slices.Equal(like.members, slots) && slices.Equal(like.bases, bases) {
		p.ring = like
	}
	if p.ring == nil {
		p.ring = newRing(slots, bases)
	}
	return p
}
