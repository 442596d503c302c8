package scale

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/router/watchclient"
)

// ackInterval is how often a synthetic router acks and reports, like the
// router's watch client (watchclient.DefaultReportInterval).
const ackInterval = 250 * time.Millisecond

// runRouters runs spec.Routers synthetic routers: each its own connection
// and watch stream, speaking the protocol as the real watch client does
// (hello, acks and an observation report every 250 ms) but keeping only what
// the benchmark needs: the revision held and which workers carry an
// overload veto, so that it can time every flip. Building the router's
// snapshot is the router's cost, measured apart (router benchmarks).
func runRouters(ctx context.Context, spec childSpec, win *window) (*childResult, error) {
	p := &routerProc{spec: spec, win: win, seen: map[string]*seenAgg{}}
	var wg sync.WaitGroup
	for i := range spec.Routers {
		wg.Go(func() { p.watch(ctx, fmt.Sprintf("router-%05d", spec.RouterBase+i)) })
	}
	if spec.Joins > 0 {
		wg.Go(func() { p.joins(ctx) })
	}
	wg.Wait()
	return &childResult{Seen: p.seen, Messages: p.messages.Load(), Bytes: p.bytes.Load(),
		Snapshots: p.snapshots.Load(), Joins: p.joined, Errors: p.errors}, nil
}

type routerProc struct {
	spec                       childSpec
	win                        *window
	messages, bytes, snapshots atomic.Int64

	mu     sync.Mutex
	seen   map[string]*seenAgg
	joined []joinSample
	errors []string
}

func (p *routerProc) fail(id string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.errors) < 20 {
		p.errors = append(p.errors, fmt.Sprintf("%s: %v", id, err))
	}
}

// dialOptions are the router's (watchclient.DialOptions) on loopback.
func (p *routerProc) dialOptions() []grpc.DialOption {
	return append(watchclient.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// watch runs one synthetic router until ctx ends. Its stream scans what it
// receives (scanCodec) instead of decoding it: 250 routers in one process
// must cost the machine little, or the harness measures its own clients.
// The router's decode is timed apart (joins, and the watch package's
// BenchmarkJoin10k).
func (p *routerProc) watch(ctx context.Context, id string) {
	conn, err := grpc.NewClient(p.spec.Addr, p.dialOptions()...)
	if err != nil {
		p.fail(id, err)
		return
	}
	defer conn.Close()
	st, err := conn.NewStream(ctx, &smgv1.WatchService_ServiceDesc.Streams[0], smgv1.WatchService_Watch_FullMethodName,
		grpc.ForceCodec(scanCodec{}))
	if err == nil {
		err = st.SendMsg(&smgv1.WatchRequest{Msg: &smgv1.WatchRequest_Hello{Hello: &smgv1.WatchHello{RouterId: id}}})
	}
	if err != nil {
		p.fail(id, err)
		return
	}
	var held atomic.Uint64
	go func() { // acks and reports, on the watch client's cadence
		t := time.NewTicker(ackInterval)
		defer t.Stop()
		ack := &smgv1.WatchRequest{Msg: &smgv1.WatchRequest_Ack{Ack: &smgv1.WatchAck{}}}
		report := &smgv1.WatchRequest{Msg: &smgv1.WatchRequest_Report{Report: &smgv1.RouterReport{}}}
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			ack.GetAck().Revision = held.Load()
			if st.SendMsg(ack) != nil || st.SendMsg(report) != nil {
				return
			}
		}
	}()
	var over []bool        // by worker index: held with an overload veto
	flips := map[int]int{} // flips applied per worker
	// What this router saw, merged into the process's record when it ends:
	// routers sharing a process must not share a lock per message (real
	// routers are processes of their own).
	var seen []sawFlip
	var messages, bytes, snapshots int64
	defer func() {
		p.snapshots.Add(snapshots)
		p.messages.Add(messages)
		p.bytes.Add(bytes)
		p.sawAll(seen)
	}()
	var m scanned
	for {
		if err := st.RecvMsg(&m); err != nil {
			if ctx.Err() == nil && !errors.Is(err, io.EOF) {
				p.fail(id, err)
			}
			return
		}
		now := time.Now()
		if m.snapshot {
			snapshots++
		}
		if p.win.contains(now) {
			messages++
			bytes += int64(m.size)
		}
		for _, w := range m.workers {
			if w.index < 0 {
				continue
			}
			if w.index >= len(over) {
				over = append(over, make([]bool, w.index+1-len(over))...)
			}
			if w.overload == over[w.index] {
				continue
			}
			over[w.index] = w.overload
			flips[w.index]++
			seen = append(seen, sawFlip{w.index, flips[w.index], now.UnixNano(), m.revision})
		}
		held.Store(m.revision)
	}
}

// sawFlip is one router applying a flip (the worker's n-th) at (Unix ns),
// holding rev.
type sawFlip struct {
	worker, n int
	at        int64
	rev       uint64
}

// sawAll merges one router's flips into the process's record.
func (p *routerProc) sawAll(flips []sawFlip) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, f := range flips {
		key := flipKey(f.worker, f.n)
		a := p.seen[key]
		if a == nil {
			a = &seenAgg{MinRev: f.rev}
			p.seen[key] = a
		}
		a.MinRev = min(a.MinRev, f.rev)
		a.Count++
		a.Last = max(a.Last, f.at)
	}
}

