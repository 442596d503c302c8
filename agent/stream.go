package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/backoff"
	"github.com/smg-project/smg/internal/cpconn"
)

// closeGrace bounds how long a shutting-down agent waits for the control
// plane to acknowledge the end of its stream.
const closeGrace = 2 * time.Second

// connect keeps a stream to the control plane up until ctx ends, reconnecting
// with jittered exponential backoff (at once after a goodbye).
func (a *Agent) connect(ctx context.Context) error {
	creds := a.opts.TransportCredentials
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	addrs, err := cpconn.ParseAddrs(a.opts.ControlPlane)
	if err != nil {
		return err
	}
	conn, err := cpconn.Dial(addrs, a.log,
		grpc.WithTransportCredentials(creds),
		// Notice a dead control plane, or a dead link, within seconds.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 5 * time.Second, Timeout: 3 * time.Second, PermitWithoutStream: true}),
		// Redial a control plane that comes back within about a second.
		backoff.DialOption(a.opts.Backoff),
	)
	if err != nil {
		return fmt.Errorf("--controlplane %s: %w", a.opts.ControlPlane, err)
	}
	defer conn.Close()
	client := smgv1.NewAgentServiceClient(conn)
	retry := backoff.New(a.opts.Backoff, nil)
	failing := false // warned already; further failed attempts log at debug
	var redirects cpconn.Redirects
	for {
		res := a.session(ctx, client)
		if ctx.Err() != nil {
			return nil
		}
		if c := status.Code(res.err); c == codes.Unauthenticated || c == codes.PermissionDenied {
			return fmt.Errorf("the control plane at %s refused the agent: %s", a.opts.ControlPlane, status.Convert(res.err).Message())
		}
		if res.established {
			retry.Reset()
			failing = false
		}
		if res.goodbye {
			a.log.Info("Control plane said goodbye; reconnecting", "controlplane", a.opts.ControlPlane)
			continue
		}
		if leader := redirects.AtOnce(res.err); leader != "" { // a follower named the leader
			a.log.Info("Sent to the leader; reconnecting now", "leader", leader)
			continue
		}
		wait := retry.Next()
		if res.established || !failing {
			a.log.Warn("Stream to the control plane lost; keeping the latest record per engine and reconnecting",
				"controlplane", a.opts.ControlPlane, "error", res.err, "retry_in", wait)
		} else {
			a.log.Debug("Control plane still unreachable", "controlplane", a.opts.ControlPlane, "error", res.err, "retry_in", wait)
		}
		failing = true
		if !backoff.Sleep(ctx, wait) {
			return nil
		}
	}
}

type sessionResult struct {
	established bool // the control plane answered the hello
	goodbye     bool
	err         error
}

// session runs one stream: hello, then every engine's latest state, then
// whatever the pollers post, with heartbeats through quiet spells. When ctx
// ends it flushes and closes the stream cleanly.
func (a *Agent) session(ctx context.Context, client smgv1.AgentServiceClient) sessionResult {
	// The stream outlives ctx long enough to flush: it is closed by us.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	if a.opts.Token != "" {
		sctx = metadata.AppendToOutgoingContext(sctx, "authorization", "Bearer "+a.opts.Token)
	}
	stream, err := client.Report(sctx)
	if err != nil {
		cancel()
		return sessionResult{err: err}
	}
	a.m.connects.Inc()

	var established, goodbye atomic.Bool
	var batching atomic.Bool    // the control plane accepts LoadRecords
	done := make(chan error, 1) // the receiver's end: nil after a goodbye or a clean close
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		for {
			msg, err := stream.Recv()
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				done <- err
				return
			}
			switch m := msg.Msg.(type) {
			case *smgv1.ReportResponse_Assignment:
				if !established.Swap(true) {
					a.m.connected.WithLabelValues(a.opts.ControlPlane).Set(1)
					a.log.Info("Connected to the control plane", "controlplane", a.opts.ControlPlane, "node", a.opts.Node)
				}
				batching.Store(m.Assignment.GetAcceptsRecords())
				a.assign(m.Assignment.GetEngineUrls())
			case *smgv1.ReportResponse_Goodbye:
				goodbye.Store(true)
				done <- nil
				return
			}
		}
	}()
	defer func() {
		cancel()
		<-exited
		a.m.connected.WithLabelValues(a.opts.ControlPlane).Set(0)
	}()
	result := func(err error) sessionResult {
		return sessionResult{established: established.Load(), goodbye: goodbye.Load(), err: err}
	}
	// A failed Send reports io.EOF; the stream's real status comes from Recv.
	broken := func() sessionResult {
		cancel()
		return result(<-done)
	}

	hello := &smgv1.AgentHello{Node: a.opts.Node, EngineUrls: a.opts.EngineURLs, Register: a.opts.Register}
	if err := stream.Send(a.stamped(&smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Hello{Hello: hello}})); err != nil {
		return broken()
	}
	a.m.sent.WithLabelValues("hello").Inc()

	beat := time.NewTimer(a.opts.HeartbeatInterval)
	defer beat.Stop()
	all := true // the first send after a hello: every engine's latest state
	for {
		msgs := a.pending(all, a.opts.Now())
		all = false
		if err := a.send(stream, msgs, batching.Load()); err != nil {
			return broken()
		}
		if len(msgs) > 0 {
			beat.Reset(a.opts.HeartbeatInterval)
		}
		select {
		case <-a.wake:
		case <-beat.C:
			hb := &smgv1.AgentHeartbeat{WorkerUrls: a.answering()}
			if err := stream.Send(a.stamped(&smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Heartbeat{Heartbeat: hb}})); err != nil {
				return broken()
			}
			a.m.sent.WithLabelValues("heartbeat").Inc()
			beat.Reset(a.opts.HeartbeatInterval)
		case err := <-done:
			return result(err)
		case <-ctx.Done():
			a.closeStream(stream, done, batching.Load())
			return result(nil)
		}
	}
}

