package cluster

import (
	"context"
	"strings"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/smg-project/smg/controlplane/admin"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/backoff"
)

// Metadata keys of the leader-following protocol.
const (
	// MDRead: "local" asks a follower to answer a read from its own
	// replica instead of the leader's (REST: X-Smg-Read).
	MDRead = "smg-read"
	// MDStale: "true" marks an answer from a replica that is not the leader
	// (REST: X-Smg-Stale).
	MDStale = "smg-stale"
	// mdForwarded marks a call a follower handed to the leader.
	mdForwarded = "smg-forwarded-by"
)

// Reasons of the stream refusals of a follower (ErrorInfo, domain smg.cluster).
const (
	ReasonNotLeader = "NOT_LEADER" // metadata "leader": the leader's gRPC HOST:PORT
	ReasonNoLeader  = "NO_LEADER"
	ErrorDomain     = "smg.cluster"
)

// Forwarder is the admin API of a replica: the leader answers from its
// registry; a follower hands every call to the leader (gRPC and REST alike,
// since the REST gateway calls this service), so no client ever has to find
// the leader. Without a leader, writes are refused (503, Retry-After) and
// reads answered from the replica, marked stale.
type Forwarder struct {
	smgv1.UnimplementedWorkerServiceServer
	local smgv1.WorkerServiceServer
	node  *Node

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

// NewForwarder wraps the local admin service.
func NewForwarder(local smgv1.WorkerServiceServer, node *Node) *Forwarder {
	return &Forwarder{local: local, node: node, conns: map[string]*grpc.ClientConn{}}
}

// Close closes the connections to leaders.
func (f *Forwarder) Close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		_ = c.Close()
	}
	f.conns = map[string]*grpc.ClientConn{}
}

func (f *Forwarder) client(addr string) (smgv1.WorkerServiceClient, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.conns[addr]
	if c == nil {
		var err error
		creds := f.node.opts.PeerCreds
		if creds == nil {
			creds = insecure.NewCredentials()
		}
		c, err = grpc.NewClient(addr, grpc.WithTransportCredentials(creds), backoff.DialOption(backoff.DefaultPolicy()))
		if err != nil {
			return nil, err
		}
		f.conns[addr] = c
	}
	return smgv1.NewWorkerServiceClient(c), nil
}

type call[Req, Resp any] struct {
	write  bool
	local  func(context.Context, Req) (Resp, error)
	remote func(smgv1.WorkerServiceClient, context.Context, Req, ...grpc.CallOption) (Resp, error)
}

func route[Req, Resp any](f *Forwarder, ctx context.Context, req Req, c call[Req, Resp]) (Resp, error) {
	var zero Resp
	if _, ok := f.node.Leading(); ok || f.node.awaitLeading(ctx, 2*time.Second) {
		return c.local(ctx, req)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	stale := func() (Resp, error) {
		_ = grpc.SetHeader(ctx, metadata.Pairs(MDStale, "true"))
		return c.local(ctx, req)
	}
	if !c.write && first(md, MDRead) == "local" {
		return stale()
	}
	lm, ok := f.node.LeaderMember()
	if !ok || lm.ID == f.node.ID() || first(md, mdForwarded) != "" {
		// No leader, a leader still taking up its duties, or a follower
		// that took us for the leader: never hand a call on twice.
		if c.write {
			return zero, admin.ErrNoLeader("the control plane cluster has no leader right now; the write was not made; retry")
		}
		return stale()
	}
	cl, err := f.client(lm.GRPC)
	if err != nil {
		return zero, err
	}
	out := metadata.Pairs(mdForwarded, f.node.ID())
	for _, k := range []string{"authorization"} {
		if v := md.Get(k); len(v) > 0 {
			out.Set(k, v...)
		}
	}
	var header metadata.MD
	resp, err := c.remote(cl, metadata.NewOutgoingContext(ctx, out), req, grpc.Header(&header))
	if err != nil && status.Code(err) == codes.Unavailable && errorInfo(err) == nil {
		// The leader was not reached (or did not answer): a read falls
		// back to this replica; a write may or may not have been made.
		if !c.write {
			return stale()
		}
		if strings.Contains(status.Convert(err).Message(), "connection refused") {
			// Never sent: the old leader is gone and no new one is known yet.
			return zero, admin.ErrNoLeader("the leader " + lm.ID + " is not reachable and no other leader is known yet; the write was not made; retry")
		}
		return zero, admin.ErrOutcomeUnknown("the leader " + lm.ID + " could not be reached (" + status.Convert(err).Message() + "): the write may or may not be stored; read it back before retrying")
	}
	pass := metadata.MD{}
	for _, k := range []string{"x-http-code", "location", MDStale} {
		if v := header.Get(k); len(v) > 0 {
			pass.Set(k, v...)
		}
	}
	if len(pass) > 0 {
		_ = grpc.SetHeader(ctx, pass)
	}
	return resp, err
}

func first(md metadata.MD, k string) string {
	if v := md.Get(k); len(v) > 0 {
		return v[0]
	}
	return ""
}

func errorInfo(err error) *errdetails.ErrorInfo {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info
		}
	}
	return nil
}