// joins times spec.Joins routers joining, spread over the window: from
// dialling to holding the decoded snapshot. A process of joins alone
// (Routers 0) joins a quarter of the spacing later, so that its joins and
// the first router process's do not overlap.
func (p *routerProc) joins(ctx context.Context) {
	select {
	case <-p.win.set:
	case <-ctx.Done():
		return
	}
	start, end := p.win.start.Load(), p.win.end.Load()
	first := 2 // in quarters of the spacing
	if p.spec.Routers == 0 {
		first = 3
	}
	for j := range p.spec.Joins {
		at := time.Unix(0, start).Add(time.Duration(end-start) * time.Duration(4*j+first) / time.Duration(4*p.spec.Joins))
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(at)):
		}
		id := fmt.Sprintf("joiner-%d-%d", p.spec.RouterBase, j)
		s, err := p.join(ctx, id)
		if err != nil {
			p.fail(id, err)
			continue
		}
		p.mu.Lock()
		p.joined = append(p.joined, s)
		p.mu.Unlock()
	}
}

// workerIndex parses "w00042"; -1 for a name the harness did not make.
func workerIndex(id string) int {
	if len(id) < 2 {
		return -1
	}
	i, err := strconv.Atoi(id[1:])
	if err != nil {
		return -1
	}
	return i
}

// scanCodec is the synthetic routers' codec. Requests marshal as protobuf;
// a response is scanned into a *scanned with protowire (the revision, the
// kind and each listed worker's id and veto), with no allocation per worker.
// It names itself "proto", so the control plane serves it as any router.
type scanCodec struct{}

func (scanCodec) Name() string { return "proto" }

func (scanCodec) Marshal(v any) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("scan codec: cannot marshal %T", v)
	}
	return proto.Marshal(m)
}

func (scanCodec) Unmarshal(data []byte, v any) error {
	m, ok := v.(*scanned)
	if !ok {
		return fmt.Errorf("scan codec: cannot unmarshal into %T", v)
	}
	return m.scan(data)
}

// scanned is what a synthetic router keeps of a WatchResponse.
type scanned struct {
	revision uint64
	snapshot bool
	workers  []scannedWorker // snapshot workers or delta upserts (reused)
	size     int             // encoded bytes
}

type scannedWorker struct {
	index    int // from its id, "w00042"; -1 for another
	overload bool
}

// Field numbers of watch.proto.
const (
	fieldRevision   = 2 // WatchResponse.revision
	fieldSnapshot   = 3 // WatchResponse.snapshot
	fieldDelta      = 4 // WatchResponse.delta
	fieldWorkers    = 1 // WatchSnapshot.workers, WatchDelta.upserts
	fieldWorkerID   = 1 // RoutingWorker.worker_id
	fieldWorkerVeto = 8 // RoutingWorker.veto
)

func (m *scanned) scan(b []byte) error {
	m.revision, m.snapshot, m.workers, m.size = 0, false, m.workers[:0], len(b)
	return eachField(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		switch {
		case num == fieldRevision && typ == protowire.VarintType:
			m.revision = x
		case (num == fieldSnapshot || num == fieldDelta) && typ == protowire.BytesType:
			m.snapshot = num == fieldSnapshot
			return eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
				if num != fieldWorkers || typ != protowire.BytesType {
					return nil
				}
				w, err := scanWorker(v)
				m.workers = append(m.workers, w)
				return err
			})
		}
		return nil
	})
}

// scanWorker reads a RoutingWorker's id and overload veto. It stops at the
// first field past the veto: the control plane's marshal writes fields in
// number order, and the fields after the veto (the load, most of a delta's
// bytes) are what 1,000 routers would otherwise walk for nothing. Were the
// order ever different, a router would miss a flip and the harness's check
// that every flip reached every router would fail, not pass.
func scanWorker(b []byte) (scannedWorker, error) {
	w := scannedWorker{index: -1}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return w, protowire.ParseError(n)
		}
		if num > fieldWorkerVeto {
			return w, nil
		}
		b = b[n:]
		switch {
		case num == fieldWorkerID && typ == protowire.BytesType:
			var v []byte
			v, n = protowire.ConsumeBytes(b)
			w.index = indexOf(v)
		case num == fieldWorkerVeto && typ == protowire.VarintType:
			var x uint64
			x, n = protowire.ConsumeVarint(b)
			w.overload = smgv1.Veto(x) == smgv1.Veto_VETO_OVERLOAD
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return w, protowire.ParseError(n)
		}
		b = b[n:]
	}
	return w, nil
}

// eachField calls fn with every field of the message b: its bytes (bytes
// type) or its value (varint type).
func eachField(b []byte, fn func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var v []byte
		var x uint64
		switch typ {
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := fn(num, typ, v, x); err != nil {
			return err
		}
	}
	return nil
}

// indexOf parses "w00042" without allocating; -1 for a name the harness did
// not make.
func indexOf(id []byte) int {
	if len(id) < 2 || id[0] != 'w' {
		return -1
	}
	n := 0
	for _, c := range id[1:] {
		if c < '0' || c > '9' {
			return -1
		}
		n = n*10 + int(c-'0')
	}
	return n
}
