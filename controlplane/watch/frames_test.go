package watch

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"

	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// encodedCount is how many messages of kind s has encoded.
func encodedCount(s *Server, kind string) float64 {
	return testutil.ToFloat64(s.metrics.encoded.WithLabelValues(kind))
}

// Streams at one revision are handed one shared message; a stream at another
// revision gets its own, never the other's.
func TestSharedFramesFollowRevisions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := registry.New(testEpoch, 0)
		put(t, reg, newWorker("w1"), newWorker("w2"), newWorker("w3")) // rev 1
		setOverloaded(t, reg, "w1", true)                              // rev 2
		s := NewServer(reg, Options{HeartbeatInterval: time.Hour}, nil, nil)

		a := serveFake(t, s, &smgv1.WatchHello{RouterId: "a"})
		c := serveFake(t, s, &smgv1.WatchHello{RouterId: "c"})
		snapA, snapC := <-a.sent, <-c.sent
		if snapA.GetSnapshot() == nil || snapA.Revision != 2 {
			t.Fatalf("a got %v, want the snapshot at 2", snapA)
		}
		if n := encodedCount(s, "snapshot"); n != 1 || !proto.Equal(snapA, snapC) {
			t.Fatalf("two routers joining at one revision got %v snapshots built, want one shared", n)
		}
		synctest.Wait() // a and c hold revision 2 and wait

		rev := setOverloaded(t, reg, "w3", true) // rev 3
		// b resumes from revision 1: it needs w1's change too.
		b := serveFake(t, s, &smgv1.WatchHello{RouterId: "b", Epoch: testEpoch, Revision: 1})
		ma, mb, mc := <-a.sent, <-b.sent, <-c.sent
		// 2→3 built once for a and c, 1→3 for b.
		if n := encodedCount(s, "delta"); n != 2 || !proto.Equal(ma, mc) {
			t.Fatalf("%v deltas built for routers at two revisions, want 2", n)
		}
		if ma.GetDelta() == nil || ma.Revision != rev || ids(ma.GetDelta().Upserts) != "w3" {
			t.Fatalf("a got %v, want the delta 2→3 of w3", ma)
		}
		if mb.GetDelta() == nil || mb.Revision != rev || ids(mb.GetDelta().Upserts) != "w1,w3" {
			t.Fatalf("b got %v, want the delta 1→3 of w1 and w3", mb)
		}
	})
}

// A router's window shares are part of what it is sent: routers with the same
// shares share a message, the others get their own.
func TestSharedFramesKeepWindowSharesPerRouter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := registry.New(testEpoch, 0)
		d := newWorker("d1")
		d.Type = "decode"
		d.Spec = &smgv1.WorkerSpec{Url: "http://d1", MaxRunningRequests: ptr(int32(64))}
		d.WindowShare = map[string]int64{"r1": 16, "r2": 48}
		put(t, reg, d, newWorker("w1"))
		s := NewServer(reg, Options{HeartbeatInterval: time.Hour}, nil, nil)

		got := map[string]*smgv1.WatchResponse{}
		for _, r := range []string{"r1", "r2", "r3", "r4"} {
			got[r] = <-serveFake(t, s, &smgv1.WatchHello{RouterId: r}).sent
		}
		share := func(r string) int64 { return got[r].GetSnapshot().GetWorkers()[0].GetWindowShare() }
		if share("r1") != 16 || share("r2") != 48 || share("r3") != -1 || share("r4") != -1 {
			t.Fatalf("shares r1..r4 = %d %d %d %d, want 16 48 -1 -1", share("r1"), share("r2"), share("r3"), share("r4"))
		}
		// r1, r2 and r3 with r4 (the same shares): three messages.
		if n := encodedCount(s, "snapshot"); n != 3 {
			t.Fatalf("%v snapshots built for three sets of shares, want 3", n)
		}
	})
}

