package testutil

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"
)

// CheckSpread asserts how a batch of workers registered at start was first
// contacted (probed or polled): burst of them at start, every other one
// within one interval of it, no 1/k of the interval holding more than 1.3
// times its share; and each worker's later contacts exactly one interval
// apart.
func CheckSpread(t T, contacts map[string][]time.Time, start time.Time, interval time.Duration, burst, k int) {
	t.Helper()
	atOnce := 0
	buckets := make([]int, k)
	for id, log := range contacts {
		if len(log) == 0 {
			t.Fatalf("%s never contacted", id)
		}
		first := log[0].Sub(start)
		switch {
		case first < 0 || first >= interval:
			t.Fatalf("%s first contacted %s after registration, not within one interval (%s)", id, first, interval)
		case first == 0:
			atOnce++
		default:
			buckets[int(first*time.Duration(k)/interval)]++
		}
		for i := 1; i < len(log); i++ {
			if d := log[i].Sub(log[i-1]); d != interval {
				t.Fatalf("%s contacted %s after its previous contact, want exactly the interval %s", id, d, interval)
			}
		}
	}
	if atOnce != burst {
		t.Fatalf("%d first contacts at the instant of registration, want the burst budget (%d)", atOnce, burst)
	}
	for b, got := range buckets {
		if limit := len(contacts) / k * 13 / 10; got > limit {
			t.Fatalf("%d first contacts in the %d-th 1/%d of the interval, want at most %d: %v", got, b, k, limit, buckets)
		}
	}
}

// Recorder is an engine transport for a synctest bubble: it answers every
// request at once with Answer and logs it, at the bubble's time, under the
// worker id its path names (/<id><Suffix>).
type Recorder struct {
	Suffix string
	Answer http.Handler

	mu       sync.Mutex
	contacts map[string][]time.Time
}

// RoundTrip implements http.RoundTripper.
func (r *Recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	id, _ := strings.CutSuffix(strings.TrimPrefix(req.URL.Path, "/"), r.Suffix)
	r.mu.Lock()
	if r.contacts == nil {
		r.contacts = map[string][]time.Time{}
	}
	r.contacts[id] = append(r.contacts[id], time.Now())
	r.mu.Unlock()
	rec := httptest.NewRecorder()
	r.Answer.ServeHTTP(rec, req)
	return rec.Result(), nil
}

// Contacts returns the worker's contacts so far.
func (r *Recorder) Contacts(id string) []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Time(nil), r.contacts[id]...)
}
