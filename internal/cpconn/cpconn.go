// Package cpconn dials the control plane as routers and agents see it: one
// or several replicas (--controlplane a:1,b:2,c:3), of which one leads. The
// connection follows the leader: a replica that does not lead answers a
// stream with the leader's address (or "no leader yet"), and the next
// stream goes there; a replica that cannot be reached is left for the next
// address in the list. Callers keep their own reconnect loop and backoff.
//
// It owns the choice of replica; the streams' protocols are their callers'.
package cpconn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"
)

// Reasons and metadata of a follower's answer (see controlplane/cluster).
const (
	reasonNotLeader = "NOT_LEADER"
	reasonNoLeader  = "NO_LEADER"
	errorDomain     = "smg.cluster"
)

// ParseAddrs splits a --controlplane value: HOST:PORT, comma- or
// space-separated.
func ParseAddrs(v string) ([]string, error) {
	var out []string
	for _, a := range strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' }) {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, fmt.Errorf("--controlplane %q: %v", a, err)
		}
		out = append(out, a)
	}
	if len(out) == 0 {
		return nil, errors.New("--controlplane needs at least one HOST:PORT")
	}
	return out, nil
}

// Conn is a connection that follows the leader.
type Conn struct {
	*grpc.ClientConn
	r   *manual.Resolver
	log *slog.Logger

	mu    sync.Mutex
	addrs []string
	next  int    // index of the next address to try when cur fails
	cur   string // the address the channel uses now
}

// Dial returns a connection to the first of addrs that follows the leader.
func Dial(addrs []string, log *slog.Logger, opts ...grpc.DialOption) (*Conn, error) {
	if len(addrs) == 0 {
		return nil, errors.New("--controlplane needs at least one HOST:PORT")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Conn{r: manual.NewBuilderWithScheme("smgcp"), log: log, addrs: addrs, cur: addrs[0], next: 1 % len(addrs)}
	c.r.InitialState(resolver.State{Addresses: []resolver.Address{address(c.cur)}})
	opts = append(opts, grpc.WithResolvers(c.r),
		grpc.WithChainStreamInterceptor(c.streamInterceptor),
		grpc.WithChainUnaryInterceptor(c.unaryInterceptor))
	cc, err := grpc.NewClient("smgcp:///controlplane", opts...)
	if err != nil {
		return nil, err
	}
	c.ClientConn = cc
	return c, nil
}

// Current is the address the connection uses now.
func (c *Conn) Current() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur
}

// Observe moves the connection after a failed call: to the leader a
// follower named, or to the next address when this one is unreachable or
// knows no leader. Other errors (refusals of the call itself) leave it.
func (c *Conn) Observe(err error) {
	if err == nil || errors.Is(err, io.EOF) {
		return
	}
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable {
		return
	}
	target := LeaderNamed(err)
	c.mu.Lock()
	defer c.mu.Unlock()
	if target == "" {
		if len(c.addrs) == 1 {
			return
		}
		target = c.addrs[c.next]
		c.next = (c.next + 1) % len(c.addrs)
	}
	if target == c.cur {
		return
	}
	c.log.Info("Moving to another control plane replica", "from", c.cur, "to", target, "reason", st.Message())
	c.cur = target
	c.r.UpdateState(resolver.State{Addresses: []resolver.Address{address(target)}})
}

// LeaderNamed is the leader's address when err is a follower's answer
// naming it ("" otherwise): the next call goes there, so a caller may retry
// at once instead of backing off.
func LeaderNamed(err error) string {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable {
		return ""
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == errorDomain && info.GetReason() == reasonNotLeader {
			return info.GetMetadata()["leader"]
		}
	}
	return ""
}

// Redirects decides, for a caller's reconnect loop, whether a failed
// attempt may be retried at once: when a follower named the leader (the
// connection already points there), once in a row, so replicas that
// disagree cannot make it spin. The zero value is ready.
type Redirects struct{ last bool }

// AtOnce reports the leader named by err when the next attempt may go at
// once, "" when the caller should back off.
func (r *Redirects) AtOnce(err error) string {
	if leader := LeaderNamed(err); leader != "" && !r.last {
		r.last = true
		return leader
	}
	r.last = false
	return ""
}

func (c *Conn) unaryInterceptor(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	c.Observe(err)
	return err
}

func (c *Conn) streamInterceptor(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		c.Observe(err)
		return nil, err
	}
	return observed{ClientStream: s, c: c}, nil
}

type observed struct {
	grpc.ClientStream
	c *Conn
}

func (o observed) RecvMsg(m any) error {
	err := o.ClientStream.RecvMsg(m)
	o.c.Observe(err)
	return err
}

func (o observed) SendMsg(m any) error {
	err := o.ClientStream.SendMsg(m)
	o.c.Observe(err)
	return err
}

// address names a replica: its HOST:PORT is also the authority TLS checks,
// as when it is dialled directly.
func address(hostport string) resolver.Address {
	return resolver.Address{Addr: hostport, ServerName: hostport}
}