// Routers whose parts of a worker's prompt tokens ahead differ are sent one
// message (the sum, alike for all); routers with equal window shares and
// different token shares are not (r4's token share is its own).
func TestSharedFramesKeepTokenSharesPerRouter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := registry.New(testEpoch, 0)
		w := newWorker("w1")
		w.Evidence.Routers = map[string]judge.RouterObservation{"r1": {PrefillTokens: 3000}, "r2": {PrefillTokens: 1000}}
		w.Evidence.Live.Routers(time.Time{}, judge.RouterObservation{PrefillTokens: 4000}, &judge.Rules{})
		b := newWorker("w2")
		b.Budget = &registry.Budget{Tokens: 1000, Source: "engine"}
		b.TokenShare = map[string]int64{"r1": 300, "r2": 300, "r3": 300, "r4": 100}
		put(t, reg, w, b, newWorker("idle"))
		s := NewServer(reg, Options{HeartbeatInterval: time.Hour}, nil, nil)

		got := map[string]*smgv1.WatchResponse{}
		for _, r := range []string{"r1", "r2", "r3", "r4"} {
			got[r] = <-serveFake(t, s, &smgv1.WatchHello{RouterId: r}).sent
		}
		find := func(r, id string) *smgv1.RoutingWorker {
			for _, rw := range got[r].GetSnapshot().GetWorkers() {
				if rw.GetWorkerId() == id {
					return rw
				}
			}
			t.Fatalf("%s: no %s in %v", r, id, got[r])
			return nil
		}
		for _, r := range []string{"r1", "r2", "r3", "r4"} {
			if ahead := find(r, "w1").GetPromptTokensAhead(); ahead != 4000 {
				t.Errorf("%s: ahead %d, want the sum 4000", r, ahead)
			}
		}
		for r, want := range map[string]int64{"r1": 300, "r2": 300, "r3": 300, "r4": 100} {
			if s := find(r, "w2").GetTokenShare(); s != want {
				t.Errorf("%s token share %d, want %d", r, s, want)
			}
		}
		// r1, r2 and r3 alike whatever their parts ahead, r4 its own token share.
		if n := encodedCount(s, "snapshot"); n != 2 {
			t.Fatalf("%v snapshots built for two routers' views, want 2", n)
		}
	})
}

// Over real gRPC streams the shared frames are marshalled once: three
// routers at one revision and one behind cost two delta encodings, and every
// router decodes exactly the message for its own revisions.
func TestSharedEncodingOverGRPC(t *testing.T) {
	reg := registry.New(testEpoch, 0)
	var ws []*registry.Worker
	for i := range 5 {
		ws = append(ws, newWorker(fmt.Sprintf("w%d", i)))
	}
	put(t, reg, ws...)
	// Loads unpaced: every delta is the full one, whatever the clock.
	h := start(t, reg, Options{HeartbeatInterval: time.Hour, LoadInterval: -1})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	var ahead []stream
	for i := range 3 {
		st := h.watch(t, ctx, &smgv1.WatchHello{RouterId: fmt.Sprint("r", i)})
		if m := recv(t, st); m.GetSnapshot() == nil || m.Revision != 1 {
			t.Fatalf("got %v, want the snapshot at 1", m)
		}
		ahead = append(ahead, st)
	}
	encoded := func(kind string) float64 { return encodedCount(h.srv, kind) }
	if n := encoded("snapshot"); n != 1 {
		t.Fatalf("snapshots encoded = %v for three routers joining at one revision, want 1", n)
	}

	r2 := setOverloaded(t, reg, "w0", true)
	var want []byte
	for _, st := range ahead {
		m := recv(t, st)
		if m.GetDelta() == nil || m.Revision != r2 || ids(m.GetDelta().Upserts) != "w0" {
			t.Fatalf("got %v, want the delta 1→%d of w0", m, r2)
		}
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if want != nil && string(b) != string(want) {
			t.Fatal("routers at one revision decoded different deltas")
		}
		want = b
	}
	r3 := setOverloaded(t, reg, "w1", true)
	// A router resuming from revision 1 needs both changes.
	behind := h.watch(t, ctx, &smgv1.WatchHello{RouterId: "late", Epoch: testEpoch, Revision: 1})
	if m := recv(t, behind); m.GetDelta() == nil || m.Revision != r3 || ids(m.GetDelta().Upserts) != "w0,w1" {
		t.Fatalf("late router got %v, want the delta 1→%d of w0 and w1", m, r3)
	}
	for _, st := range ahead {
		if m := recv(t, st); m.GetDelta() == nil || m.Revision != r3 || ids(m.GetDelta().Upserts) != "w1" {
			t.Fatalf("got %v, want the delta %d→%d of w1", m, r2, r3)
		}
	}
	// 1→2 once, 2→3 once, 1→3 once: not once per stream.
	if n := encoded("delta"); n != 3 {
		t.Fatalf("deltas encoded = %v for 7 sent, want 3", n)
	}
	if n := testutil.ToFloat64(h.srv.metrics.sent.WithLabelValues("delta")); n != 7 {
		t.Fatalf("deltas sent = %v, want 7", n)
	}
}

