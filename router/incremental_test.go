package router

import (
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/smg-project/smg/router/admission"
)

// The view a router builds incrementally (ApplyDelta patching its previous
// view, FailOpen, Apply reusing rings) must be the view it would build from
// scratch from the same workers: same entries, same indexes, same rings,
// same routing decisions. Random sequences of snapshots and deltas (flips,
// loads, windows, joins, removals, URL/model/type changes, fail-open,
// settings) drive one router; after each step its view is compared with
// buildView over the expected workers, and the previous view with a copy
// taken before the step (a published view is never written).

var incModels = []string{"m-a", "m-b", "m-c"}

// incWorker is a random worker with id; URLs come from a small set, so two
// workers sometimes share one (equal ring hashes).
func incWorker(rng *rand.Rand, id string) Worker {
	w := Worker{
		ID:    id,
		URL:   fmt.Sprintf("http://10.0.0.%d:8000", rng.IntN(150)),
		Model: incModels[rng.IntN(len(incModels))],
		Type:  TypeRegular, Healthy: true, LoadRevision: rng.Uint64N(1000),
		Waiting: rng.Int64N(20), Running: rng.Int64N(20), MaxRunning: 16, AdmissionRooms: 20,
	}
	switch rng.IntN(8) {
	case 0:
		w.Type = TypePrefill
	case 1:
		w.Type = TypeDecode
	case 2:
		w.Type = ""
	}
	incVerdict(rng, &w)
	return w
}

func incVerdict(rng *rand.Rand, w *Worker) {
	w.Veto, w.VetoReason, w.Overloaded, w.OverloadReason = VetoNone, "", false, ""
	switch rng.IntN(6) {
	case 0:
		w.Veto, w.VetoReason, w.Overloaded = VetoOverload, "waiting", true
	case 1:
		w.Veto, w.VetoReason = VetoUnreachable, "silent"
	case 2:
		w.Veto, w.Overloaded = VetoWedged, true
	case 3:
		w.Healthy = !w.Healthy
	}
}

// incChange changes w the way a control plane delta would: its verdict,
// load or window, and, unless light, its URL, model or type.
func incChange(rng *rand.Rand, w *Worker, light bool) {
	n := 10
	if light {
		n = 7
	}
	switch rng.IntN(n) {
	case 0, 1, 2:
		incVerdict(rng, w)
	case 3, 4, 5:
		w.Waiting, w.Running, w.TokenUsage = rng.Int64N(30), rng.Int64N(30), rng.Float64()
		if rng.IntN(2) == 0 {
			w.LoadRevision++
		}
	case 6:
		w.WindowShare, w.AdmissionRooms, w.MaxRunning = rng.Int64N(5)-1, rng.Int64N(25), rng.Int64N(20)
	case 7:
		w.URL = fmt.Sprintf("http://10.0.1.%d:8000", rng.IntN(150))
	case 8:
		w.Model = incModels[rng.IntN(len(incModels))]
	case 9:
		w.Type = []string{TypeRegular, "", TypePrefill, TypeDecode}[rng.IntN(4)]
	}
}

func sortedWorkers(m map[string]Worker) []Worker {
	out := make([]Worker, 0, len(m))
	for _, id := range slices.Sorted(maps.Keys(m)) {
		out = append(out, m[id])
	}
	return out
}

func TestIncrementalViewMatchesScratch(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { incrementalRun(t, seed) })
	}
}

