package agentsvc

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/smg-project/smg/controlplane/judge"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// gate is an Applying hook: while held, the receive loop stops after reading
// a message, before applying it, as a control plane stuck on its own locks
// does; the agent's next messages queue unread in the connection.
type gate struct {
	mu      sync.Mutex
	held    bool
	entered chan struct{}
	release chan struct{}
	applied int           // messages the receive loop is done with
	more    chan struct{} // closed when applied grows
}

func newGate() *gate {
	return &gate{entered: make(chan struct{}, 1), release: make(chan struct{}), more: make(chan struct{})}
}

// done is the Applied hook.
func (g *gate) done() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.applied++
	close(g.more)
	g.more = make(chan struct{})
}

// waitApplied waits until the receive loop is done with n messages.
func (g *gate) waitApplied(t *testing.T, n int) {
	t.Helper()
	deadline := time.NewTimer(5 * time.Second)
	defer deadline.Stop()
	for {
		g.mu.Lock()
		got, more := g.applied, g.more
		g.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-more:
		case <-deadline.C:
			t.Fatalf("the receive loop applied %d messages, want %d", got, n)
		}
	}
}

func (g *gate) hold() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.held = true
}

// open lets the held message and every later one through.
func (g *gate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.held {
		g.held = false
		close(g.release)
	}
}

func (g *gate) applying() {
	g.mu.Lock()
	held, release := g.held, g.release
	g.mu.Unlock()
	if !held {
		return
	}
	select {
	case g.entered <- struct{}{}:
	default:
	}
	<-release
}

// readLagHarness is one agent stream on a real loopback gRPC server whose
// receive loop the gate can hold; the agent's clock runs an hour behind the
// control plane's (only differences count).
type readLagHarness struct {
	*harness
	gate   *gate
	st     clientStream
	cancel context.CancelFunc
	agent  time.Time // the agent's clock at the start
	stamp  bool      // the agent sends sent_at (older agents do not)
	sent   int       // messages sent after the hello
}

const lagURL = "http://127.0.0.1:8001"

func startReadLag(t *testing.T, stamp bool) *readLagHarness {
	t.Helper()
	g := newGate()
	cfg := defaultConfig()
	cfg.opts.Applying, cfg.opts.Applied = g.applying, g.done
	h := start(t, cfg)
	t.Cleanup(g.open) // before the server stops (cleanups run last first)
	h.put(t, worker("w1", lagURL, ""))
	ctx, cancel := context.WithCancel(t.Context())
	st, _ := h.open(t, ctx, &smgv1.AgentHello{Node: "n1"})
	return &readLagHarness{harness: h, gate: g, st: st, cancel: cancel, agent: h.clock.Now().Add(-time.Hour), stamp: stamp}
}

// send sends m as sent d after the start on the agent's clock.
func (r *readLagHarness) send(t *testing.T, d time.Duration, m *smgv1.ReportRequest) {
	t.Helper()
	if r.stamp {
		m.SentAt = timestamppb.New(r.agent.Add(d))
	}
	send(t, r.st, m)
	r.sent++
}

// pass lets d pass on the control plane's clock, sweeping every
// judge.SweepInterval as the control plane does (a sweep much later than
// that is a stall of the process, which the streams are credited with).
func (r *readLagHarness) pass(d time.Duration) {
	for end := r.clock.Now().Add(d); r.clock.Now().Before(end); {
		r.clock.Advance(min(judge.SweepInterval, end.Sub(r.clock.Now())))
		r.tr.Sweep(r.clock.Now())
	}
}

// applied waits until the control plane is done with every message sent:
// the stream is read to the end and its receive loop waits for more.
func (r *readLagHarness) applied(t *testing.T) {
	t.Helper()
	r.gate.waitApplied(t, r.sent)
}

func heartbeat(urls ...string) *smgv1.ReportRequest {
	return &smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Heartbeat{Heartbeat: &smgv1.AgentHeartbeat{WorkerUrls: urls}}}
}

func (r *readLagHarness) liveness() smgv1.Veto { return r.reg.Snapshot().Get("w1").Liveness }

