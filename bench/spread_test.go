package bench

import (
	"context"
	"testing"
	"time"
)

// Round robin takes routers in turn; least-outstanding takes the router with
// the fewest open requests, in turn among equals.
func TestSpreaderPicks(t *testing.T) {
	rr := newSpreader([]string{"a", "b", "c"}, SpreadRoundRobin)
	for i, want := range []int{0, 1, 2, 0} {
		if got, _ := rr.pick(); got != want {
			t.Fatalf("round robin pick %d = %d, want %d", i, got, want)
		}
	}
	lo := newSpreader([]string{"a", "b", "c"}, SpreadLeastOutstanding)
	_, doneA := lo.pick() // a
	lo.pick()             // b
	lo.pick()             // c
	doneA()               // a's request ended: a has the fewest open
	if got, _ := lo.pick(); got != 0 {
		t.Fatalf("least outstanding picked %d, want 0 (the router whose request ended)", got)
	}
	if got, _ := lo.pick(); got != 1 {
		t.Fatalf("least outstanding among equals picked %d, want 1 (in turn)", got)
	}
	if err := validSpread("random"); err == nil {
		t.Fatal("an unknown spread was accepted")
	}
}

// With ShedFailover a request shed by one router goes on to the next at
// once, each router at most once; the record shows every attempt.
func TestShedFailoverTriesTheNextRouter(t *testing.T) {
	shed, shedCalls := sseServer(t, 2, 1<<30)
	ok, okCalls := sseServer(t, 2, 0)
	urls := []string{shed.URL, shed.URL, ok.URL}
	for _, failover := range []bool{false, true} {
		c := Config{URL: urls[0], URLs: urls, ShedFailover: failover, Timeout: 5 * time.Second}
		var live liveCounters
		r := doRequest(context.Background(), NewHTTPClient(), c, time.Now(), "hello", 2, nil, &live, newSpreader(urls, ""))
		if failover && (!r.Completed || r.Attempts != 3) {
			t.Errorf("failover: %+v; want completed on the 3rd router", r)
		}
		if !failover && (!r.Shed || r.Attempts != 1) {
			t.Errorf("no failover: %+v; want one shed attempt", r)
		}
	}
	if shedCalls.Load() != 3 || okCalls.Load() != 1 {
		t.Fatalf("calls: %d to the shedding routers, %d to the last; want 3 and 1", shedCalls.Load(), okCalls.Load())
	}
	all := []string{shed.URL, shed.URL}
	var live liveCounters
	r := doRequest(context.Background(), NewHTTPClient(), Config{URL: all[0], URLs: all, ShedFailover: true, Timeout: 5 * time.Second},
		time.Now(), "hello", 2, nil, &live, newSpreader(all, ""))
	if !r.Shed || r.Attempts != 2 {
		t.Fatalf("every router shed: %+v; want shed after 2 attempts", r)
	}
}