func incrementalRun(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 15))
	opts := DefaultOptions()
	opts.WorkerAdmissionWindow = true
	r, err := New(opts, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	truth := map[string]Worker{}
	for i := range 200 {
		id := fmt.Sprintf("w%03d", i*3/2)
		truth[id] = incWorker(rng, id)
	}
	rev := uint64(1)
	r.Apply(&Snapshot{Epoch: "e1", Revision: rev, Workers: sortedWorkers(truth)})
	failOpen, patched := false, 0
	for step := range 100 {
		prev := r.view.Load()
		prevWorkers, prevSent := prev.workers.flat(), prev.sent.flat()
		rev++
		// Some dispatches counted since the last report, to see them reset.
		for i := range prev.size() {
			prev.states[i].dispatched.Add(int64(rng.IntN(3)))
		}
		indexesKept := true
		what := ""
		switch op := rng.IntN(20); {
		case op == 0:
			what = "snapshot"
			s := &Snapshot{Epoch: "e1", Revision: rev, Workers: sortedWorkers(truth)}
			if rng.IntN(2) == 0 {
				s.Settings = &FleetSettings{LoadMonitorIntervalSecs: 1 + rng.IntN(5), WorkerStaleSecs: rng.IntN(20)}
			}
			r.Apply(s)
			if s.Settings != nil && *r.fleet.Load() != *s.Settings {
				t.Fatalf("step %d: settings %+v, want %+v", step, *r.fleet.Load(), *s.Settings)
			}
			failOpen = false
		case op == 1:
			what = "fail-open"
			r.FailOpen()
			failOpen = true
		default:
			what = "delta"
			d := &Delta{Epoch: "e1", Revision: rev}
			ids := slices.Sorted(maps.Keys(truth))
			light := rng.IntN(3) > 0 // verdicts, loads and windows only
			for range 1 + rng.IntN(12) {
				var w Worker
				switch k := rng.IntN(30); {
				case light && len(ids) > 0:
					w = truth[ids[rng.IntN(len(ids))]]
					incChange(rng, &w, true)
				case k == 0 || len(ids) == 0: // a join
					id := fmt.Sprintf("w%03d", rng.IntN(400))
					w = incWorker(rng, id)
				case k == 1: // a removal (sometimes of an unknown worker)
					id := fmt.Sprintf("w%03d", rng.IntN(400))
					d.Removed = append(d.Removed, id)
					if _, ok := truth[id]; ok {
						indexesKept = false
					}
					delete(truth, id)
					continue
				default:
					w = truth[ids[rng.IntN(len(ids))]]
					incChange(rng, &w, false)
				}
				if old, ok := truth[w.ID]; !ok || !sameIndexes(&old, &w) {
					indexesKept = false
				}
				truth[w.ID] = w
				d.Upserts = append(d.Upserts, w)
			}
			// A removal wins over an upsert of the same delta, as in the
			// watch client (it applies upserts, then removals).
			for _, id := range d.Removed {
				delete(truth, id)
			}
			r.ApplyDelta(d)
			if failOpen {
				indexesKept = false // verdicts come back: a rebuild
			}
			failOpen = false
		}
		v := r.view.Load()
		if v == prev && !(what == "fail-open" && prev.failOpen) {
			t.Fatalf("step %d (%s): no new view", step, what)
		}
		if !slices.Equal(prev.workers.flat(), prevWorkers) || !slices.Equal(prev.sent.flat(), prevSent) {
			t.Fatalf("step %d (%s): the previous view was written", step, what)
		}
		if what == "delta" && indexesKept {
			patched++
			if v.all != prev.all || !maps.Equal(v.pools, prev.pools) || v.pdAll != prev.pdAll || !maps.Equal(v.pd, prev.pd) {
				t.Fatalf("step %d: a delta that changes no index rebuilt the pools", step)
			}
		}
		want := sortedWorkers(truth)
		compareScratch(t, fmt.Sprintf("step %d (%s)", step, what), r, v, want, failOpen)
	}
	if patched < 40 {
		t.Fatalf("only %d deltas were patched in place", patched)
	}
}

