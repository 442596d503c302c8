package router

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

const fairDoc = `
fair_share: {enabled: true}
classes:
  system: {reserved: 0}
  interactive: {reserved: 0}
  default: {queue_size: 8, queue_timeout_secs: 30}
api_keys:
  sk-a: a
  sk-b: b
tenant_policies:
  "auth:a": {weight: 1}
  "auth:b": {weight: 0}
`

// The 429/503 contract, tenant side: a tenant holding its fair share while
// another tenant waits is refused at once with 429 tenant_over_fair_share
// and Retry-After; the waiting tenant gets the next free slot. A weight of 0
// is an ERROR naming the fallback, and the router starts.
func TestTenantOverFairShare429(t *testing.T) {
	h, logs := schedHarness(t, 2, fairDoc, nil)
	if out := logs.String(); !strings.Contains(out, "level=ERROR") || !strings.Contains(out, `tenant_policies.\"auth:b\".weight must be a number > 0`) ||
		h.r.sched == nil {
		t.Fatalf("a weight of 0: want an ERROR and the scheduler on; log: %s", out)
	}
	release := make(chan struct{})
	e := newEngine(t, "w", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		<-release
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"t\":1}\n\ndata: {\"t\":2}\n\ndata: [DONE]\n\n")
	})
	h.apply(e.worker())
	answers := make(chan answer, 3)
	for range 2 {
		go func() { answers <- h.sendAs("sk-a", "", "from a") }()
	}
	waitUntil(t, func() bool {
		return h.metricValue("smg_scheduler_inflight", map[string]string{"class": "default"}) == 2
	})
	go func() { answers <- h.sendAs("sk-b", "", "from b") }()
	waitUntil(t, func() bool {
		return h.metricValue("smg_scheduler_queue_depth", map[string]string{"class": "default"}) == 1
	})

	over := h.sendAs("sk-a", "", "a again")
	if over.status != http.StatusTooManyRequests || over.errorCode() != CodeTenantOverFairShare ||
		over.header.Get(ErrorCodeHeader) != CodeTenantOverFairShare || over.header.Get("Retry-After") == "" ||
		!strings.Contains(over.body, `"type":"rate_limit_error"`) || !strings.Contains(over.body, "auth:a") {
		t.Fatalf("a over its share: %d %v %s", over.status, over.header, over.body)
	}
	if v := h.metricValue("smg_scheduler_fair_share_refused_total", map[string]string{"tenant": "auth:a"}); v != 1 {
		t.Fatalf("smg_scheduler_fair_share_refused_total{auth:a} = %v", v)
	}
	if v := h.metricValue("smg_scheduler_admit_total", map[string]string{"class": "default", "outcome": "rejected_over_fair_share"}); v != 1 {
		t.Fatalf("admit_total{rejected_over_fair_share} = %v", v)
	}
	close(release)
	for range 3 {
		if a := <-answers; a.status != http.StatusOK {
			t.Fatalf("admitted request: %d %s", a.status, a.body)
		}
	}
	// Each answer charged its tenant: prompt tokens and 2 output events x2.
	if v := h.metricValue("smg_scheduler_tenant_tokens_total", map[string]string{"tenant": "auth:b"}); v < 4 {
		t.Fatalf("smg_scheduler_tenant_tokens_total{auth:b} = %v, want the output tokens counted", v)
	}
}
