package agent

import (
	"testing"
	"time"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/sim"
)

// A failure that persists is sent again every FailureRepeat, not at every
// failed poll: contact the control plane heard from elsewhere since the
// first one (a router's answer) cleared it, and the spell must arm it again.
func TestPersistingFailureIsSentAgainEverySecond(t *testing.T) {
	cp := startFakeCP(t)
	eng := engineSim(t, sim.FlavorVLLM)
	clk := newClock()
	opts := fastOpts(cp.addr, eng.URL())
	opts.Now = clk.Now
	runAgent(t, opts)
	cp.next(t, "first record", recordOf(eng.URL()))
	if err := eng.SetFault(sim.Fault{Kill: true}); err != nil {
		t.Fatal(err)
	}
	failure := eventOf(eng.URL(), smgv1.EngineEventKind_ENGINE_EVENT_KIND_TRANSPORT_FAILURE)
	cp.next(t, "transport failure", failure)
	// Polls every 10 ms fail for 300 ms of real time on a clock that stands.
	if m := cp.nextWithin(300*time.Millisecond, failure); m != nil {
		t.Fatalf("a failure sent again before %s passed on the agent's clock: %v", FailureRepeat, m)
	}
	clk.Advance(FailureRepeat - time.Millisecond)
	if m := cp.nextWithin(200*time.Millisecond, failure); m != nil {
		t.Fatalf("a failure sent again %s after the first: %v", FailureRepeat-time.Millisecond, m)
	}
	clk.Advance(time.Millisecond)
	cp.next(t, "the failure again after "+FailureRepeat.String(), failure)
}
