package bench

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// A priority mix sends each arrival with its class's header and API key,
// in about the mix's proportions, and the result summarises each class.
func TestPriorityMixHeaders(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.Header.Get("X-Smg-Priority")+" "+r.Header.Get("Authorization")]++
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"id\":\"c-0\",\"choices\":[{\"delta\":{\"content\":\"x\"},\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	var mix PriorityMix
	if err := mix.Set("bulk=1:sk-b,interactive=3:sk-i"); err != nil {
		t.Fatal(err)
	}
	if mix.String() != "bulk=1:sk-b,interactive=3:sk-i" {
		t.Fatalf("round trip: %s", mix.String())
	}
	c := Config{URL: srv.URL, Clients: 4, Duration: 300 * time.Millisecond, Timeout: 5 * time.Second,
		Prompt: Dist{Min: 1, Max: 1}, Output: Dist{Min: 1, Max: 1}, TTFTObjective: time.Second, Priorities: mix}
	res, err := Run(context.Background(), NewHTTPClient(), c, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, i := seen["bulk Bearer sk-b"], seen["interactive Bearer sk-i"]
	if b+i != len(res.Records) || b == 0 || i < 2*b {
		t.Fatalf("headers seen %v over %d requests: want only the mix's pairs, about 1:3", seen, len(res.Records))
	}
	if res.ByClass["bulk"].Requests != b || res.ByClass["interactive"].Requests != i {
		t.Fatalf("per-class summaries %d/%d, want %d/%d", res.ByClass["bulk"].Requests, res.ByClass["interactive"].Requests, b, i)
	}
	for _, bad := range []string{"bulk", "bulk=0", "=1", "bulk=x"} {
		if err := mix.Set(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
