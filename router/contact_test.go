package router

import (
	"io"
	"net/http"
	"testing"
	"time"
)

// An answer is contact with its time, so the control plane counts it from
// when it arrived, not from when the report reaches it: a report that comes
// after a failure it heard of elsewhere must not date an older answer after
// it. A report without answers since the previous one says no contact.
func TestObservationsDateTheLatestAnswer(t *testing.T) {
	a := newEngine(t, "a", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ok":true}`)
	})
	answeredAt := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	now := answeredAt
	h := newHarness(t, func(o *Options) { o.Now = func() time.Time { return now } })
	h.apply(a.worker())
	if got := h.postTokens(8); got.status != http.StatusOK {
		t.Fatalf("answer %d %s", got.status, got.body)
	}
	now = answeredAt.Add(200 * time.Millisecond) // the report goes later
	o := h.r.Observations().Workers[0]
	if !o.Contact || !o.LastContact.Equal(answeredAt) {
		t.Fatalf("after an answer: contact %v at %v, want true at %v", o.Contact, o.LastContact, answeredAt)
	}
	if o := h.r.Observations().Workers[0]; o.Contact || !o.LastContact.IsZero() {
		t.Fatalf("no answer since the previous report: contact %v at %v, want none", o.Contact, o.LastContact)
	}
}
