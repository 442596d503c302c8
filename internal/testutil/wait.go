package testutil

import (
	"errors"
	"net/http"
	"time"
)

// pollEvery is how often the waits below poll real processes: they wait on
// state another process reaches, with a bound, and assert no timing.
const pollEvery = 50 * time.Millisecond

// Eventually polls check until it returns nil or within passes; the last
// error explains a timeout.
func Eventually(t T, within time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s: %v", within, what, err)
		}
		time.Sleep(pollEvery)
	}
}

// WaitFor is Eventually for a condition that explains itself: cond returns
// whether it holds and, when not, why.
func WaitFor(t T, within time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	Eventually(t, within, what, func() error {
		ok, detail := cond()
		switch {
		case ok:
			return nil
		case detail == "":
			return errNotYet
		}
		return errors.New(detail)
	})
}

// WaitReady waits until GET url answers 200, failing at once if p exits.
func WaitReady(t T, p *Proc, url string, within time.Duration) {
	t.Helper()
	client := &http.Client{Timeout: 2 * time.Second}
	WaitFor(t, within, "GET "+url+" to answer 200", func() (bool, string) {
		if p.Exited() {
			t.Fatalf("%s exited: %s", p.Name, Tail(p.Log(), 3000))
		}
		resp, err := client.Get(url)
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
}
