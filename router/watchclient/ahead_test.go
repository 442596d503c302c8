package watchclient

import (
	"testing"
	"time"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/router"
)

// A worker's sum ahead holds the latest report the control plane
// acknowledged before the worker arrived: each worker is marked with that
// report as it arrives (a worker not sent again keeps its mark), an ack
// older than one already heard changes nothing. Reports carry their number.
func TestWorkersCarryTheReportTheirSumHolds(t *testing.T) {
	tgt := newTarget()
	now := time.Unix(1000, 0)
	c := New(nil, tgt, Options{RouterID: "r1", Now: func() time.Time { return now }}, nil)
	t.Cleanup(c.stopStale)
	rw := func(id string, ahead int64) *smgv1.RoutingWorker {
		return &smgv1.RoutingWorker{WorkerId: id, Url: "http://" + id, Healthy: true, PromptTokensAhead: ahead}
	}
	ack := func(seq uint64) {
		t.Helper()
		if err := c.handle(&smgv1.WatchResponse{Epoch: "e", Revision: 1, Msg: &smgv1.WatchResponse_ReportAck{ReportAck: &smgv1.ReportAck{Seq: seq}}}); err != nil {
			t.Fatal(err)
		}
	}
	delta := func(rev uint64, ws ...*smgv1.RoutingWorker) {
		t.Helper()
		if err := c.handle(&smgv1.WatchResponse{Epoch: "e", Revision: rev, Msg: &smgv1.WatchResponse_Delta{Delta: &smgv1.WatchDelta{Upserts: ws}}}); err != nil {
			t.Fatal(err)
		}
	}
	marks := func() map[string]uint64 {
		out := map[string]uint64{}
		for _, w := range tgt.latest().Workers {
			out[w.ID] = w.AheadReport
		}
		return out
	}
	if err := c.handle(&smgv1.WatchResponse{Epoch: "e", Revision: 1, Msg: &smgv1.WatchResponse_Snapshot{
		Snapshot: &smgv1.WatchSnapshot{Workers: []*smgv1.RoutingWorker{rw("w1", 4000), rw("w2", 100)}}}}); err != nil {
		t.Fatal(err)
	}
	if m := marks(); m["w1"] != 0 || m["w2"] != 0 {
		t.Fatalf("before any ack: %v, want no report marked", m)
	}
	ack(3)
	delta(2, rw("w1", 3000))
	if m := marks(); m["w1"] != 3 || m["w2"] != 0 {
		t.Fatalf("after ack 3: %v, want w1 at report 3, w2 (not sent again) unmarked", m)
	}
	ack(7) // acks skip: only the latest folded report is acknowledged
	ack(5) // older than one heard: changes nothing
	delta(3, rw("w2", 200))
	if m := marks(); m["w1"] != 3 || m["w2"] != 7 {
		t.Fatalf("after acks 7 and 5: %v, want w1 at 3, w2 at 7", m)
	}

	if r := report(router.Observations{Seq: 9}); r.GetSeq() != 9 {
		t.Fatalf("report seq %d, want 9", r.GetSeq())
	}
}