// send delivers msgs in order; with batch (the control plane accepts
// LoadRecords), each run of records goes in one message.
func (a *Agent) send(stream grpc.BidiStreamingClient[smgv1.ReportRequest, smgv1.ReportResponse], msgs []*smgv1.ReportRequest, batch bool) error {
	if batch {
		msgs = batched(msgs, maxBatch)
	}
	for _, m := range msgs {
		if err := stream.Send(a.stamped(m)); err != nil {
			return err
		}
		kind, n := "event", 1
		switch {
		case m.GetRecord() != nil:
			kind = "record"
		case m.GetRecords() != nil:
			kind, n = "record", len(m.GetRecords().GetRecords())
		case m.GetPods() != nil:
			kind = "pods"
		}
		a.m.sent.WithLabelValues(kind).Add(float64(n))
	}
	return nil
}

// stamped returns m (a shallow copy: slots keep their messages for a
// resend) carrying the agent's clock at sending, which the control plane
// compares across the stream to tell how far behind it reads.
func (a *Agent) stamped(m *smgv1.ReportRequest) *smgv1.ReportRequest {
	return &smgv1.ReportRequest{Msg: m.Msg, SentAt: timestamppb.New(a.opts.Now())}
}

// maxBatch bounds the records in one message, far below gRPC's 4 MiB
// message limit (a record is a few hundred bytes).
const maxBatch = 1024

// batched returns msgs with each run of consecutive records (at most max)
// in one LoadRecords message; other messages keep their place.
func batched(msgs []*smgv1.ReportRequest, max int) []*smgv1.ReportRequest {
	out := make([]*smgv1.ReportRequest, 0, len(msgs))
	var run *smgv1.LoadRecords
	for _, m := range msgs {
		r := m.GetRecord()
		if r == nil {
			out, run = append(out, m), nil
			continue
		}
		if run == nil || len(run.Records) == max {
			run = &smgv1.LoadRecords{}
			out = append(out, &smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Records{Records: run}})
		}
		run.Records = append(run.Records, r)
	}
	for i, m := range out { // a run of one is a plain record
		if rs := m.GetRecords(); rs != nil && len(rs.Records) == 1 {
			out[i] = &smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Record{Record: rs.Records[0]}}
		}
	}
	return out
}

// closeStream flushes what the pollers last posted, closes our side and waits
// (bounded) for the control plane to end the stream: a clean end, which the
// control plane does not count as a failure of the engines.
func (a *Agent) closeStream(stream grpc.BidiStreamingClient[smgv1.ReportRequest, smgv1.ReportResponse], done <-chan error, batch bool) {
	if err := a.send(stream, a.pending(false, a.opts.Now()), batch); err != nil {
		return
	}
	if err := stream.CloseSend(); err != nil {
		return
	}
	t := time.NewTimer(closeGrace)
	defer t.Stop()
	select {
	case <-done:
		a.log.Info("Stream to the control plane closed", "controlplane", a.opts.ControlPlane)
	case <-t.C:
		a.log.Warn("Control plane did not acknowledge the end of the stream", "controlplane", a.opts.ControlPlane)
	}
}
