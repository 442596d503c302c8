package cluster

import (
	"cmp"
	"context"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/smg-project/smg/controlplane/admin"
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

// Route says how a replica serves a method (the control plane's table).
type Route int

const (
	RouteLocal  Route = iota + 1 // every replica answers (health, reflection)
	RouteRead                    // to the leader; without one, or asked MDRead "local", from here, marked MDStale
	RouteWrite                   // to the leader; without one, refused (503, Retry-After)
	RouteLeader                  // a stream the leader alone serves: a follower answers with the leader's address
)

// conn is the channel to a leader's gRPC port, for the calls handed to it.
func (n *Node) conn(addr string) (*grpc.ClientConn, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if c := n.conns[addr]; c != nil {
		return c, nil
	}
	creds := cmp.Or(n.opts.PeerCreds, insecure.NewCredentials())
	c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds), backoff.DialOption(backoff.DefaultPolicy()))
	if err == nil {
		n.conns[addr] = c
	}
	return c, err
}

// Unary serves RouteLocal calls here and hands a follower's RouteRead and
// RouteWrite calls to the leader (gRPC and REST alike, since the REST
// gateway calls through the same interceptors), so no client ever has to
// find the leader; a method without a route is refused.
func (n *Node) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, local grpc.UnaryHandler) (any, error) {
	method, r := info.FullMethod, n.opts.Route(info.FullMethod)
	switch r {
	case RouteLocal:
		return local(ctx, req)
	case RouteRead, RouteWrite:
	default:
		return nil, unrouted(method)
	}
	write := r == RouteWrite
	md, _ := metadata.FromIncomingContext(ctx)
	stale := func() (any, error) {
		_ = grpc.SetHeader(ctx, metadata.Pairs(MDStale, "true"))
		return local(ctx, req)
	}
	forwarded := len(md.Get(mdForwarded)) > 0
	if !write && slices.Contains(md.Get(MDRead), "local") {
		if _, ok := n.Leading(); ok {
			return local(ctx, req)
		}
		return stale()
	}
	// Right after a start or an election: wait for the leader rather than
	// refuse a write or answer a read from a copy that may not have caught
	// up (after a full restart a follower's holds only its last snapshot
	// until a leader tells it what is committed).
	n.awaitLeader(ctx)
	if _, ok := n.Leading(); ok {
		return local(ctx, req)
	}
	lm, ok := n.LeaderMember()
	if !ok || lm.ID == n.id || forwarded {
		// No leader, a leader still taking up its duties, or a follower
		// that took us for the leader: never hand a call on twice.
		if write {
			return nil, admin.ErrNoLeader("the control plane cluster has no leader right now; the write was not made; retry")
		}
		if forwarded {
			return stale()
		}
		return nil, admin.ErrNoLeader("the control plane cluster has no leader right now, and this replica's copy may not have caught up; retry, or read it as it is with X-Smg-Read: local")
	}
	resp, err := newResponse(method)
	if err != nil {
		return nil, err
	}
	cc, err := n.conn(lm.GRPC)
	if err != nil {
		return nil, err
	}
	out := metadata.Pairs(mdForwarded, n.id)
	if v := md.Get("authorization"); len(v) > 0 {
		out.Set("authorization", v...)
	}
	var header metadata.MD
	err = cc.Invoke(metadata.NewOutgoingContext(ctx, out), method, req, resp, grpc.Header(&header))
	if st := status.Convert(err); st.Code() == codes.Unavailable && len(st.Details()) == 0 {
		// Not the leader's answer (which carries an ErrorInfo): the leader was
		// not reached. A read falls back to this replica; a write may or may
		// not have been made.
		switch {
		case !write:
			return stale()
		case strings.Contains(st.Message(), "connection refused"): // never sent: the old leader is gone
			return nil, admin.ErrNoLeader("the leader " + lm.ID + " is not reachable and no other leader is known yet; the write was not made; retry")
		}
		return nil, admin.ErrOutcomeUnknown("the leader " + lm.ID + " could not be reached (" + st.Message() + "): the write may or may not be stored; read it back before retrying")
	}
	pass := metadata.MD{}
	for _, k := range []string{"x-http-code", "location", MDStale} {
		if v := header.Get(k); len(v) > 0 {
			pass.Set(k, v...)
		}
	}
	_ = grpc.SetHeader(ctx, pass) // nothing when empty
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// newResponse makes an empty response of the unary method (a full method
// name, "/service/method"), from the registered descriptors.
func newResponse(method string) (proto.Message, error) {
	d, _ := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(strings.ReplaceAll(method[1:], "/", ".")))
	if md, ok := d.(protoreflect.MethodDescriptor); ok {
		if mt, err := protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName()); err == nil {
			return mt.New().Interface(), nil
		}
	}
	return nil, status.Errorf(codes.Internal, "no response type for %s", method)
}

// Stream serves RouteLocal streams here and RouteLeader streams on the
// leader only; a leader that loses its term ends them with the leader's
// address, so routers and agents move to the new leader.
func (n *Node) Stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	switch n.opts.Route(info.FullMethod) {
	case RouteLocal:
		return handler(srv, ss)
	case RouteLeader:
	default:
		return unrouted(info.FullMethod)
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

func unrouted(method string) error {
	return status.Errorf(codes.Unimplemented, "%s has no route on a replicated control plane", method)
}

type leaderStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s leaderStream) Context() context.Context { return s.ctx }

// notLeader is the answer of a replica that does not lead.
func (n *Node) notLeader() error {
	reason, msg, md := ReasonNoLeader, "the control plane cluster has no leader yet", map[string]string(nil)
	if lm, ok := n.LeaderMember(); ok && lm.ID != n.id {
		reason, msg = ReasonNotLeader, "this control plane is not the leader; the leader is "+lm.ID+" at "+lm.GRPC
		md = map[string]string{"leader": lm.GRPC, "leader_id": lm.ID}
	}
	return admin.WithInfo(codes.Unavailable, ErrorDomain, reason, md, msg)
}
