package router

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// A dispatch or a first token that moves this router's prompt tokens in
// flight on a worker by JumpTokens or more since its latest report, up or
// down, asks for an early report (ReportSoon); smaller moves wait for the
// tick, and a report resets what counts as the move.
func TestAJumpOfPromptTokensInFlightAsksForAReport(t *testing.T) {
	arrived, release := make(chan struct{}, 8), make(chan struct{})
	e := newEngine(t, "a", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if !strings.Contains(string(b), "quick") { // held until release
			arrived <- struct{}{}
			<-release
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ok":true}`)
	})
	h := newHarness(t, nil)
	h.apply(e.worker())
	done := make(chan error, 4)
	var once sync.Once
	end := func() { // the four requests sent below end
		once.Do(func() {
			close(release)
			for range cap(done) {
				<-done
			}
		})
	}
	t.Cleanup(end)
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
	h.r.Observations() // reports 2.2 jumps in flight
	// A request answered at once moves it up and down by less than a jump.
	quick := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}]}`, testModel, "quick"+strings.Repeat("x", 4*JumpTokens*9/10))
	if got := h.send("/v1/chat/completions", quick, ""); got.status != http.StatusOK {
		t.Fatalf("quick answer %d %s", got.status, got.body)
	}
	if asked() {
		t.Fatalf("asked for a report after a request of about %d tokens came and went", JumpTokens*9/10)
	}
	end() // the four answer: a fall of 2.2 jumps
	if !asked() {
		t.Fatalf("no report asked for after a fall of about %d tokens since the latest report", JumpTokens*22/10)
	}
}