// A real stream whose receive loop is held (records queued unread) while
// the control plane's clock passes the stale bound: with the agent's
// sent_at, nothing is vetoed; an older agent's stream (no sent_at) gets the
// veto the rule gave before. Resumed, the queue is read and applied; then
// the agent really goes silent and is vetoed at the stale bound.
func TestStreamReadLateVetoesNothing(t *testing.T) {
	for _, tc := range []struct {
		name     string
		stamp    bool
		wantVeto smgv1.Veto
	}{
		{"agent says its clock", true, smgv1.Veto_VETO_UNSPECIFIED},
		{"older agent, no sent_at: vetoed as before", false, smgv1.Veto_VETO_UNREACHABLE},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startReadLag(t, tc.stamp)
			r.send(t, 0, record(lagURL, 0))
			r.applied(t)

			r.gate.hold()
			r.send(t, 500*time.Millisecond, heartbeat(lagURL))
			<-r.gate.entered // read, held before it is applied
			for i := 1; i <= 10; i++ {
				r.send(t, time.Duration(i)*2*time.Second, heartbeat(lagURL)) // queued unread
			}
			r.pass(20 * time.Second)
			if got := r.liveness(); got != tc.wantVeto {
				t.Fatalf("after 20 s not reading: liveness %v, want %v", got, tc.wantVeto)
			}

			r.gate.open()
			r.send(t, 21*time.Second, record(lagURL, 6)) // over the ceiling
			r.applied(t)
			if w := r.reg.Snapshot().Get("w1"); !w.Overloaded || w.Liveness != smgv1.Veto_VETO_UNSPECIFIED {
				t.Fatalf("the queue applied: overloaded %v, liveness %v; want the last record's load and no veto", w.Overloaded, w.Liveness)
			}

			// The agent really goes silent, its stream open and read to the end.
			r.pass(15*time.Second - judge.SweepInterval)
			if got := r.liveness(); got != smgv1.Veto_VETO_UNSPECIFIED {
				t.Fatalf("vetoed before the stale bound: %v", got)
			}
			r.pass(judge.SweepInterval)
			if got := r.liveness(); got != smgv1.Veto_VETO_UNREACHABLE {
				t.Fatalf("silent for the stale bound: liveness %v, want unreachable", got)
			}
			closeCleanly(t, r.st)
		})
	}
}

// A held receive loop gives no credit to a stream that breaks: its workers
// record the connection failure and are vetoed after --worker-stall-secs,
// and the message read before the break, applied after it, lifts nothing.
func TestCutOffStreamIsVetoedWhileItsReceiveLoopIsHeld(t *testing.T) {
	r := startReadLag(t, true)
	ended := make(chan string, 1)
	r.srv.ended = func(node string) { ended <- node }
	r.send(t, 0, record(lagURL, 0))
	r.applied(t)

	r.gate.hold()
	r.send(t, time.Second, heartbeat(lagURL))
	<-r.gate.entered
	r.clock.Advance(time.Second)
	r.cancel() // the agent vanishes
	<-ended
	r.pass(2 * time.Second) // --worker-stall-secs
	if got := r.liveness(); got != smgv1.Veto_VETO_UNREACHABLE {
		t.Fatalf("cut-off agent's worker: liveness %v, want unreachable", got)
	}
	r.gate.open()
	r.pass(time.Second)
	if got := r.liveness(); got != smgv1.Veto_VETO_UNREACHABLE {
		t.Fatalf("the heartbeat read before the break lifted the veto: %v", got)
	}
}

// A lying agent (its clock frozen) that keeps the stream busy with another
// worker's records but stops mentioning w1 holds w1 in routing at most
// --worker-stale-secs longer: vetoed at 30 s, not before.
func TestLyingAgentHoldsASilentWorkerAtMostTheBound(t *testing.T) {
	r := startReadLag(t, true)
	r.put(t, worker("w2", "http://127.0.0.1:8002", ""))
	r.send(t, 0, record(lagURL, 0))
	r.applied(t)
	for at := time.Duration(0); at < 30*time.Second; at += time.Second {
		r.send(t, 0, record("http://127.0.0.1:8002", int32(at/time.Second)%3)) // sent_at frozen at 0
		r.applied(t)
		r.tr.Sweep(r.clock.Now())
		if got := r.liveness(); got != smgv1.Veto_VETO_UNSPECIFIED {
			t.Fatalf("w1 vetoed %v after %v: before the stale bound plus the cap", got, at)
		}
		r.pass(time.Second - judge.SweepInterval)
		r.clock.Advance(judge.SweepInterval)
	}
	r.tr.Sweep(r.clock.Now())
	if got := r.liveness(); got != smgv1.Veto_VETO_UNREACHABLE {
		t.Fatalf("w1, silent 30 s behind a frozen clock: liveness %v, want unreachable", got)
	}
	closeCleanly(t, r.st)
}
