package router

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// A dispatch that raises this router's prompt tokens in flight on a worker
// by JumpTokens or more since its latest report asks for an early report
// (ReportSoon); smaller rises wait for the tick, and a report resets what
// counts as the rise.
func TestAJumpOfPromptTokensInFlightAsksForAReport(t *testing.T) {
	arrived, release := make(chan struct{}, 8), make(chan struct{})
	e := newEngine(t, "a", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		arrived <- struct{}{}
		<-release
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ok":true}`)
	})
	h := newHarness(t, nil)
	h.apply(e.worker())
	done := make(chan error, 4)
	t.Cleanup(func() { // the four requests sent below end
		close(release)
		for range cap(done) {
			<-done
		}
	})
	// send dispatches a request of about tokens prompt tokens (4 bytes
	// each) and returns once the engine holds it.
	send := func(tokens int) {
		t.Helper()
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}]}`, testModel, strings.Repeat("x", 4*tokens))
		go func() {
			resp, err := http.Post(h.srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			done <- err
		}()
		<-arrived
	}
	asked := func() bool {
		select {
		case <-h.r.ReportSoon():
			return true
		default:
			return false
		}
	}
	h.r.Observations()
	send(JumpTokens * 4 / 10)
	if asked() {
		t.Fatalf("asked for a report after a rise of about %d tokens, under %d", JumpTokens*4/10, JumpTokens)
	}
	send(JumpTokens * 7 / 10)
	if !asked() {
		t.Fatalf("no report asked for after a rise of about %d tokens since the latest report", JumpTokens*11/10)
	}
	h.r.Observations() // reports the 1.1 jumps in flight
	send(JumpTokens * 4 / 10)
	if asked() {
		t.Fatalf("asked for a report after a rise of about %d tokens since the latest report", JumpTokens*4/10)
	}
	send(JumpTokens * 7 / 10)
	if !asked() {
		t.Fatalf("no report asked for after a second rise of about %d tokens since the latest report", JumpTokens*11/10)
	}
}
