package backoff

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// fixed returns a source that always draws r.
func fixed(r float64) func() float64 { return func() float64 { return r } }

func TestNextDoublesUpToTheCap(t *testing.T) {
	p := Policy{Initial: 100 * time.Millisecond, Max: time.Second, Jitter: 0.2}
	for _, tc := range []struct {
		name string
		r    float64
		want []time.Duration
	}{
		{"no spread", 0.5, []time.Duration{100, 200, 400, 800, 1000, 1000}},
		{"low end", 0, []time.Duration{80, 160, 320, 640, 800, 800}},
		// The spread never lifts a wait above the cap.
		{"high end", 0.999999, []time.Duration{119, 239, 479, 959, 1000, 1000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := New(p, fixed(tc.r))
			for i, w := range tc.want {
				if got := b.Next().Milliseconds(); got != int64(w) {
					t.Fatalf("wait %d = %dms, want %dms", i, got, w)
				}
			}
			b.Reset()
			if got := b.Next(); got != time.Duration(float64(p.Initial)*(1+0.2*(2*tc.r-1))) {
				t.Fatalf("after Reset: %v, want the initial wait", got)
			}
		})
	}
}

func TestDefaultsCapAtOneSecond(t *testing.T) {
	b := New(Policy{}, nil)
	var longest time.Duration
	for range 50 {
		longest = max(longest, b.Next())
	}
	if longest > time.Second || longest < 800*time.Millisecond {
		t.Fatalf("longest default wait = %v, want within [0.8s, 1s]", longest)
	}
	if err := DefaultPolicy().Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestValidate(t *testing.T) {
	for name, p := range map[string]Policy{
		"zero initial":  {Max: time.Second, Jitter: 0.1},
		"max < initial": {Initial: time.Second, Max: time.Millisecond},
		"jitter 1":      {Initial: 1, Max: 1, Jitter: 1},
		"jitter < 0":    {Initial: 1, Max: 1, Jitter: -0.1},
	} {
		if p.Validate() == nil {
			t.Errorf("%s: %+v accepted", name, p)
		}
	}
}

func TestSleepEndsWithContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		if ok := Sleep(t.Context(), time.Second); !ok || time.Since(start) != time.Second {
			t.Fatalf("Sleep = %v after %v, want true after 1s", ok, time.Since(start))
		}
		ctx, cancel := context.WithCancel(t.Context())
		go func() {
			time.Sleep(500 * time.Millisecond)
			cancel()
		}()
		start = time.Now()
		if ok := Sleep(ctx, time.Second); ok || time.Since(start) != 500*time.Millisecond {
			t.Fatalf("Sleep with a cancelled context returned %v after %v", ok, time.Since(start))
		}
	})
}

// A gRPC channel dialled with DialOption retries an unreachable control plane
// at least once a second, however long it has been down: it finds a control
// plane that comes back within about a second (gRPC's own default backs off
// to two minutes).
func TestDialOptionCapsGRPCReconnects(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var attempts []time.Time
		refuse := func(context.Context, string) (net.Conn, error) {
			mu.Lock()
			defer mu.Unlock()
			attempts = append(attempts, time.Now())
			return nil, errors.New("connection refused")
		}
		conn, err := grpc.NewClient("passthrough:///controlplane",
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(refuse),
			DialOption(DefaultPolicy()))
		if err != nil {
			t.Fatal(err)
		}
		conn.Connect()
		time.Sleep(time.Minute)
		synctest.Wait()
		mu.Lock()
		got := append([]time.Time(nil), attempts...)
		mu.Unlock()
		conn.Close()
		synctest.Wait()
		if len(got) < 50 {
			t.Fatalf("%d connect attempts in a minute, want one a second at least", len(got))
		}
		for i := 1; i < len(got); i++ {
			if gap := got[i].Sub(got[i-1]); gap > DefaultMax {
				t.Fatalf("gap %d between connect attempts = %v, want <= %v", i, gap, DefaultMax)
			}
		}
	})
}
