package agent

import (
	"context"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	commonpb "github.com/smg-project/smg/gen/smg/grpc/common"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/backoff"
	"github.com/smg-project/smg/internal/enginegrpc"
	"github.com/smg-project/smg/internal/loadpb"
)

// pollGRPC covers a gRPC engine: one KV event stream whose load records
// are sent as they come, and GetLoads every poll interval unless every
// pushing rank delivered within it.
func (a *Agent) pollGRPC(ctx context.Context, e *engineSlot) {
	c, err := enginegrpc.New(e.url, a.opts.GRPC)
	if err != nil {
		a.log.Warn("gRPC engine cannot be polled", "url", e.url, "error", err)
		return
	}
	defer c.Close()
	ps := &enginegrpc.Ranks{}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		a.streamKV(ctx, c, e, ps)
	}()
	a.pollEvery(ctx, e, &poller{url: e.url, reader: c}, func(now time.Time) bool { return ps.Covers(a.opts.PollInterval, now) })
}

// streamKV keeps one SubscribeKvEvents stream open, reconnecting with
// backoff. Each batch's load record becomes a record for the control plane;
// a connection failure on the stream is reported as one.
func (a *Agent) streamKV(ctx context.Context, c *enginegrpc.Client, e *engineSlot, ps *enginegrpc.Ranks) {
	bo := backoff.New(backoff.Policy{Max: 5 * time.Second}, nil)
	for ctx.Err() == nil {
		err := a.readKV(ctx, c, e, ps, bo)
		if ctx.Err() != nil {
			return
		}
		if enginegrpc.IsConnectionFailure(err) {
			a.post(e, outcome{msg: eventMsg(e.url, smgv1.EngineEventKind_ENGINE_EVENT_KIND_TRANSPORT_FAILURE, "KV event stream: "+err.Error(), a.opts.Now())})
		} else if err != nil {
			a.log.Debug("KV event stream ended", "url", e.url, "error", err)
		}
		ps.Reset() // the poll takes over until records come again
		if !backoff.Sleep(ctx, bo.Next()) {
			return
		}
	}
}

func (a *Agent) readKV(ctx context.Context, c *enginegrpc.Client, e *engineSlot, ps *enginegrpc.Ranks, bo *backoff.Backoff) error {
	st, err := c.SubscribeKV(ctx, 0)
	if err != nil {
		return err
	}
	for {
		b, err := st.Recv()
		if err != nil {
			return c.Wrap(err)
		}
		bo.Reset()
		if msg := a.pushedRecord(c, e.url, b, ps); msg != nil {
			a.post(e, outcome{msg: msg, answering: true})
		}
	}
}

// pushedRecord stores the batch's load record and returns the engine's
// record over every pushing rank; nil for a batch without one (an older
// servicer) or with one that cannot be believed (counted and logged).
func (a *Agent) pushedRecord(c *enginegrpc.Client, url string, b *commonpb.KvEventBatch, ps *enginegrpc.Ranks) *smgv1.ReportRequest {
	p, ok, err := enginegrpc.ReadPushed(b)
	if !ok {
		return nil
	}
	if err != nil {
		a.m.badPushes.Inc()
		a.log.Warn("KV event batch with a load record that cannot be believed; dropped", "url", url, "error", err)
		return nil
	}
	now := a.opts.Now()
	m, err := ps.Add(p, now)
	if err != nil {
		return nil
	}
	flavor, _ := c.Flavor(context.Background()) // known: the stream is open
	rep, err := enginegrpc.ToReport(flavor, m.Loads)
	if err != nil {
		return nil
	}
	rec := &smgv1.LoadRecord{WorkerUrl: url, Load: loadpb.FromReport(rep, now), StepWire: m.StepWire,
		PrefillTokensInHand: m.Prefill, ObservedAt: timestamppb.New(now)}
	if m.Silence != nil {
		rec.EngineSilence = durationpb.New(*m.Silence)
	}
	return &smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Record{Record: rec}}
}
