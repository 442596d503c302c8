package router

import (
	"bufio"
	"bytes"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// cannedEngine is an engine on loopback that answers every request on a
// kept-alive connection with the same bytes, allocating nothing per request,
// so what a benchmark counts is the router's.
type cannedEngine struct {
	ln     net.Listener
	answer [][]byte // written one write each: a streamed answer's events
}

func newCannedEngine(tb testing.TB, answer [][]byte) *cannedEngine {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	e := &cannedEngine{ln: ln, answer: answer}
	go e.serve()
	tb.Cleanup(func() { ln.Close() })
	return e
}

func (e *cannedEngine) url() string { return "http://" + e.ln.Addr().String() }

func (e *cannedEngine) serve() {
	for {
		c, err := e.ln.Accept()
		if err != nil {
			return
		}
		go e.conn(c)
	}
}

// conn reads each request's head and Content-Length body, then writes the
// answer.
func (e *cannedEngine) conn(c net.Conn) {
	defer c.Close()
	br := bufio.NewReaderSize(c, 16<<10)
	for {
		length := 0
		for {
			line, err := br.ReadSlice('\n')
			if err != nil {
				return
			}
			if len(line) <= 2 {
				break
			}
			if k, v, ok := bytes.Cut(line, []byte(":")); ok && bytes.EqualFold(k, []byte("Content-Length")) {
				length, _ = strconv.Atoi(string(bytes.TrimSpace(v)))
			}
		}
		if _, err := br.Discard(length); err != nil {
			return
		}
		for _, b := range e.answer {
			if _, err := c.Write(b); err != nil {
				return
			}
		}
	}
}

// chatAnswer is a non-streamed chat completion of 4 tokens.
func chatAnswer() [][]byte {
	body := `{"id":"chatcmpl-0-1","object":"chat.completion","created":1,"model":"` + testModel + `","choices":[{"index":0,` +
		`"message":{"role":"assistant","content":"also up one before "},"logprobs":null,"finish_reason":"length"}],` +
		`"usage":{"prompt_tokens":8,"completion_tokens":4,"total_tokens":12}}`
	return [][]byte{[]byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body)}
}

// streamAnswer is a streamed chat completion of 4 tokens: the role event,
// a token each, the finish event and [DONE], a chunk each.
func streamAnswer() [][]byte {
	chunk := func(s string) []byte { return fmt.Appendf(nil, "%x\r\n%s\r\n", len(s), s) }
	event := func(delta, finish string) string {
		return `data: {"id":"chatcmpl-0-2","object":"chat.completion.chunk","created":1,"model":"` + testModel +
			`","choices":[{"index":0,"delta":` + delta + `,"logprobs":null,"finish_reason":` + finish + `}]}` + "\n\n"
	}
	out := [][]byte{[]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
		string(chunk(event(`{"role":"assistant","content":""}`, "null"))))}
	for _, w := range []string{"who ", "me ", "our ", "could "} {
		out = append(out, chunk(event(`{"content":"`+w+`"}`, "null")))
	}
	out = append(out, chunk(event(`{"content":""}`, `"length"`)), append(chunk("data: [DONE]\n\n"), "0\r\n\r\n"...))
	return out
}

// discardWriter is a ResponseWriter (and Flusher) that keeps nothing but
// the status, reusing its header map.
type discardWriter struct {
	h      http.Header
	status int
	n      int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) WriteHeader(code int)        { w.status = code }
func (w *discardWriter) Write(b []byte) (int, error) { w.n += len(b); return len(b), nil }
func (w *discardWriter) Flush()                      {}

// The deadlines the server's writer supports (readBody sets them).
func (w *discardWriter) SetReadDeadline(time.Time) error  { return nil }
func (w *discardWriter) SetWriteDeadline(time.Time) error { return nil }

// resettableBody is a request body read afresh each iteration without an
// allocation of the benchmark's own.
type resettableBody struct{ bytes.Reader }

func (*resettableBody) Close() error { return nil }

// BenchmarkRequestPath is the router's whole request path for one chat
// completion of 4 tokens, non-streamed and streamed: the handler as the
// server calls it (route, body read and parse, selection, the upstream
// request over a kept-alive connection, the answer copied back, metrics),
// against an engine that allocates nothing. allocs/op is the router's
// allocations per request (the HTTP server's own parsing of the client's
// request is not in it).
func BenchmarkRequestPath(b *testing.B) {
	for _, c := range []struct {
		name   string
		stream bool
		answer [][]byte
	}{{"chat", false, chatAnswer()}, {"stream", true, streamAnswer()}} {
		b.Run(c.name, func(b *testing.B) {
			e := newCannedEngine(b, c.answer)
			r, err := New(DefaultOptions(), slog.New(slog.DiscardHandler), prometheus.NewRegistry())
			if err != nil {
				b.Fatal(err)
			}
			r.Apply(&Snapshot{Revision: 1, Workers: []Worker{{ID: "e", URL: e.url(), Model: testModel, Healthy: true}}})
			h := r.Handler()
			body := []byte(`{"model":"` + testModel + `","messages":[{"role":"user","content":"Say hello in a few words, please"}],` +
				`"max_tokens":4,"stream":` + strconv.FormatBool(c.stream) + `}`)
			rb := &resettableBody{}
			req, err := http.NewRequest(http.MethodPost, "http://router/v1/chat/completions", rb)
			if err != nil {
				b.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			req.ContentLength = int64(len(body))
			w := &discardWriter{h: http.Header{}}
			serve := func() {
				rb.Reset(body)
				clear(w.h)
				w.status, w.n = 0, 0
				h.ServeHTTP(w, req)
				if w.status != http.StatusOK || w.n == 0 {
					b.Fatalf("status %d, %d bytes", w.status, w.n)
				}
			}
			serve() // the connection to the engine opens
			b.ReportAllocs()
			for b.Loop() {
				serve()
			}
		})
	}
}
