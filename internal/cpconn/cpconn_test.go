package cpconn

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// replica answers health checks as a leader (SERVING) or as a follower
// naming the leader, as controlplane/cluster does.
type replica struct {
	healthpb.UnimplementedHealthServer
	leader string // "": this replica leads
}

func (r *replica) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if r.leader == "" {
		return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
	}
	return nil, notLeaderErr(r.leader)
}

func serve(t *testing.T, r *replica) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	healthpb.RegisterHealthServer(s, r)
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	return ln.Addr().String()
}

// deadAddr is a loopback address nobody listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := ln.Addr().String()
	ln.Close()
	return a
}

func check(c *Conn, opts ...grpc.CallOption) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := healthpb.NewHealthClient(c).Check(ctx, &healthpb.HealthCheckRequest{}, opts...)
	return err
}

// onNewAddress is a call that waits for the channel to take up the address
// the connection moved to (the switch is asynchronous, as a client's
// reconnect backoff would wait for it).
var onNewAddress = grpc.WaitForReady(true)

func TestFollowerAnswerMovesTheConnectionToTheLeader(t *testing.T) {
	leader := serve(t, &replica{})
	follower := serve(t, &replica{leader: leader})
	c, err := Dial([]string{follower}, nil, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := check(c); status.Code(err) != codes.Unavailable {
		t.Fatalf("first call through the follower: %v, want its UNAVAILABLE answer", err)
	}
	if c.Current() != leader {
		t.Fatalf("after the follower's answer the connection uses %s, want the leader %s", c.Current(), leader)
	}
	if err := check(c, onNewAddress); err != nil {
		t.Fatalf("second call, on the leader: %v", err)
	}
}

func TestUnreachableReplicaMovesToTheNextAddress(t *testing.T) {
	dead := deadAddr(t)
	leader := serve(t, &replica{})
	c, err := Dial([]string{dead, leader}, nil, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := check(c); err == nil {
		t.Fatal("a call to a dead address succeeded")
	}
	if c.Current() != leader {
		t.Fatalf("after a transport failure the connection uses %s, want the next address %s", c.Current(), leader)
	}
	if err := check(c, onNewAddress); err != nil {
		t.Fatalf("call on the next address: %v", err)
	}
}

func TestOtherErrorsDoNotMove(t *testing.T) {
	a := serve(t, &replica{})
	c, err := Dial([]string{a, deadAddr(t)}, nil, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Observe(status.Error(codes.Unauthenticated, "bad token"))
	c.Observe(status.Error(codes.InvalidArgument, "bad hello"))
	if c.Current() != a {
		t.Fatalf("a refusal of the call moved the connection to %s", c.Current())
	}
}

func TestParseAddrs(t *testing.T) {
	got, err := ParseAddrs("a:1, b:2,c:3")
	if err != nil || len(got) != 3 || got[1] != "b:2" {
		t.Fatalf("ParseAddrs = %v, %v", got, err)
	}
	for _, bad := range []string{"", " , ", "a:1,nohost", "a:1,b"} {
		if _, err := ParseAddrs(bad); err == nil {
			t.Errorf("ParseAddrs(%q) accepted", bad)
		}
	}
}

// notLeaderErr is a follower's answer naming leader.
func notLeaderErr(leader string) error {
	st := status.New(codes.Unavailable, "not the leader")
	st, _ = st.WithDetails(&errdetails.ErrorInfo{Reason: reasonNotLeader, Domain: errorDomain, Metadata: map[string]string{"leader": leader}})
	return st.Err()
}

// A reconnect loop goes at once to a leader a follower named, but not twice
// in a row; anything else backs off.
func TestRedirectsAtOnce(t *testing.T) {
	var r Redirects
	for i, step := range []struct {
		err  error
		want string
	}{
		{notLeaderErr("b:2"), "b:2"},
		{notLeaderErr("c:3"), ""}, // in a row: back off
		{notLeaderErr("b:2"), "b:2"},
		{status.Error(codes.Unavailable, "connection refused"), ""},
		{status.Error(codes.Unavailable, "no leader yet"), ""},
		{notLeaderErr(""), ""}, // names nobody
		{notLeaderErr("b:2"), "b:2"},
	} {
		if got := r.AtOnce(step.err); got != step.want {
			t.Fatalf("step %d: AtOnce = %q, want %q", i, got, step.want)
		}
	}
}
