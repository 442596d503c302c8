package admission

import (
	"fmt"
	"math"
	"time"
)

// A TTFT objective is the longest time to first token a class's requests
// should see, counted from their arrival in the router. With one, a request
// goes only to a worker whose predicted TTFT meets what is left of it; when
// none does now, it waits only while a worker that would meet it lacks a
// room, and is refused at once otherwise.

// Bounds of a TTFT objective: below a millisecond or above ten minutes it is
// a mistake (milliseconds written as seconds, or the reverse), not an
// objective.
const (
	MinObjective = time.Millisecond
	MaxObjective = 10 * time.Minute
)

// ObjectiveFromSecs validates an objective given in seconds.
func ObjectiveFromSecs(s float64) (time.Duration, error) {
	switch {
	case math.IsNaN(s) || s <= 0:
		return 0, fmt.Errorf("must be > 0 seconds, got %v", s)
	case s < MinObjective.Seconds() || s > MaxObjective.Seconds():
		return 0, fmt.Errorf("must be within [%v, %v] seconds, got %v", MinObjective.Seconds(), MaxObjective.Seconds(), s)
	}
	return time.Duration(s * float64(time.Second)), nil
}

// Candidate is one routable worker as the objective gate sees it.
type Candidate struct {
	TTFT      time.Duration // predicted time to first token of the request there
	Predicted bool          // TTFT is usable; a worker without one fails open (meets any objective)
	Room      bool          // it has room for the request now
}

// meets reports whether c would meet what is left of the objective.
func (c Candidate) meets(left time.Duration) bool { return !c.Predicted || c.TTFT <= left }

// ObjectiveVerdict is what the gate makes of a request.
type ObjectiveVerdict uint8

const (
	ObjectiveGo     ObjectiveVerdict = iota // a worker with room meets it: dispatch there
	ObjectiveWait                           // one would, once it has a room: wait at most the returned time
	ObjectiveRefuse                         // none will in time: refuse at once
)

// DecideObjective decides for a request with left of its objective remaining
// among the routable candidates. Wait carries the longest wait after which
// the best candidate could no longer meet it; Refuse carries when a retry
// may: the time the best candidate's work ahead needs to drain by the
// excess (at least a second). No candidate: Go (the routing rules answer).
func DecideObjective(left time.Duration, cands []Candidate) (v ObjectiveVerdict, wait, retryAfter time.Duration) {
	if len(cands) == 0 {
		return ObjectiveGo, 0, 0
	}
	best, predicted, openFull := time.Duration(math.MaxInt64), false, false
	for _, c := range cands {
		if left > 0 && c.Room && c.meets(left) {
			return ObjectiveGo, 0, 0
		}
		if !c.Predicted {
			openFull = openFull || !c.Room
			continue
		}
		if c.TTFT < best {
			best, predicted = c.TTFT, true
		}
	}
	switch {
	case left <= 0:
		// Already waited its whole objective (in the door's queue).
	case openFull:
		return ObjectiveWait, left, 0 // a full worker with no prediction: fail open, wait for its room
	case predicted && best < left:
		return ObjectiveWait, left - best, 0
	}
	retry := time.Second
	if predicted {
		retry = max(retry, best-max(left, 0))
	}
	return ObjectiveRefuse, 0, retry
}

// DecideObjectiveIn is DecideObjective for a request of pool wl (nil: the
// pool has no window to wait in): a Wait stands only when the pool's rooms
// are all but sure to come in time (SureWait within the wait), and turns
// into a refusal at once otherwise, not at the end of a wait that may well
// fail; Retry-After is when the queue is expected to have drained by the
// excess (ExpectedWait less the wait, at least a second). With too few
// recent grants to know the pace it stands.
func DecideObjectiveIn(wl *Waitlist, left time.Duration, cands []Candidate) (v ObjectiveVerdict, wait, retryAfter time.Duration) {
	v, wait, retryAfter = DecideObjective(left, cands)
	if v == ObjectiveWait && wl != nil {
		if sure, ok := wl.SureWait(); ok && sure > wait {
			exp, _ := wl.ExpectedWait()
			return ObjectiveRefuse, 0, max(time.Second, exp-wait)
		}
	}
	return v, wait, retryAfter
}
