package watchclient

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/router"
)

// What one router spends per change on its own machine: the watch client's
// path from the bytes gRPC hands it (proto.Unmarshal, as gRPC's codec does)
// through handle to the real router's Apply, against a 10,000-worker fleet.
// The scale harness's synthetic routers skip this work (they scan for
// revisions and vetoes), so it is measured here instead.

const benchFleet = 10_000

// benchWorker is a worker as the control plane sends it (watch.RoutingWorker
// fills these fields), with a load.
func benchWorker(i int, veto smgv1.Veto) *smgv1.RoutingWorker {
	w := &smgv1.RoutingWorker{
		WorkerId:           fmt.Sprintf("w%05d", i),
		Url:                fmt.Sprintf("http://10.0.%d.%d:8000", i/250, i%250),
		Model:              "meta-llama/Llama-3.1-8B-Instruct",
		WorkerType:         "regular",
		Priority:           50,
		Cost:               1,
		Healthy:            true,
		Veto:               veto,
		WaitingRequests:    int64(i % 3),
		RunningRequests:    int64(8 + i%8),
		TokenUsage:         0.1 + float64(i%40)/100,
		MaxRunningRequests: 256,
		LoadRevision:       uint64(1000 + i),
		AdmissionRooms:     64,
	}
	if veto == smgv1.Veto_VETO_OVERLOAD {
		w.VetoReason = "waiting_requests 12 > 10"
	}
	return w
}

func benchSnapshot(rev uint64) *smgv1.WatchResponse {
	workers := make([]*smgv1.RoutingWorker, benchFleet)
	for i := range workers {
		workers[i] = benchWorker(i, smgv1.Veto_VETO_UNSPECIFIED)
	}
	return &smgv1.WatchResponse{Epoch: "e1", Revision: rev, Msg: &smgv1.WatchResponse_Snapshot{Snapshot: &smgv1.WatchSnapshot{
		Workers:  workers,
		Settings: &smgv1.FleetSettings{LoadMonitorIntervalSecs: 1, WorkerStaleSecs: 15},
	}}}
}

// benchClient is a client feeding a real router that holds the fleet's
// snapshot at revision 1.
func benchClient(b *testing.B) *Client {
	b.Helper()
	r, err := router.New(router.DefaultOptions(), nil, prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(r.Stop)
	c := New(nil, r, Options{RouterID: "bench"}, nil)
	b.Cleanup(c.stopStale)
	if err := c.handle(benchSnapshot(1)); err != nil {
		b.Fatal(err)
	}
	return c
}

// decodeApply is one message as the watch client takes it from the stream.
func decodeApply(b *testing.B, c *Client, raw []byte) {
	var resp smgv1.WatchResponse
	if err := proto.Unmarshal(raw, &resp); err != nil {
		b.Fatal(err)
	}
	if err := c.handle(&resp); err != nil {
		b.Fatal(err)
	}
}

func marshal(b *testing.B, m proto.Message) []byte {
	b.Helper()
	raw, err := proto.Marshal(m)
	if err != nil {
		b.Fatal(err)
	}
	return raw
}

// BenchmarkApplyFlipDelta: a verdict flip, one worker's upsert, decoded and
// applied (a new router.Snapshot of the 10,000 workers published). The
// flip alternates, on and off, so every op changes the verdict.
func BenchmarkApplyFlipDelta(b *testing.B) {
	c := benchClient(b)
	var raws [2][]byte
	for i, veto := range []smgv1.Veto{smgv1.Veto_VETO_OVERLOAD, smgv1.Veto_VETO_UNSPECIFIED} {
		raws[i] = marshal(b, &smgv1.WatchResponse{Epoch: "e1", Revision: 2, Msg: &smgv1.WatchResponse_Delta{
			Delta: &smgv1.WatchDelta{Upserts: []*smgv1.RoutingWorker{benchWorker(4242, veto)}}}})
	}
	b.SetBytes(int64(len(raws[0])))
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		decodeApply(b, c, raws[i%2])
	}
}

// BenchmarkApplyLoadDelta: a load refresh of 1,000 workers' loads (a phase
// of the control plane's load grid at 10,000 workers), decoded and applied.
func BenchmarkApplyLoadDelta(b *testing.B) {
	c := benchClient(b)
	upserts := make([]*smgv1.RoutingWorker, 0, benchFleet/10)
	for i := 0; i < benchFleet; i += 10 {
		w := benchWorker(i, smgv1.Veto_VETO_UNSPECIFIED)
		w.WaitingRequests, w.LoadRevision = 2, w.LoadRevision+1
		upserts = append(upserts, w)
	}
	raw := marshal(b, &smgv1.WatchResponse{Epoch: "e1", Revision: 2, Msg: &smgv1.WatchResponse_Delta{
		Delta: &smgv1.WatchDelta{Upserts: upserts}}})
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		decodeApply(b, c, raw)
	}
}

// BenchmarkApplySnapshot10k: a 10,000-worker snapshot decoded and applied
// over the same fleet (a resync, every worker as held: the watch client
// hands it over as a change, and the router finds nothing changed).
func BenchmarkApplySnapshot10k(b *testing.B) {
	c := benchClient(b)
	raw := marshal(b, benchSnapshot(2))
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		decodeApply(b, c, raw)
	}
}

// BenchmarkApplyFirstSnapshot10k: a router joining, its first snapshot of
// 10,000 workers decoded and applied (the view built whole).
func BenchmarkApplyFirstSnapshot10k(b *testing.B) {
	raw := marshal(b, benchSnapshot(1))
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		r, err := router.New(router.DefaultOptions(), nil, prometheus.NewRegistry())
		if err != nil {
			b.Fatal(err)
		}
		c := New(nil, r, Options{RouterID: "bench"}, nil)
		b.StartTimer()
		decodeApply(b, c, raw)
		b.StopTimer()
		c.stopStale()
		r.Stop()
		b.StartTimer()
	}
}
