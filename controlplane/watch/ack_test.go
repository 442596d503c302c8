package watch

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// A folded report is acknowledged before the first message at or past the
// revision read after its fold, never before: only the latest such report,
// the older ones superseded; reports folded with nothing committed between
// merge; an older report after a newer one is not acknowledged.
func TestAckableTakesTheLatestReportARevisionHolds(t *testing.T) {
	var r routerRecord
	r.folded(1, 5)
	r.folded(2, 7)
	r.folded(3, 7) // nothing committed since report 2: it replaces it
	r.folded(2, 9) // older than report 3: nothing to tell
	if got := r.ackable(4); got != 0 {
		t.Fatalf("ackable(4) = %d, want none (report 1 folded by 5)", got)
	}
	if got := r.ackable(6); got != 1 {
		t.Fatalf("ackable(6) = %d, want 1", got)
	}
	if got := r.ackable(6); got != 0 {
		t.Fatalf("ackable(6) again = %d, want none (acknowledged once)", got)
	}
	if got := r.ackable(100); got != 3 {
		t.Fatalf("ackable(100) = %d, want 3", got)
	}
	if len(r.acks) != 0 {
		t.Fatalf("left %v, want nothing pending", r.acks)
	}
	for i := range uint64(3 * maxAcks) {
		r.folded(10+i, 10+i)
	}
	if len(r.acks) != maxAcks {
		t.Fatalf("%d pending, want at most %d", len(r.acks), maxAcks)
	}
	if got := r.ackable(1000); got != 10+3*maxAcks-1 {
		t.Fatalf("ackable(1000) = %d, want the newest report %d", got, 10+3*maxAcks-1)
	}
}

// foldingSink folds each report into the registry as the evidence does: w1's
// sum ahead is the other routers' 1,000,000 plus the reporting router's
// tokens in flight there (tokens: the report's number, so a sum says which
// report it holds).
type foldingSink struct {
	reg    *registry.Registry
	t      testing.TB
	folded chan uint64
}

func (s foldingSink) RouterObservations(_ string, rep *smgv1.RouterReport, _ time.Time) {
	_, err := s.reg.Update(func(txn *registry.Txn) error {
		w := txn.Get("w1").Clone()
		setAhead(w, othersAhead+rep.GetWorkers()[0].GetPromptTokensInFlight())
		txn.Insert(w)
		return nil
	})
	if err != nil {
		s.t.Error(err)
	}
	s.folded <- rep.GetSeq()
}
func (foldingSink) RouterGone(string) {}

const othersAhead = 1_000_000

// setAhead sets w's prompt tokens ahead as the evidence does (Insert takes
// them from it).
func setAhead(w *registry.Worker, tokens int64) {
	w.Evidence.Live.Routers(time.Time{}, judge.RouterObservation{PrefillTokens: tokens}, &judge.Rules{})
}

// Over a real gRPC stream, with routing changes committed concurrently:
// every w1 the router receives holds the report acknowledged last before it
// or a later one, never an earlier one; each numbered report is
// acknowledged once a message holding it goes, and an unnumbered one never.
func TestReportAckPrecedesEverySumThatHoldsIt(t *testing.T) {
	reg := registry.New(testEpoch, 0)
	put(t, reg, newWorker("w1"), newWorker("w2"))
	sink := foldingSink{reg: reg, t: t, folded: make(chan uint64, 1)}
	h := start(t, reg, Options{HeartbeatInterval: time.Hour, LoadInterval: -1, Sink: sink})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	st := h.watch(t, ctx, &smgv1.WatchHello{RouterId: "r1"})
	if m := recv(t, st); m.GetSnapshot() == nil {
		t.Fatalf("first message %v, want the snapshot", m)
	}
	// Routing changes on w2 race the folds (and the revision read after them).
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			setOverloaded(t, reg, "w2", i%2 == 0)
		}
	})
	var acked uint64
	w1s := 0 // w1 received in deltas
	report := func(seq uint64, tokens int64) {
		t.Helper()
		rep := &smgv1.RouterReport{Seq: seq, Workers: []*smgv1.WorkerObservation{{WorkerId: "w1", PromptTokensInFlight: tokens}}}
		if err := st.Send(&smgv1.WatchRequest{Msg: &smgv1.WatchRequest_Report{Report: rep}}); err != nil {
			t.Fatal(err)
		}
		<-sink.folded
	}
	// readUntil reads until cond, checking every w1 against the acks.
	readUntil := func(cond func(m *smgv1.WatchResponse) bool) {
		t.Helper()
		for {
			m := recv(t, st)
			if a := m.GetReportAck(); a != nil {
				if a.GetSeq() <= acked {
					t.Fatalf("ack %d after ack %d", a.GetSeq(), acked)
				}
				acked = a.GetSeq()
			}
			for _, w := range m.GetDelta().GetUpserts() {
				if w.GetWorkerId() != "w1" {
					continue
				}
				w1s++
				if held := uint64(w.GetPromptTokensAhead() - othersAhead); held < acked {
					t.Fatalf("w1 holding report %d after the ack of %d", held, acked)
				}
			}
			if cond(m) {
				return
			}
		}
	}
	for seq := uint64(1); seq <= 50; seq++ {
		report(seq, int64(seq))
		readUntil(func(*smgv1.WatchResponse) bool { return acked == seq })
	}
	close(stop)
	wg.Wait()
	// Unnumbered (an older router): folded, never acknowledged.
	report(0, 51)
	final := setOverloaded(t, reg, "w2", true)
	readUntil(func(m *smgv1.WatchResponse) bool { return m.Revision >= final && m.GetDelta() != nil })
	if acked != 50 || w1s < 50 {
		t.Fatalf("acked %d after an unnumbered report, w1 received %d times; want still 50, at least 50", acked, w1s)
	}
}