// compareScratch checks v against the view built from scratch over sent
// (vetoes dropped when failOpen), the router's gates and its decisions.
func compareScratch(t *testing.T, at string, r *Router, v *view, sent []Worker, failOpen bool) {
	t.Helper()
	workers := slices.Clone(sent)
	if failOpen {
		for i := range workers {
			workers[i].Veto, workers[i].VetoReason, workers[i].Overloaded, workers[i].OverloadReason = VetoNone, "", false, ""
		}
	}
	if v.failOpen != failOpen {
		t.Fatalf("%s: failOpen %v, want %v", at, v.failOpen, failOpen)
	}
	if !slices.Equal(v.sent.flat(), sent) || !slices.Equal(v.workers.flat(), workers) {
		t.Fatalf("%s: the view's workers differ from the state sent", at)
	}
	states := make([]*workerState, len(workers))
	for i := range workers {
		if states[i] = r.states[workers[i].ID]; states[i] == nil {
			t.Fatalf("%s: no state for %s", at, workers[i].ID)
		}
	}
	if len(r.states) != len(workers) {
		t.Fatalf("%s: %d states for %d workers", at, len(r.states), len(workers))
	}
	s := buildView(&Snapshot{Epoch: v.epoch, Revision: v.revision}, workers, states, nil, r.nextSlot, r.opts.SpillOver)
	if !slices.Equal(v.states, s.states) || !slices.Equal(v.hot.flat(), s.hot.flat()) {
		t.Fatalf("%s: states or selection summaries differ", at)
	}
	if !slices.Equal(v.bySlot, s.bySlot) || !slices.Equal(v.models, s.models) {
		t.Fatalf("%s: slots %v / %v or models %v / %v differ", at, v.bySlot, s.bySlot, v.models, s.models)
	}
	if len(v.pools) != len(s.pools) || len(v.pd) != len(s.pd) || (v.pdAll == nil) != (s.pdAll == nil) {
		t.Fatalf("%s: pools differ", at)
	}
	pools := [][2]*pool{{v.all, s.all}}
	for m, p := range s.pools {
		pools = append(pools, [2]*pool{v.pools[m], p})
	}
	for m, pp := range s.pd {
		pools = append(pools, [2]*pool{v.pd[m].prefill, pp.prefill}, [2]*pool{v.pd[m].decode, pp.decode})
	}
	if s.pdAll != nil {
		pools = append(pools, [2]*pool{v.pdAll.prefill, s.pdAll.prefill}, [2]*pool{v.pdAll.decode, s.pdAll.decode})
	}
	for _, pair := range pools {
		a, b := pair[0], pair[1]
		if a == nil || a.model != b.model || a.kind != b.kind || !slices.Equal(a.idx, b.idx) ||
			!slices.Equal(a.ring.members, b.ring.members) || !slices.Equal(a.ring.points, b.ring.points) {
			t.Fatalf("%s: pool %q (%s) differs from scratch", at, b.model, b.kind)
		}
		if a.wl == nil && a.kind != TypePrefill {
			t.Fatalf("%s: pool %q (%s) has no waitlist", at, b.model, b.kind)
		}
	}
	var capacity fleetCap
	for i := range workers {
		w, st := &workers[i], states[i]
		rooms, mode := r.windowRooms(w)
		limit, window := admission.GateLimit(rooms, w.WindowShare, mode == PDWindowPerRouter), rooms
		if rooms <= 0 && w.Type != TypeDecode {
			limit, window = admission.Unlimited, 0
		}
		capacity.add(w, limit, window, 1)
		if st.gate.Limit() != limit || st.gate.Window() != window || (st.wls.Load() != nil) != (rooms > 0 || w.Type == TypeDecode) {
			t.Fatalf("%s: %s gated at %d/%d, want %d/%d", at, w.ID, st.gate.Limit(), st.gate.Window(), limit, window)
		}
		if st.loadRevision != w.LoadRevision {
			t.Fatalf("%s: %s counts dispatches since report %d, want %d", at, w.ID, st.loadRevision, w.LoadRevision)
		}
	}
	if got := r.fleetCap; got.sum != capacity.sum || got.windows != capacity.windows || got.unlimited != capacity.unlimited ||
		!maps.Equal(got.pools(), capacity.pools()) {
		t.Fatalf("%s: the scheduler's capacity from the fleet is %+v, want %+v", at, r.fleetCap, capacity)
	}
	// Decisions for fixed keys, under the key-hashing policies, shedding
	// or not: the incremental view and the scratch one choose alike.
	for _, policy := range []string{PolicyConsistentHashing, PolicyPrefixHash} {
		sel := r.sel
		sel.policy = policy
		for _, pair := range pools {
			for k := range 8 {
				q := request{key: fmt.Sprintf("key-%d", k), need: int64(k % 2)}
				for _, shed := range []bool{false, true} {
					qa, qb := q, q
					ia, oa := sel.choose(v, pair[0], &qa, shed)
					ib, ob := sel.choose(s, pair[1], &qb, shed)
					if ia != ib || oa != ob {
						t.Fatalf("%s: %s key-%d in pool %q (%s): %d/%d, scratch %d/%d", at, policy, k, pair[1].model, pair[1].kind, ia, oa, ib, ob)
					}
				}
			}
		}
	}
}

// withDelta keeps ID order: joins take their place, removals win, the
// last upsert of an ID wins.
func TestWithDelta(t *testing.T) {
	base := []Worker{{ID: "b"}, {ID: "d"}, {ID: "f"}}
	got := withDelta(base, &Delta{
		Upserts: []Worker{{ID: "e", URL: "1"}, {ID: "a"}, {ID: "d", URL: "x"}, {ID: "e", URL: "2"}, {ID: "g"}, {ID: "c"}},
		Removed: []string{"f", "g", "zz"},
	})
	want := []Worker{{ID: "a"}, {ID: "b"}, {ID: "c"}, {ID: "d", URL: "x"}, {ID: "e", URL: "2"}}
	if !slices.Equal(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

// Within one delta the last upsert of a worker wins, even when it restores
// the entry held.
func TestDeltaLastUpsertWins(t *testing.T) {
	h := newHarness(t, nil)
	a := Worker{ID: "a", URL: "http://a", Model: testModel, Healthy: true}
	h.apply(a)
	b := a
	b.Veto = VetoOverload
	h.r.ApplyDelta(&Delta{Revision: 5, Upserts: []Worker{b, a}})
	if v := h.r.view.Load(); *v.worker(0) != a || !v.hot.at(0).eligible || v.revision != 5 {
		t.Fatalf("held %+v, want %+v", *v.worker(0), a)
	}
	h.r.ApplyDelta(&Delta{Revision: 6, Upserts: []Worker{a, b}})
	if v := h.r.view.Load(); *v.worker(0) != b || v.hot.at(0).eligible {
		t.Fatalf("held %+v, want %+v", *v.worker(0), b)
	}
}
