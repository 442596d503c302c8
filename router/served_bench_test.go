package router

import (
	"bufio"
	"bytes"
	"log/slog"
	"net"
	"strconv"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkServedRequestPath is BenchmarkRequestPath with the HTTP server in
// it: a client on a kept-alive loopback connection sends the chat completion
// of 4 tokens (non-streamed and streamed) to the router's port, served by
// each --http-server, and reads the answer. allocs/op counts the server,
// the router and the client's reading (which allocates nothing); cpu-ns/op
// the CPU time of the whole process (client and engine included) per
// request.
func BenchmarkServedRequestPath(b *testing.B) {
	for _, server := range []string{HTTPServerLean, HTTPServerNet} {
		for _, c := range []struct {
			name   string
			stream bool
			answer [][]byte
		}{{"chat", false, chatAnswer()}, {"stream", true, streamAnswer()}} {
			b.Run(c.name+"/"+server, func(b *testing.B) {
				e := newCannedEngine(b, c.answer)
				opts := DefaultOptions()
				opts.HTTPServer = server
				r, err := New(opts, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
				if err != nil {
					b.Fatal(err)
				}
				r.Apply(&Snapshot{Revision: 1, Workers: []Worker{{ID: "e", URL: e.url(), Model: testModel, Healthy: true}}})
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					b.Fatal(err)
				}
				srv := opts.Server(r.Handler())
				hs := opts.Serving(srv, false)
				go func() { _ = hs.Serve(r.Listener(ln, srv)) }()
				b.Cleanup(func() { _ = hs.Close() })
				conn, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					b.Fatal(err)
				}
				defer conn.Close()
				body := `{"model":"` + testModel + `","messages":[{"role":"user","content":"Say hello in a few words, please"}],` +
					`"max_tokens":4,"stream":` + strconv.FormatBool(c.stream) + `}`
				req := []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nUser-Agent: bench\r\nAccept: */*\r\n" +
					"Content-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
				br := bufio.NewReaderSize(conn, 16<<10)
				exchange := func() {
					if _, err := conn.Write(req); err != nil {
						b.Fatal(err)
					}
					if err := readAnswerNoAlloc(br); err != nil {
						b.Fatal(err)
					}
				}
				exchange() // the connection to the engine opens
				b.ReportAllocs()
				cpu := processCPU()
				for b.Loop() {
					exchange()
				}
				b.ReportMetric(float64(processCPU()-cpu)/float64(b.N), "cpu-ns/op")
			})
		}
	}
}

// processCPU is the process's user and system CPU time so far, in
// nanoseconds: unlike ns/op it does not count the time other jobs on a
// loaded machine take.
func processCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// readAnswerNoAlloc reads one 200 answer, Content-Length or chunked,
// allocating nothing.
func readAnswerNoAlloc(br *bufio.Reader) error {
	line, err := br.ReadSlice('\n')
	if err != nil {
		return err
	}
	if !bytes.HasPrefix(line, []byte("HTTP/1.1 200 ")) {
		return &benchError{"status line " + string(line)}
	}
	length, chunked := -1, false
	for {
		line, err = br.ReadSlice('\n')
		if err != nil {
			return err
		}
		if len(line) <= 2 {
			break
		}
		k, v, _ := bytes.Cut(line, []byte(":"))
		switch {
		case bytes.EqualFold(k, []byte("Content-Length")):
			length = atoiBytes(bytes.TrimSpace(v), 10)
		case bytes.EqualFold(k, []byte("Transfer-Encoding")):
			chunked = true
		}
	}
	if !chunked {
		_, err = br.Discard(length)
		return err
	}
	for {
		line, err = br.ReadSlice('\n')
		if err != nil {
			return err
		}
		n := atoiBytes(bytes.TrimSpace(line), 16)
		if _, err := br.Discard(n + 2); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
	}
}

func atoiBytes(b []byte, base int) int {
	n := 0
	for _, c := range b {
		d := int(c - '0')
		if c >= 'a' {
			d = int(c-'a') + 10
		}
		n = n*base + d
	}
	return n
}

type benchError struct{ s string }

func (e *benchError) Error() string { return e.s }