// collectStream keeps every message sent, decoded as a router decodes it.
type collectStream struct {
	fakeStream
	got []*smgv1.WatchResponse
}

func (c *collectStream) SendMsg(m any) error {
	got, err := decodeSent(m)
	if err == nil {
		c.got = append(c.got, got)
	}
	return err
}

// The ack of a report goes right before the first message of workers read
// at or past the revision read after its fold, not before one read earlier:
// a report whose fold was read at a later revision than a delta waits for
// the next one. Every w1 after an ack holds exactly the report acknowledged.
func TestReportAckGoesWithTheFirstMessageThatHoldsIt(t *testing.T) {
	reg := registry.New(testEpoch, 0)
	put(t, reg, newWorker("w1"), newWorker("w2"))
	s := NewServer(reg, Options{HeartbeatInterval: time.Hour, LoadInterval: -1}, nil, nil)
	cs := &collectStream{fakeStream: fakeStream{ctx: t.Context()}}
	rec := &routerRecord{id: "r1"}
	w := s.newWatcher(cs, rec, &smgv1.WatchHello{RouterId: "r1"})
	pass := func() []*smgv1.WatchResponse {
		t.Helper()
		cs.got = nil
		w.mu.Lock()
		defer w.mu.Unlock()
		if _, err := w.pass(time.Now()); err != nil {
			t.Fatal(err)
		}
		return cs.got
	}
	fold := func(seq uint64) uint64 {
		w1 := reg.Snapshot().Get("w1").Clone()
		setAhead(w1, othersAhead+int64(seq))
		return put(t, reg, w1)
	}
	if got := pass(); len(got) != 1 || got[0].GetSnapshot() == nil {
		t.Fatalf("first pass sent %v, want the snapshot", got)
	}
	rec.folded(1, fold(1))
	rec.folded(2, reg.Revision()+2) // read after two more commits: held from then on
	setOverloaded(t, reg, "w2", true)
	got := pass()
	if len(got) != 2 || got[0].GetReportAck().GetSeq() != 1 || got[1].GetDelta() == nil {
		t.Fatalf("second pass sent %v, want ack 1 then a delta", got)
	}
	for _, u := range got[1].GetDelta().GetUpserts() {
		if u.GetWorkerId() == "w1" && u.GetPromptTokensAhead() != othersAhead+1 {
			t.Fatalf("w1 ahead %d after ack 1, want report 1's", u.GetPromptTokensAhead())
		}
	}
	setOverloaded(t, reg, "w2", false)
	fold(2)
	got = pass()
	if len(got) != 2 || got[0].GetReportAck().GetSeq() != 2 || len(got[1].GetDelta().GetUpserts()) != 2 {
		t.Fatalf("third pass sent %v, want ack 2 then a delta of w1 and w2", got)
	}
	// Nothing to send: no ack either, whatever is folded.
	rec.folded(3, reg.Revision())
	if got := pass(); len(got) != 0 {
		t.Fatalf("a pass with nothing new sent %v, want nothing", got)
	}
}
