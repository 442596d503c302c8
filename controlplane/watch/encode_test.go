package watch

import (
	"context"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// replaced is the message the direct encoding replaces: b's WatchResponse
// under k built from RoutingWorker messages (marshalled), as routerID sees it.
func replaced(s *Server, k baseKey, b *base, routerID string, warming int32) *smgv1.WatchResponse {
	m := &smgv1.WatchResponse{Epoch: k.epoch, Revision: k.to}
	var workers []*smgv1.RoutingWorker
	if b != nil {
		for _, w := range b.workers {
			workers = append(workers, marshalled(w, routerID))
		}
	}
	switch k.kind {
	case kindSnapshot:
		m.Msg = &smgv1.WatchResponse_Snapshot{Snapshot: &smgv1.WatchSnapshot{Workers: workers, Settings: s.opts.Settings, WarmingSecs: warming}}
	case kindHeartbeat:
		m.Msg = &smgv1.WatchResponse_Heartbeat{Heartbeat: &smgv1.WatchHeartbeat{}}
	default:
		m.Msg = &smgv1.WatchResponse_Delta{Delta: &smgv1.WatchDelta{Upserts: workers, Removed: b.removed}}
	}
	return m
}

// marshalled is the RoutingWorker the router routerID gets of w, built as a
// message field by field: what the direct encoding must write the bytes of.
func marshalled(w *registry.Worker, routerID string) *smgv1.RoutingWorker {
	spec := w.Spec
	rw := &smgv1.RoutingWorker{
		WorkerId:           w.ID,
		Url:                spec.GetUrl(),
		Model:              w.Model,
		WorkerType:         w.Type,
		Priority:           50, // the spec's defaults
		Cost:               1,
		Healthy:            w.Ready(),
		WaitingRequests:    int64(w.Load.GetWaitingRequests()),
		RunningRequests:    int64(w.Load.GetRunningRequests()),
		TokenUsage:         w.Load.GetTokenUsage(),
		MaxRunningRequests: w.MaxRunning(),
		LoadRevision:       w.LoadRevision,
		BootstrapPort:      spec.GetBootstrapPort(),
		ContactSeq:         w.ContactSeq,
		ApiKey:             spec.GetApiKey(),
		WindowShare:        windowShare(w, routerID),
		AdmissionRooms:     w.Admission.Rooms(),
		Overloaded:         w.Overloaded,
		OverloadReason:     w.OverloadReason,
		PromptTokensAhead:  w.PromptTokensAhead,
		TokenBudget:        w.Budget.TokenBudget(),
		TokenShare:         tokenShare(w, routerID),
	}
	rw.Veto, rw.VetoReason = w.Veto()
	if spec != nil && spec.Priority != nil { // set, 0 included
		rw.Priority = spec.GetPriority()
	}
	if spec != nil && spec.Cost != nil {
		rw.Cost = spec.GetCost()
	}
	if p := spec.GetProvider(); p != nil {
		rw.Provider = &smgv1.ProviderRoute{Model: p.GetModel(), ApiKeyRef: p.GetApiKeyRef(), TimeoutSecs: p.GetTimeoutSecs(),
			SpillRequestsPerSec: p.GetSpillRequestsPerSec(), SpillTokensPerSec: p.GetSpillTokensPerSec()}
		for _, k := range slices.Sorted(maps.Keys(p.GetHeaders())) {
			rw.Provider.Headers = append(rw.Provider.Headers, &smgv1.ProviderHeader{Name: k, Value: p.GetHeaders()[k]})
		}
	}
	return rw
}

// randString is a short random string: empty, ASCII, or multi-byte UTF-8,
// sometimes long enough that its length takes two bytes.
func randString(r *rand.Rand) string {
	switch r.IntN(6) {
	case 0:
		return ""
	case 1:
		return string(make([]rune, 100+r.IntN(200))) // NULs, length over 127
	case 2:
		return fmt.Sprintf("wörker-%d-é☃", r.Int())
	default:
		return fmt.Sprintf("s%x", r.Uint64())
	}
}

func randFloat(r *rand.Rand) float64 {
	return []float64{0, math.Copysign(0, -1), 1, 0.37, -2.5, math.Inf(1), math.NaN(), r.Float64()}[r.IntN(8)]
}

func randInt32(r *rand.Rand) int32 {
	return []int32{0, 1, -1, 127, 128, math.MaxInt32, math.MinInt32, r.Int32()}[r.IntN(8)]
}

// randWorker is a worker record with every field RoutingWorker reads set at
// random (zero, negative, large, missing), for one of the routers.
func randWorker(r *rand.Rand, id string, routers []string) *registry.Worker {
	w := &registry.Worker{Registered: registry.Registered{ID: id, Model: randString(r), Type: []string{"regular", "prefill", "decode", ""}[r.IntN(4)]}, State: registry.State{Health: []registry.Health{registry.HealthHealthy, registry.HealthUnhealthy, registry.HealthPending}[r.IntN(3)], LoadRevision: r.Uint64() >> r.IntN(64), ContactSeq: uint64(r.IntN(3)) << r.IntN(64)}}
	w.Spec = &smgv1.WorkerSpec{Url: "http://" + id, ApiKey: randString(r)} // the registry keys URLs
	if r.IntN(2) == 0 {
		w.Spec.Priority = ptr(randInt32(r))
	}
	if r.IntN(2) == 0 {
		w.Spec.Cost = ptr(randFloat(r))
	}
	if r.IntN(2) == 0 {
		w.Spec.BootstrapPort = ptr(randInt32(r))
	}
	if r.IntN(2) == 0 {
		w.Spec.MaxRunningRequests = ptr(randInt32(r))
	}
	if r.IntN(4) == 0 {
		w.Spec.Provider = &smgv1.ProviderSpec{Model: randString(r), ApiKeyRef: randString(r),
			TimeoutSecs: ptr(randInt32(r)), SpillRequestsPerSec: randFloat(r), SpillTokensPerSec: randFloat(r)}
		if r.IntN(2) == 0 {
			w.Spec.Provider.Headers = map[string]string{randString(r): randString(r), "b" + randString(r): "", "": randString(r)}
		}
	}
	if r.IntN(4) > 0 {
		w.Load = &smgv1.EngineLoad{WaitingRequests: randInt32(r), RunningRequests: randInt32(r),
			TokenUsage: randFloat(r), MaxRunningRequests: randInt32(r)}
	}
	w.Liveness = smgv1.Veto(r.IntN(5)) // an unknown value too
	if r.IntN(2) == 0 {
		w.LivenessReason = randString(r)
	}
	// What Insert keeps of an overload verdict follows the thresholds: a
	// random threshold makes it either way.
	w.Thresholds.WaitingRequests = int64(r.IntN(3))
	w.Overloaded, w.OverloadReason = r.IntN(2) == 0, randString(r)
	if r.IntN(3) == 0 {
		w.WindowShare = map[string]int64{}
		for _, id := range routers {
			if r.IntN(2) == 0 {
				w.WindowShare[id] = int64(randInt32(r))
			}
		}
	}
	if r.IntN(3) == 0 {
		w.Admission = &registry.Admission{Window: int64(randInt32(r)), Queue: int64(r.IntN(4))}
	}
	if r.IntN(3) == 0 {
		w.Budget = &registry.Budget{Tokens: int64(randInt32(r)), Source: "engine"}
		w.TokenShare = map[string]int64{}
		for _, id := range routers {
			if r.IntN(2) == 0 {
				w.TokenShare[id] = int64(randInt32(r))
			}
		}
	}
	if r.IntN(2) == 0 {
		// Insert takes the prompt tokens ahead from the evidence.
		w.Evidence.Live.Routers(time.Time{}, judge.RouterObservation{PrefillTokens: int64(randInt32(r))}, &judge.Rules{})
		// Each router's part of it (any value: the encoder bounds it by the sum).
		w.Evidence.Routers = map[string]judge.RouterObservation{}
		for _, id := range routers {
			if r.IntN(2) == 0 {
				w.Evidence.Routers[id] = judge.RouterObservation{PrefillTokens: int64(randInt32(r))}
			}
		}
	}
	return w
}

// The direct encoding is byte for byte proto.Marshal of the message it
// replaces: snapshots, deltas and heartbeats of random registries, for
// routers with and without window shares, with and without settings and
// warm-up.
func TestDirectEncodingEqualsMarshal(t *testing.T) {
	routers := []string{"", "r1", "r2", "router-00003"}
	for seed := range uint64(40) {
		r := rand.New(rand.NewPCG(seed, 15))
		reg := registry.New(fmt.Sprint("epoch-", seed), 0)
		n := r.IntN(60)
		var ws []*registry.Worker
		for i := range n {
			ws = append(ws, randWorker(r, fmt.Sprintf("w%03d-%s", i, randString(r)), routers))
		}
		put(t, reg, ws...)
		from := reg.Revision()
		for range r.IntN(20) { // changes and removals for the deltas
			if n == 0 {
				break
			}
			if id := ws[r.IntN(n)].ID; r.IntN(4) == 0 {
				remove(t, reg, id)
			} else {
				put(t, reg, randWorker(r, id, routers))
			}
		}
		opts := Options{}
		if r.IntN(2) == 0 {
			opts.Settings = &smgv1.FleetSettings{LoadMonitorIntervalSecs: randInt32(r), WorkerStaleSecs: randInt32(r)}
		}
		s := NewServer(reg, opts, nil, nil)
		snap := reg.Snapshot()
		keys := []baseKey{
			{reg.Epoch(), kindSnapshot, 0, snap.Revision},
			{reg.Epoch(), kindHeartbeat, 0, snap.Revision},
			{reg.Epoch(), kindDelta, from, snap.Revision},
			{reg.Epoch(), kindRouting, from, snap.Revision},
			{reg.Epoch(), kindDelta, 0, snap.Revision}, // from before the first: every worker
		}
		for _, k := range keys {
			var b *base
			switch k.kind {
			case kindSnapshot:
				b = s.snapshotBase(k, snap)
			case kindDelta, kindRouting:
				if b = s.deltaBase(k, snap); b.tooFar {
					t.Fatalf("seed %d: delta %+v too far", seed, k)
				}
			}
			for _, router := range routers {
				warming := []int32{0, 3, -1, math.MaxInt32}[r.IntN(4)]
				if k.kind != kindSnapshot {
					warming = 0
				}
				want, err := proto.Marshal(replaced(s, k, b, router, warming))
				if err != nil {
					t.Fatal(err)
				}
				got := s.appendResponse(nil, k, b, router, warming)
				if string(got) != string(want) {
					t.Fatalf("seed %d, %+v for %q:\n got %x\nwant %x", seed, k, router, got, want)
				}
				// Appended after other bytes, the same bytes follow them.
				if got := s.appendResponse([]byte("prefix"), k, b, router, warming); string(got) != "prefix"+string(want) {
					t.Fatalf("seed %d, %+v for %q appended after a prefix: %x", seed, k, router, got)
				}
			}
		}
	}
}

// A string that is not valid UTF-8 (which proto.Marshal refuses) goes with
// its bad bytes replaced: the router decodes the message, and the other
// workers of the snapshot are not lost to one bad name.
func TestInvalidUTF8IsReplaced(t *testing.T) {
	reg := registry.New(testEpoch, 0)
	bad := newWorker("w1")
	bad.Model = "m\xff\xfe"
	put(t, reg, bad, newWorker("w2"))
	s := NewServer(reg, Options{}, nil, nil)
	snap := reg.Snapshot()
	k := baseKey{testEpoch, kindSnapshot, 0, snap.Revision}
	var m smgv1.WatchResponse
	if err := proto.Unmarshal(s.appendResponse(nil, k, s.snapshotBase(k, snap), "r1", 0), &m); err != nil {
		t.Fatalf("a router cannot decode the snapshot: %v", err)
	}
	ws := m.GetSnapshot().GetWorkers()
	if len(ws) != 2 || ws[0].Model != "m\uFFFD" || ws[1].Model != "m" {
		t.Fatalf("snapshot workers %v, want w1's model with its bad bytes replaced and w2", ws)
	}
}

// The encoding buffers: a buffer of at least the size asked for, and a
// buffer given back is handed out again for a size it holds.
func TestBufPoolSizes(t *testing.T) {
	var p bufPool
	for _, size := range []int{0, 1, 4096, 4097, 1 << 20, 3 << 20} {
		b := p.get(size)
		if cap(*b) < size || len(*b) != 0 {
			t.Fatalf("get(%d): len %d cap %d", size, len(*b), cap(*b))
		}
	}
	b := p.get(5000)
	grown := append(*b, make([]byte, 20000)...) // grew past its class: 32 KiB or more
	p.put(b, grown)
	if c := p.get(16 << 10); cap(*c) < 16<<10 {
		t.Fatalf("after a put, get(16 KiB) has cap %d", cap(*c))
	}
}

// Many streams at different revisions over real gRPC while changes commit:
// each message a router decodes is exactly the message for its own revisions
// (a snapshot at the revision it names, or the changes from the revision the
// router held to the one it names, each worker as that router sees it), never
// bytes encoded for another stream or revision, and every view converges.
func TestStreamsAtOtherRevisionsGetTheirOwnBytes(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	routers := []string{"r1", "r2", "r3", "r4"}
	reg := registry.New(testEpoch, 0)
	var ids []string
	var ws []*registry.Worker
	for i := range 40 {
		id := fmt.Sprintf("w%02d", i)
		ids = append(ids, id)
		ws = append(ws, randWorker(r, id, routers))
	}
	// The registry's state at each revision, kept as the test commits
	// (a router may be sent a revision before it is kept: it waits).
	var mu sync.Mutex
	kept := sync.NewCond(&mu)
	snaps := map[uint64]*registry.Snapshot{}
	commit := func(rev uint64) {
		mu.Lock()
		defer mu.Unlock()
		s := reg.Snapshot()
		if s.Revision != rev {
			t.Errorf("snapshot at %d after committing %d", s.Revision, rev)
		}
		snaps[rev] = s
		kept.Broadcast()
	}
	commit(put(t, reg, ws...))
	// Loads unpaced and a short history: deltas from many revisions, and
	// snapshots for the routers that fall out of it.
	h := start(t, reg, Options{LoadInterval: -1, MaxPending: 16})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	const changes = 150 // revisions after the first: the last is changes+1
	// view is what the router at rev must hold: every worker at rev.
	view := func(rev uint64, router string) map[string]string {
		mu.Lock()
		for snaps[rev] == nil && rev <= changes+1 {
			kept.Wait()
		}
		s := snaps[rev]
		mu.Unlock()
		if s == nil {
			return nil
		}
		out := map[string]string{}
		for _, w := range s.Workers() {
			out[w.ID] = RoutingWorker(w, router).String()
		}
		return out
	}
	type result struct {
		router string
		err    error
		rev    uint64
	}
	results := make(chan result, 64)
	// follow reads one stream, resumed at from (0: joining), until it holds
	// the last revision, checking each message against the registry's state.
	follow := func(router string, from uint64) {
		st := h.watch(t, ctx, &smgv1.WatchHello{RouterId: router, Epoch: testEpoch, Revision: from})
		held := map[string]string{}
		if from != 0 {
			held = view(from, router)
		}
		rev := from
		for {
			m, err := st.Recv()
			if err != nil {
				results <- result{router, err, rev}
				return
			}
			fail := func(format string, args ...any) {
				results <- result{router, fmt.Errorf("from %d, message at %d: "+format, append([]any{from, m.Revision}, args...)...), rev}
			}
			if m.Epoch != testEpoch || m.Revision < rev {
				fail("epoch %q, held %d", m.Epoch, rev)
				return
			}
			want := view(m.Revision, router)
			switch {
			case m.GetSnapshot() != nil:
				held = map[string]string{}
				for _, w := range m.GetSnapshot().Workers {
					held[w.WorkerId] = w.String()
				}
			case m.GetDelta() != nil:
				for _, w := range m.GetDelta().Upserts {
					if want[w.WorkerId] != w.String() {
						fail("upsert %v, the worker at that revision is %v", w, want[w.WorkerId])
						return
					}
					held[w.WorkerId] = w.String()
				}
				for _, id := range m.GetDelta().Removed {
					if _, ok := want[id]; ok {
						fail("removed %s, present at that revision", id)
						return
					}
					delete(held, id)
				}
			case m.GetHeartbeat() != nil:
				if m.Revision != rev {
					fail("heartbeat, held %d", rev)
					return
				}
			}
			rev = m.Revision
			if !maps.Equal(held, want) {
				fail("view after it differs from the registry's at that revision")
				return
			}
			if rev == changes+1 {
				results <- result{router, nil, rev}
				return
			}
		}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for _, router := range routers {
		wg.Go(func() { follow(router, 0) })
	}
	streams := len(routers)
	for i := range changes - 1 {
		w := randWorker(r, ids[r.IntN(len(ids))], routers)
		w.LoadRevision = uint64(1000 + i) // a visible change: a revision each
		commit(put(t, reg, w))
		if i%10 == 9 { // a router resumes at a revision some changes back
			from := uint64(1 + r.IntN(i+1))
			router := routers[r.IntN(len(routers))] + fmt.Sprint("-late-", i)
			streams++
			wg.Go(func() { follow(router, from) })
		}
	}
	commit(remove(t, reg, ids[0]))
	for range streams {
		if res := <-results; res.err != nil || res.rev != changes+1 {
			t.Errorf("%s: %v (held %d, want %d)", res.router, res.err, res.rev, changes+1)
		}
	}
}

// blockedStream holds each send until release is closed, and only then
// reads the message's bytes: what a router would get if gRPC copied them at
// the end of SendMsg.
type blockedStream struct {
	fakeStream
	entered chan struct{}
	release chan struct{}
	got     chan []byte
}

func (b *blockedStream) SendMsg(m any) error {
	b.entered <- struct{}{}
	<-b.release
	raw, err := proto.Marshal(m.(proto.Message))
	b.got <- raw
	return err
}

// A frame the cache lets go of while a stream is sending it keeps its bytes
// until that send returns: frames of newer revisions, written meanwhile in
// pooled buffers, never land in it. Once the last sender lets go, the frame
// is not handed out again.
func TestFrameLetGoDuringASendKeepsItsBytes(t *testing.T) {
	f := newFrames(nil)
	msg := func(rev uint64) []byte {
		return protowireMessage(rev, 50000) // large: sent as a copy
	}
	k1 := frameKey{baseKey: baseKey{testEpoch, kindSnapshot, 0, 1}}
	fr := f.frame(k1)
	bs := &blockedStream{fakeStream: fakeStream{ctx: t.Context()}, entered: make(chan struct{}),
		release: make(chan struct{}), got: make(chan []byte, 1)}
	done := make(chan error, 1)
	go func() {
		_, err := f.send(bs, kindSnapshot, fr, 50000, func(b []byte) []byte { return append(b, msg(1)...) })
		f.release(fr) // before done: the checks below need every hold let go
		done <- err
	}()
	<-bs.entered
	// Newer revisions: the cache lets go of revision 1's frame; their
	// frames are written, sent and let go of, their buffers pooled and
	// taken again.
	for rev := uint64(2); rev < 50; rev++ {
		k := frameKey{baseKey: baseKey{testEpoch, kindSnapshot, 0, rev}}
		next := f.frame(k)
		if _, err := f.send(&discardStream{ctx: t.Context()}, kindSnapshot, next, 50000, func(b []byte) []byte {
			return append(b, msg(rev)...)
		}); err != nil {
			t.Fatal(err)
		}
		f.release(next)
	}
	close(bs.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := <-bs.got; string(got) != string(msg(1)) {
		t.Fatal("a send of revision 1's frame, let go of by the cache meanwhile, wrote other bytes")
	}
	if fr.acquire() {
		t.Fatal("a frame let go of by everyone was handed out again")
	}
	if f.frame(k1) == fr {
		t.Fatal("the key of a frame let go of got it back")
	}
}

// protowireMessage is a WatchResponse at rev with a padding of n bytes in an
// unknown field (content that differs per revision).
func protowireMessage(rev uint64, n int) []byte {
	b := appendUint(nil, responseRevisionField, rev)
	pad := make([]byte, n)
	for i := range pad {
		pad[i] = byte(rev)
	}
	return protowire.AppendBytes(protowire.AppendTag(b, 99, protowire.BytesType), pad)
}

// Over real gRPC a large frame goes as copies to its first copySends
// streams and is prepared for the next ones; a small one is prepared at
// once. Every router decodes the same snapshot either way.
func TestLargeFramesCopiedThenPrepared(t *testing.T) {
	reg := registry.New(testEpoch, 0)
	var ws []*registry.Worker
	for i := range 40 {
		ws = append(ws, newWorker(fmt.Sprintf("worker-%03d", i)))
	}
	put(t, reg, ws...)
	h := start(t, reg, Options{HeartbeatInterval: time.Hour})
	snapshotFrame := func() *frame {
		h.srv.frames.mu.Lock()
		defer h.srv.frames.mu.Unlock()
		for k, fr := range h.srv.frames.frames {
			if k.kind == kindSnapshot {
				return fr
			}
		}
		return nil
	}
	var first *smgv1.WatchResponse
	for i := range copySends + 2 {
		m := recv(t, h.watch(t, t.Context(), &smgv1.WatchHello{RouterId: fmt.Sprint("r", i)}))
		if first == nil {
			first = m
			if raw, _ := proto.Marshal(m); mem.IsBelowBufferPoolingThreshold(len(raw)) {
				t.Fatalf("the snapshot is %d bytes: too small for this test", len(raw))
			}
		}
		if !proto.Equal(m, first) || len(m.GetSnapshot().GetWorkers()) != len(ws) {
			t.Fatalf("router %d decoded %v, want the snapshot the first did", i, m)
		}
		if prepped := snapshotFrame().prepped != nil; prepped != (i >= copySends) {
			t.Fatalf("after %d routers the snapshot is prepared: %v", i+1, prepped)
		}
	}
	if n := encodedCount(h.srv, "snapshot"); n != 1 {
		t.Fatalf("%v snapshots encoded for routers joining at one revision, want 1", n)
	}
	// A heartbeat (small) is prepared for its first stream.
	k := frameKey{baseKey: baseKey{testEpoch, kindHeartbeat, 0, reg.Revision()}}
	st := h.watch(t, t.Context(), &smgv1.WatchHello{RouterId: "resumed", Epoch: testEpoch, Revision: reg.Revision()})
	if m := recv(t, st); m.GetHeartbeat() == nil {
		t.Fatalf("resumed at the current revision: got %v, want a heartbeat", m)
	}
	h.srv.frames.mu.Lock()
	fr := h.srv.frames.frames[k]
	h.srv.frames.mu.Unlock()
	if fr == nil || fr.prepped == nil {
		t.Fatal("a heartbeat frame was not prepared at its first send")
	}
}
