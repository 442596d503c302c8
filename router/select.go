package router

// outcome says how a worker was chosen, or why none was.
type outcome uint8

const (
	chosen           outcome = iota // the policy picked an eligible worker
	overloadFallback                // every candidate vetoed: steered to an overloaded one
	livenessFallback                // steered to one the liveness tracker doubts
	shedAll                         // --worker-overload-shed and every candidate overloaded
	noneAvailable                   // nothing routable: no_available_workers
	full                            // an eligible worker exists but none has room: wait for one
)

// choose runs the policy and, when it finds nobody eligible, applies the
// spec's "When Every Candidate Is Vetoed" rules. It returns a worker index for
// chosen and the two fallbacks, -1 otherwise.
func (s *selector) choose(v *view, p *pool, q *request, shed bool) (int32, outcome) {
	if i := s.pick(v, p, q); i >= 0 {
		return i, chosen
	}
	if q.avoid != nil {
		// A retry avoids the worker that just failed, unless it is the only one left.
		avoid := q.avoid
		q.avoid = nil
		i := s.pick(v, p, q)
		q.avoid = avoid
		if i >= 0 {
			return i, chosen
		}
	}
	return s.steer(v, p, q, shed)
}

// steer classifies a pool in which no worker is eligible. Routable means
// healthy with a closed or half-open breaker; among routable workers, those
// vetoed by overload alone are taken before those the liveness tracker doubts.
// With a window (q.need > 0) only a worker with room is returned; a full
// worker is skipped but is not vetoed: when a worker that is not vetoed is
// merely full, the request waits for a room (full) rather than steering or
// shedding.
func (s *selector) steer(v *view, p *pool, q *request, shed bool) (int32, outcome) {
	bestOverload, bestLiveness := int32(-1), int32(-1)
	var overloadLoad, livenessLoad int64
	unroutable, anyOverload, anyLiveness, sawFull := false, false, false, false
	for _, i := range p.idx {
		w := v.hot.at(i)
		if !w.healthy || !w.st.routable(s.cb, q.now) {
			unroutable = true
			continue
		}
		room := q.need == 0 || w.st.gate.HasRoom(q.need, q.tokens)
		l := w.load()
		switch {
		case w.veto == VetoOverload:
			anyOverload = true
			if room && (bestOverload < 0 || l < overloadLoad) {
				bestOverload, overloadLoad = i, l
			}
		case w.veto.liveness():
			if shed && w.over {
				// Doubted and over its ceiling too: shedding answers its
				// overload, so it is never the fallback.
				anyOverload = true
				continue
			}
			anyLiveness = true
			if room && (bestLiveness < 0 || l < livenessLoad) {
				bestLiveness, livenessLoad = i, l
			}
		case !room || !q.meets(w):
			sawFull = true // not vetoed, only full (or not meeting the TTFT objective now): its room frees
		default:
			// Routable and not vetoed, yet the policy found nobody: the
			// snapshot view is immutable, so only a breaker that tripped
			// meanwhile gets here. Take it as a plain choice.
			return i, chosen
		}
	}
	if sawFull {
		return -1, full
	}
	if shed {
		// Shedding answers overload only: a liveness veto still steers, and
		// an overloaded worker is never the fallback while shedding is on.
		switch {
		case bestLiveness >= 0:
			return bestLiveness, livenessFallback
		case anyLiveness:
			return -1, full
		case anyOverload && !unroutable:
			return -1, shedAll
		}
		return -1, noneAvailable // mixed causes are not a shed
	}
	switch {
	case bestOverload >= 0:
		return bestOverload, overloadFallback
	case bestLiveness >= 0:
		return bestLiveness, livenessFallback
	case anyOverload || anyLiveness:
		return -1, full
	}
	return -1, noneAvailable
}
