package scale

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// runAgents feeds workers [Lo, Hi) through spec.Agents agent streams, each
// covering a contiguous slice, every worker reported spec.ReportRate times
// a second, and flips verdicts at spec.FlipRate by reporting a flipped
// worker's waiting requests over the threshold (and back under it).
func runAgents(ctx context.Context, spec childSpec, win *window) (*childResult, error) {
	n := spec.Hi - spec.Lo
	if n <= 0 || spec.Agents <= 0 {
		return &childResult{}, nil
	}
	agents := make([]*agent, 0, spec.Agents)
	owner := make([]*agent, n) // by worker - Lo
	for a := range spec.Agents {
		lo, hi := spec.Lo+a*n/spec.Agents, spec.Lo+(a+1)*n/spec.Agents
		if lo == hi {
			continue
		}
		ag := &agent{spec: spec, win: win, node: fmt.Sprintf("node-%05d", spec.AgentBase+a), lo: lo, hi: hi,
			on: make([]bool, hi-lo), flips: make([]int, hi-lo), flip: make(chan int, 64)}
		agents = append(agents, ag)
		for w := lo; w < hi; w++ {
			owner[w-spec.Lo] = ag
		}
	}
	res := &childResult{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, ag := range agents {
		wg.Go(func() {
			err := ag.run(ctx)
			mu.Lock()
			defer mu.Unlock()
			res.Sent += ag.sent
			res.Due += ag.due
			res.SendBlockedSecs += ag.blocked.Seconds()
			res.Flips = append(res.Flips, ag.events...)
			if err != nil && ctx.Err() == nil {
				res.Errors = append(res.Errors, fmt.Sprintf("%s: %v", ag.node, err))
			}
		})
	}
	if spec.FlipRate > 0 {
		wg.Go(func() {
			t := time.NewTicker(time.Duration(float64(time.Second) / spec.FlipRate))
			defer t.Stop()
			next := 0
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					if !win.flips(time.Now()) { // the quiet window: loads only
						continue
					}
				}
				w := spec.Lo + next
				next = (next + 1) % n
				select {
				case owner[w-spec.Lo].flip <- w:
				default: // the stream is behind: skip this flip rather than queue
				}
			}
		})
	}
	wg.Wait()
	return res, nil
}

// agent is one synthetic agent stream covering workers [lo, hi).
type agent struct {
	spec   childSpec
	win    *window
	node   string
	lo, hi int
	on     []bool // worker flipped over the threshold
	flips  []int  // flips sent per worker
	flip   chan int
	sent   int64 // records sent inside the window
	due    int64 // records due inside the window
	// blocked is the time spent inside Send in the window.
	blocked time.Duration
	events  []flipEvent
}

func (a *agent) url(w int) string { return workerURL(a.spec.URLBase, w) }

func (a *agent) run(ctx context.Context) error {
	conn, err := grpc.NewClient(a.spec.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	// The stream sends pre-encoded messages (rawCodec): the same bytes the
	// generated client would marshal, at a fraction of the agent's CPU.
	st, err := conn.NewStream(ctx, &smgv1.AgentService_ServiceDesc.Streams[0], smgv1.AgentService_Report_FullMethodName,
		grpc.ForceCodecV2(rawCodec{}))
	if err != nil {
		return err
	}
	hello := &smgv1.AgentHello{Node: a.node}
	for w := a.lo; w < a.hi; w++ {
		hello.EngineUrls = append(hello.EngineUrls, a.url(w))
	}
	if err := st.SendMsg(&smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Hello{Hello: hello}}); err != nil {
		return err
	}
	go func() { // assignments: read and dropped
		for {
			if err := st.RecvMsg(struct{}{}); err != nil {
				return
			}
		}
	}()
	rng := rand.New(rand.NewPCG(uint64(a.lo), uint64(a.hi)))
	enc := newReportEncoder(a.spec.URLBase, a.lo, a.hi)
	rate := float64(a.hi-a.lo) * a.spec.ReportRate
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	var due, next int64 // records due since start, sent since start
	cursor := a.lo
	for {
		select {
		case <-ctx.Done():
			return nil
		case w := <-a.flip:
			i := w - a.lo
			a.on[i] = !a.on[i]
			a.flips[i]++
			now := time.Now()
			a.events = append(a.events, flipEvent{Worker: w, N: a.flips[i], On: a.on[i], At: now.UnixNano()})
			enc.begin()
			enc.record(w, a.load(w, rng), now)
			if err := a.sendRecords(st, enc, now); err != nil {
				return err
			}
		case now := <-tick.C:
			was := due
			due = int64(now.Sub(start).Seconds() * rate)
			if a.win.contains(now) {
				a.due += due - was
			}
			// Behind by more than a round (the control plane pushed back):
			// skip ahead rather than burst.
			if lag := due - next; lag > int64(a.hi-a.lo) {
				next = due - int64(a.hi-a.lo)
			}
			// The round's records go in one message, as the agent sends
			// every record due at once (LoadRecords).
			enc.begin()
			for ; next < due; next++ {
				enc.record(cursor, a.load(cursor, rng), now)
				if cursor++; cursor == a.hi {
					cursor = a.lo
				}
			}
			if err := a.sendRecords(st, enc, now); err != nil {
				return err
			}
		}
	}
}

// load is worker w's load: waiting over the threshold while flipped on.
func (a *agent) load(w int, rng *rand.Rand) rankLoad {
	waiting := rng.Int32N(3)
	if a.on[w-a.lo] {
		waiting = a.spec.FlipOn
	}
	return rankLoad{waiting: waiting, running: 8 + rng.Int32N(8), tokenUsage: 0.1 + 0.4*rng.Float64()}
}

// sendRecords sends the records enc holds, in one message when there are
// several, stamped with sent_at as the agent does (the control plane
// measures its read lag with it).
func (a *agent) sendRecords(st grpc.ClientStream, enc *reportEncoder, now time.Time) error {
	if enc.n == 0 {
		return nil
	}
	t0 := time.Now()
	var sentAt time.Time
	if !a.spec.NoClock {
		sentAt = t0
	}
	err := st.SendMsg(encoded(enc.message(sentAt)))
	a.blocked += a.win.overlap(t0, time.Now())
	if err != nil {
		return err
	}
	if a.win.contains(now) {
		a.sent += int64(enc.n)
	}
	return nil
}

func workerURL(base string, w int) string { return fmt.Sprintf("%s/w%05d", base, w) }

func workerID(w int) string { return fmt.Sprintf("w%05d", w) }
