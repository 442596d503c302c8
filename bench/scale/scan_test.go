package scale

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// TestScanCodec: the synthetic routers' scan of a WatchResponse reads what a
// full decode reads (revision, kind, every listed worker's index and
// overload veto) from the control plane's bytes.
func TestScanCodec(t *testing.T) {
	workers := []*smgv1.RoutingWorker{
		{WorkerId: "w00001", Url: "http://x/w00001", Model: "m", Veto: smgv1.Veto_VETO_OVERLOAD, TokenUsage: 0.5},
		{WorkerId: "w00002", Url: "http://x/w00002", Healthy: true, Veto: smgv1.Veto_VETO_WEDGED},
		{WorkerId: "other", Veto: smgv1.Veto_VETO_OVERLOAD},
		// No veto, a load and an overload flag after where the veto goes.
		{WorkerId: "w00004", Url: "http://x/w00004", WaitingRequests: 50, TokenUsage: 0.9, Overloaded: true, OverloadReason: "x"},
		{WorkerId: "w00005", Veto: smgv1.Veto_VETO_OVERLOAD, VetoReason: "waiting", WaitingRequests: 50, LoadRevision: 9},
	}
	want := []scannedWorker{{1, true}, {2, false}, {-1, true}, {4, false}, {5, true}}
	for _, c := range []struct {
		msg      *smgv1.WatchResponse
		snapshot bool
		want     []scannedWorker
	}{
		{&smgv1.WatchResponse{Epoch: "e", Revision: 7, Msg: &smgv1.WatchResponse_Snapshot{Snapshot: &smgv1.WatchSnapshot{
			Workers: workers, Settings: &smgv1.FleetSettings{WorkerStaleSecs: 15}}}}, true, want},
		{&smgv1.WatchResponse{Epoch: "e", Revision: 9, Msg: &smgv1.WatchResponse_Delta{Delta: &smgv1.WatchDelta{
			Upserts: workers, Removed: []string{"w00003"}}}}, false, want},
		{&smgv1.WatchResponse{Epoch: "e", Revision: 11, Msg: &smgv1.WatchResponse_Heartbeat{Heartbeat: &smgv1.WatchHeartbeat{}}}, false, nil},
	} {
		raw, err := proto.Marshal(c.msg)
		if err != nil {
			t.Fatal(err)
		}
		m := scanned{workers: []scannedWorker{{5, true}}} // reused: reset by scan
		if err := (scanCodec{}).Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		if m.revision != c.msg.Revision || m.snapshot != c.snapshot || m.size != len(raw) || !slices.Equal(m.workers, c.want) {
			t.Errorf("scanned %+v from %v; want revision %d, snapshot %v, workers %v", m, c.msg, c.msg.Revision, c.snapshot, c.want)
		}
	}
	if err := (scanCodec{}).Unmarshal([]byte{0x12, 0xff}, &scanned{}); err == nil {
		t.Error("a truncated message scanned without error")
	}
}