func (f *Forwarder) CreateWorker(ctx context.Context, r *smgv1.CreateWorkerRequest) (*smgv1.CreateWorkerResponse, error) {
	return route(f, ctx, r, call[*smgv1.CreateWorkerRequest, *smgv1.CreateWorkerResponse]{true, f.local.CreateWorker, smgv1.WorkerServiceClient.CreateWorker})
}

func (f *Forwarder) ReplaceWorker(ctx context.Context, r *smgv1.ReplaceWorkerRequest) (*smgv1.ReplaceWorkerResponse, error) {
	return route(f, ctx, r, call[*smgv1.ReplaceWorkerRequest, *smgv1.ReplaceWorkerResponse]{true, f.local.ReplaceWorker, smgv1.WorkerServiceClient.ReplaceWorker})
}

func (f *Forwarder) UpdateWorker(ctx context.Context, r *smgv1.UpdateWorkerRequest) (*smgv1.UpdateWorkerResponse, error) {
	return route(f, ctx, r, call[*smgv1.UpdateWorkerRequest, *smgv1.UpdateWorkerResponse]{true, f.local.UpdateWorker, smgv1.WorkerServiceClient.UpdateWorker})
}

func (f *Forwarder) DeleteWorker(ctx context.Context, r *smgv1.DeleteWorkerRequest) (*smgv1.DeleteWorkerResponse, error) {
	return route(f, ctx, r, call[*smgv1.DeleteWorkerRequest, *smgv1.DeleteWorkerResponse]{true, f.local.DeleteWorker, smgv1.WorkerServiceClient.DeleteWorker})
}

func (f *Forwarder) GetWorker(ctx context.Context, r *smgv1.GetWorkerRequest) (*smgv1.GetWorkerResponse, error) {
	return route(f, ctx, r, call[*smgv1.GetWorkerRequest, *smgv1.GetWorkerResponse]{false, f.local.GetWorker, smgv1.WorkerServiceClient.GetWorker})
}

func (f *Forwarder) ListWorkers(ctx context.Context, r *smgv1.ListWorkersRequest) (*smgv1.ListWorkersResponse, error) {
	return route(f, ctx, r, call[*smgv1.ListWorkersRequest, *smgv1.ListWorkersResponse]{false, f.local.ListWorkers, smgv1.WorkerServiceClient.ListWorkers})
}

func (f *Forwarder) GetLoads(ctx context.Context, r *smgv1.GetLoadsRequest) (*smgv1.GetLoadsResponse, error) {
	return route(f, ctx, r, call[*smgv1.GetLoadsRequest, *smgv1.GetLoadsResponse]{false, f.local.GetLoads, smgv1.WorkerServiceClient.GetLoads})
}

func (f *Forwarder) ListJobs(ctx context.Context, r *smgv1.ListJobsRequest) (*smgv1.ListJobsResponse, error) {
	return route(f, ctx, r, call[*smgv1.ListJobsRequest, *smgv1.ListJobsResponse]{false, f.local.ListJobs, smgv1.WorkerServiceClient.ListJobs})
}

func (f *Forwarder) ListRouters(ctx context.Context, r *smgv1.ListRoutersRequest) (*smgv1.ListRoutersResponse, error) {
	return route(f, ctx, r, call[*smgv1.ListRoutersRequest, *smgv1.ListRoutersResponse]{false, f.local.ListRouters, smgv1.WorkerServiceClient.ListRouters})
}

// StreamInterceptor serves the watch and agent streams on the leader only:
// a follower answers with the leader's address (or "no leader yet"), and a
// leader that loses its term ends its streams with the same answer, so
// routers and agents move to the new leader.
func (n *Node) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if !strings.HasPrefix(info.FullMethod, "/smg.v1.WatchService/") && !strings.HasPrefix(info.FullMethod, "/smg.v1.AgentService/") {
			return handler(srv, ss)
		}
		lctx, ok := n.Leading()
		if !ok {
			return n.notLeader()
		}
		ctx, cancel := context.WithCancel(ss.Context())
		defer cancel()
		stop := context.AfterFunc(lctx, cancel)
		defer stop()
		err := handler(srv, leaderStream{ServerStream: ss, ctx: ctx})
		if lctx.Err() != nil && ss.Context().Err() == nil {
			return n.notLeader()
		}
		return err
	}
}

type leaderStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s leaderStream) Context() context.Context { return s.ctx }

// notLeader is the answer of a replica that does not lead.
func (n *Node) notLeader() error {
	if lm, ok := n.LeaderMember(); ok && lm.ID != n.id {
		st := status.New(codes.Unavailable, "this control plane is not the leader; the leader is "+lm.ID+" at "+lm.GRPC)
		if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: ReasonNotLeader, Domain: ErrorDomain, Metadata: map[string]string{"leader": lm.GRPC, "leader_id": lm.ID}}); err == nil {
			st = d
		}
		return st.Err()
	}
	st := status.New(codes.Unavailable, "the control plane cluster has no leader yet")
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: ReasonNoLeader, Domain: ErrorDomain}); err == nil {
		st = d
	}
	return st.Err()
}