// The cache keeps only the newest revision's entries.
func TestFramesDropOlderRevisions(t *testing.T) {
	f := newFrames(nil)
	f.base(baseKey{testEpoch, kindDelta, 1, 2})
	f.frame(frameKey{baseKey: baseKey{testEpoch, kindDelta, 1, 2}})
	f.frame(frameKey{baseKey: baseKey{testEpoch, kindSnapshot, 0, 3}})
	if len(f.bases) != 0 || len(f.frames) != 1 {
		t.Fatalf("after revision 3: %d bases, %d frames, want 0 and 1", len(f.bases), len(f.frames))
	}
	// Another epoch at the same revision is another key.
	if f.frame(frameKey{baseKey: baseKey{"epoch-B", kindSnapshot, 0, 3}}) == f.frame(frameKey{baseKey: baseKey{testEpoch, kindSnapshot, 0, 3}}) {
		t.Fatal("two epochs share a frame")
	}
}

// The per-stream baseline shares nothing.
func TestEncodePerStreamSharesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := registry.New(testEpoch, 0)
		put(t, reg, newWorker("w1"))
		s := NewServer(reg, Options{HeartbeatInterval: time.Hour, EncodePerStream: true}, nil, nil)
		a, b := <-serveFake(t, s, &smgv1.WatchHello{RouterId: "a"}).sent, <-serveFake(t, s, &smgv1.WatchHello{RouterId: "b"}).sent
		if n := encodedCount(s, "snapshot"); n != 2 || !proto.Equal(a, b) {
			t.Fatalf("per-stream encoding built %v snapshots for two streams (want 2), or sent different content", n)
		}
	})
}

// What a router decodes of a snapshot is exactly every worker's
// RoutingWorker as it sees it (its own window shares), at the snapshot's
// revision.
func TestSnapshotIsEachWorkerAsTheRouterSeesIt(t *testing.T) {
	reg := registry.New(testEpoch, 0)
	d := newWorker("d1")
	d.Type = "decode"
	d.Spec = &smgv1.WorkerSpec{Url: "http://d1", MaxRunningRequests: ptr(int32(64))}
	d.WindowShare = map[string]int64{"r1": 16, "r2": 48}
	put(t, reg, d, newWorker("w1"), newWorker("w2"))
	s := NewServer(reg, Options{}, nil, nil)
	check := func(router string) {
		t.Helper()
		snap := reg.Snapshot()
		k := baseKey{testEpoch, kindSnapshot, 0, snap.Revision}
		got := &smgv1.WatchResponse{}
		if err := proto.Unmarshal(s.appendResponse(nil, k, s.snapshotBase(k, snap), router, 0), got); err != nil {
			t.Fatal(err)
		}
		want := &smgv1.WatchSnapshot{Settings: s.opts.Settings}
		for _, w := range snap.Workers() {
			want.Workers = append(want.Workers, RoutingWorker(w, router))
		}
		if !proto.Equal(got.GetSnapshot(), want) || got.Revision != snap.Revision {
			t.Fatalf("%s at %d decoded %v, want %v", router, snap.Revision, got, want)
		}
	}
	check("r1")
	check("r2")
	setOverloaded(t, reg, "w2", true)
	check("r1")
	check("r3")
}

// The entry handed out last is found again without the map only under its
// own key: a lookup under any other key (revision, kind, epoch, shares,
// warm-up) gets that key's entry, never the last one.
func TestFramesLastEntryOnlyUnderItsKey(t *testing.T) {
	f := newFrames(nil)
	k := baseKey{testEpoch, kindRouting, 1, 2}
	b, fr := f.base(k), f.frame(frameKey{baseKey: k})
	if f.base(k) != b || f.frame(frameKey{baseKey: k}) != fr {
		t.Fatal("the same key got another entry")
	}
	for _, other := range []baseKey{
		{testEpoch, kindRouting, 0, 2}, {testEpoch, kindDelta, 1, 2}, {"epoch-B", kindRouting, 1, 2},
	} {
		if f.base(other) == b || f.frame(frameKey{baseKey: other}) == fr {
			t.Fatalf("%+v got the entry of %+v", other, k)
		}
		if f.base(k) != b || f.frame(frameKey{baseKey: k}) != fr {
			t.Fatalf("after %+v, %+v got another entry", other, k)
		}
	}
	for _, other := range []frameKey{{baseKey: k, shares: "\x02"}, {baseKey: k, warming: 3}} {
		if f.frame(other) == fr {
			t.Fatalf("%+v got the entry of %+v", other, k)
		}
	}
	// A newer revision drops the old entries; the last one handed out is
	// now the newer one.
	k3 := baseKey{testEpoch, kindRouting, 2, 3}
	if f.base(k3) == b || f.frame(frameKey{baseKey: k3}) == fr {
		t.Fatal("revision 3 got revision 2's entry")
	}
}
