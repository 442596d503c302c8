package judge

import (
	"fmt"
	"testing"
	"time"
)

// contactAt is a router's report, learned at now, of an answer that
// arrived at the offset answered.
func contactAt(answered time.Duration) event {
	return event{fmt.Sprintf("contactAt(%v)", answered), func(l *Liveness, now time.Time, r *Rules) Change {
		return l.ContactAt(t0.Add(answered), now, r)
	}}
}

// "Any successful contact clears it" counts contact from when it happened:
// an answer from before a connection failure, reported after it, is no
// contact since the failure and re-admits nothing; one after it does.
func TestContactOlderThanTheFailure(t *testing.T) {
	runAll(t, []scenario{
		{name: "an answer from before the failure reported after it leaves the veto", rules: stall(0), steps: []step{
			{0, contact(), Live, 0},
			{1 * s, fail(ConnectionFailure), Unreachable, CauseTransport},
			{1040 * ms, contactAt(990 * ms), Unreachable, CauseTransport},
			{1250 * ms, sweep(), Unreachable, CauseTransport},
			{10 * s, sweep(), Unreachable, CauseTransport},
			{11 * s, contactAt(10500 * ms), Live, CauseContact},
		}},
		{name: "a remembered failure still vetoes at the stall bound after an older answer", steps: []step{
			{0, contact(), Live, 0},
			{1 * s, fail(ConnectionFailure), Live, 0},
			{1200 * ms, contactAt(900 * ms), Live, 0},
			{2899 * ms, sweep(), Live, 0}, // heard at 900 ms: silent for less than 2 s
			{2900 * ms, sweep(), Unreachable, CauseTransport},
		}},
		{name: "an answer after the failure cancels it as contact does", steps: []step{
			{0, contact(), Live, 0},
			{1 * s, fail(ConnectionFailure), Live, 0},
			{1200 * ms, contactAt(1100 * ms), Live, 0},
			{3 * s, sweep(), Live, 0},
		}},
		{name: "an answer stamped after the report counts at the report", rules: stall(0), steps: []step{
			{0, contact(), Live, 0},
			{1 * s, fail(ConnectionFailure), Unreachable, CauseTransport},
			{2 * s, contactAt(time.Hour), Live, CauseContact},
			{3 * s, fail(ConnectionFailure), Unreachable, CauseTransport},
		}},
	})
}
