package watchclient

import (
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func notLeader(t *testing.T, leader string) error {
	t.Helper()
	st, err := status.New(codes.Unavailable, "not the leader").WithDetails(&errdetails.ErrorInfo{
		Reason: "NOT_LEADER", Domain: "smg.cluster", Metadata: map[string]string{"leader": leader}})
	if err != nil {
		t.Fatal(err)
	}
	return st.Err()
}

// A follower that names the leader sends the router there at once, not
// after a backoff step: during a failover that step (up to 1 s once the
// election has made the backoff grow) is time the router spends away from
// the new leader. Two redirects in a row back off (replicas that disagree
// cannot make it spin); an unreachable replica backs off as before.
func TestFollowerRedirectReconnectsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fc := newFakeConn()
		mid := func() float64 { return 0.5 } // no spread: exact waits
		runBubbled(t, New(fc, newTarget(), Options{RouterID: "r1", Rand: mid}, nil))
		s := <-fc.streams
		for i, step := range []struct {
			end  error
			want time.Duration
		}{
			{notLeader(t, "10.0.0.2:30002"), 0},                                             // named the leader: at once
			{notLeader(t, "10.0.0.3:30002"), 100 * time.Millisecond},                        // again, in a row: back off
			{notLeader(t, "10.0.0.2:30002"), 0},                                             // after a backoff: at once again
			{status.Error(codes.Unavailable, "connection refused"), 200 * time.Millisecond}, // unreachable: backoff grows
		} {
			synctest.Wait()
			before := time.Now()
			s.end <- step.end
			s = <-fc.streams
			if d := time.Since(before); d != step.want {
				t.Fatalf("step %d: reconnected after %v, want %v", i, d, step.want)
			}
		}
	})
}
