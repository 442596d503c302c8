package scale

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
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

func (p *routerProc) dial(ctx context.Context, id string) (*grpc.ClientConn, grpc.BidiStreamingClient[smgv1.WatchRequest, smgv1.WatchResponse], error) {
	conn, err := grpc.NewClient(p.spec.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	st, err := smgv1.NewWatchServiceClient(conn).Watch(ctx)
	if err == nil {
		err = st.Send(&smgv1.WatchRequest{Msg: &smgv1.WatchRequest_Hello{Hello: &smgv1.WatchHello{RouterId: id}}})
	}
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	return conn, st, nil
}

// watch runs one synthetic router until ctx ends.
func (p *routerProc) watch(ctx context.Context, id string) {
	conn, st, err := p.dial(ctx, id)
	if err != nil {
		p.fail(id, err)
		return
	}
	defer conn.Close()
	var held atomic.Uint64
	go func() { // acks and reports, on the watch client's cadence
		t := time.NewTicker(ackInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if st.Send(&smgv1.WatchRequest{Msg: &smgv1.WatchRequest_Ack{Ack: &smgv1.WatchAck{Revision: held.Load()}}}) != nil ||
				st.Send(&smgv1.WatchRequest{Msg: &smgv1.WatchRequest_Report{Report: &smgv1.RouterReport{}}}) != nil {
				return
			}
		}
	}()
	over := map[int]bool{} // workers held with an overload veto
	flips := map[int]int{} // flips applied per worker
	for {
		m, err := st.Recv()
		if err != nil {
			if ctx.Err() == nil {
				p.fail(id, err)
			}
			return
		}
		now := time.Now()
		var workers []*smgv1.RoutingWorker
		switch {
		case m.GetSnapshot() != nil:
			workers = m.GetSnapshot().GetWorkers()
			p.snapshots.Add(1)
		case m.GetDelta() != nil:
			workers = m.GetDelta().GetUpserts()
		}
		if p.win.contains(now) {
			p.messages.Add(1)
			p.bytes.Add(int64(proto.Size(m)))
		}
		for _, w := range workers {
			on := w.GetVeto() == smgv1.Veto_VETO_OVERLOAD
			if on == over[workerIndex(w.GetWorkerId())] {
				continue
			}
			i := workerIndex(w.GetWorkerId())
			if on {
				over[i] = true
			} else {
				delete(over, i)
			}
			flips[i]++
			p.saw(flipKey(i, flips[i]), now)
		}
		held.Store(m.GetRevision())
	}
}

func (p *routerProc) saw(key string, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	a := p.seen[key]
	if a == nil {
		a = &seenAgg{}
		p.seen[key] = a
	}
	a.Count++
	a.Last = max(a.Last, at.UnixNano())
}

// joins times spec.Joins routers joining, spread over the window: from
// dialling to holding the decoded snapshot.
func (p *routerProc) joins(ctx context.Context) {
	select {
	case <-p.win.set:
	case <-ctx.Done():
		return
	}
	start, end := p.win.start.Load(), p.win.end.Load()
	for j := range p.spec.Joins {
		at := time.Unix(0, start).Add(time.Duration(end-start) * time.Duration(2*j+1) / time.Duration(2*p.spec.Joins))
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(at)):
		}
		id := fmt.Sprintf("joiner-%d-%d", p.spec.RouterBase, j)
		start := time.Now()
		conn, st, err := p.dial(ctx, id)
		if err != nil {
			p.fail(id, err)
			continue
		}
		m, err := st.Recv()
		took := time.Since(start)
		conn.Close()
		if err != nil || m.GetSnapshot() == nil {
			p.fail(id, fmt.Errorf("first message %v, err %v: want a snapshot", m, err))
			continue
		}
		p.mu.Lock()
		p.joined = append(p.joined, joinSample{Millis: float64(took) / float64(time.Millisecond),
			Bytes: proto.Size(m), Workers: len(m.GetSnapshot().GetWorkers())})
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
