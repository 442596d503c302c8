package h1client

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/smg-project/smg/internal/h1wire"
)

func read(t *testing.T, raw string, method string) (*http.Response, []byte, error) {
	t.Helper()
	br := bufio.NewReaderSize(strings.NewReader(raw), 4<<10)
	var p Parser
	var body Body
	resp, err := p.ReadResponse(br, &http.Request{Method: method}, &body)
	if err != nil {
		return nil, nil, err
	}
	b, err := io.ReadAll(&body)
	return resp, b, err
}

func TestReadResponseFraming(t *testing.T) {
	for _, tc := range []struct {
		name, raw, method string
		status            int
		length            int64
		close             bool
		body              string
		header            http.Header
	}{
		{name: "content-length", raw: "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
			status: 200, length: 2, body: "{}", header: http.Header{"Content-Type": {"application/json"}, "Content-Length": {"2"}}},
		{name: "chunked, canonical names, duplicates", raw: "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nx-a: 1\r\nX-A:  2 \r\n" +
			"Transfer-Encoding: chunked\r\nContent-Length: 99\r\n\r\n3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\nX-Trailer: t\r\n\r\n",
			status: 200, length: -1, body: "abcde", header: http.Header{"Content-Type": {"text/event-stream"}, "X-A": {"1", "2"}}},
		{name: "to the close", raw: "HTTP/1.1 200 OK\r\n\r\nall of it", status: 200, length: -1, close: true, body: "all of it", header: http.Header{}},
		{name: "HTTP/1.0", raw: "HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx", status: 200, length: 1, close: true, body: "x", header: http.Header{"Content-Length": {"1"}}},
		{name: "HTTP/1.0 keep-alive", raw: "HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 1\r\n\r\nx", status: 200, length: 1, body: "x",
			header: http.Header{"Connection": {"Keep-Alive"}, "Content-Length": {"1"}}},
		{name: "connection close", raw: "HTTP/1.1 503 Service Unavailable\r\nConnection: x, close\r\nContent-Length: 0\r\n\r\n", status: 503, close: true,
			header: http.Header{"Connection": {"x, close"}, "Content-Length": {"0"}}},
		{name: "informational skipped", raw: "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: x\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 1\r\n\r\nk",
			status: 201, length: 1, body: "k", header: http.Header{"Content-Length": {"1"}}},
		{name: "no content", raw: "HTTP/1.1 204 No Content\r\n\r\n", status: 204, header: http.Header{}},
		{name: "HEAD", raw: "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", method: http.MethodHead, status: 200, header: http.Header{"Content-Length": {"10"}}},
		{name: "no reason, bare LF", raw: "HTTP/1.1 404\nContent-Length: 1\n\nx", status: 404, length: 1, body: "x", header: http.Header{"Content-Length": {"1"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			method := tc.method
			if method == "" {
				method = http.MethodPost
			}
			resp, body, err := read(t, tc.raw, method)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.status || resp.ContentLength != tc.length || resp.Close != tc.close || string(body) != tc.body {
				t.Fatalf("status %d length %d close %v body %q", resp.StatusCode, resp.ContentLength, resp.Close, body)
			}
			if len(resp.Header) != len(tc.header) {
				t.Fatalf("header %v, want %v", resp.Header, tc.header)
			}
			for k, v := range tc.header {
				if strings.Join(resp.Header[k], "|") != strings.Join(v, "|") {
					t.Fatalf("header %v, want %v", resp.Header, tc.header)
				}
			}
		})
	}
}

// Every malformed answer is an error: the proxy answers 502 for it.
func TestReadResponseRefusesMalformedAnswers(t *testing.T) {
	big := strings.Repeat("a", MaxHeadBytes)
	many := strings.Repeat("X-F: 1\r\n", MaxFields+1)
	for _, tc := range []struct {
		name, raw string
		want      error
	}{
		{"empty", "", io.ErrUnexpectedEOF},
		{"not HTTP", "SSH-2.0-OpenSSH\r\n\r\n", ErrStatusLine},
		{"HTTP/2", "HTTP/2.0 200 OK\r\n\r\n", ErrStatusLine},
		{"letters in the status", "HTTP/1.1 2x0 OK\r\n\r\n", ErrStatusLine},
		{"short status", "HTTP/1.1 20\r\n\r\n", ErrStatusLine},
		{"status below 100", "HTTP/1.1 099 x\r\n\r\n", ErrStatusLine},
		{"no space after the status", "HTTP/1.1 2000\r\n\r\n", ErrStatusLine},
		{"head cut short", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n", io.ErrUnexpectedEOF},
		{"oversized field", "HTTP/1.1 200 OK\r\nX-Big: " + big + "\r\n\r\n", ErrHeadTooLarge},
		{"too many fields", "HTTP/1.1 200 OK\r\n" + many + "\r\n", ErrHeadTooLarge},
		{"no colon", "HTTP/1.1 200 OK\r\nBroken\r\n\r\n", ErrHeader},
		{"space in the name", "HTTP/1.1 200 OK\r\nX Y: 1\r\n\r\n", ErrHeader},
		{"folded", "HTTP/1.1 200 OK\r\nX: 1\r\n 2\r\n\r\n", ErrHeader},
		{"control byte", "HTTP/1.1 200 OK\r\nX: a\x00b\r\n\r\n", ErrHeader},
		{"signed length", "HTTP/1.1 200 OK\r\nContent-Length: +1\r\n\r\nx", ErrContentLength},
		{"two lengths", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxx", ErrContentLength},
		{"gzip coding", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", ErrTE},
		{"length cut short", "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", io.ErrUnexpectedEOF},
		{"chunk cut short", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nabc", io.ErrUnexpectedEOF},
		{"no last chunk", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n", io.ErrUnexpectedEOF},
		{"bad chunk size", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n", h1wire.ErrChunk},
		{"chunk without its CRLF", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n0\r\n\r\n", h1wire.ErrChunk},
		{"huge chunk", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\nabc", h1wire.ErrChunkTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := read(t, tc.raw, http.MethodPost)
			if !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
		})
	}
}

// The last bytes of a body come with io.EOF when its end is already
// buffered: the connection goes back to the pool without another read.
func TestBodyEndsWithItsLastBytes(t *testing.T) {
	for _, raw := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloNEXT",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nNEXT",
	} {
		br := bufio.NewReader(strings.NewReader(raw))
		var p Parser
		var body Body
		if _, err := p.ReadResponse(br, &http.Request{Method: http.MethodPost}, &body); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64)
		n, err := body.Read(buf)
		if string(buf[:n]) != "hello" || err != io.EOF {
			t.Fatalf("%q: read %q, %v; want the body with io.EOF", raw, buf[:n], err)
		}
		if rest, _ := io.ReadAll(br); string(rest) != "NEXT" {
			t.Fatalf("%q: the next answer's bytes are %q", raw, rest)
		}
	}
}

// Chunks that arrived together are read together (one write to the
// client), as net/http's reader does.
func TestBufferedChunksReadTogether(t *testing.T) {
	raw := "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n1\r\n!\r\n0\r\n\r\n"
	br := bufio.NewReader(strings.NewReader(raw))
	var p Parser
	var body Body
	if _, err := p.ReadResponse(br, &http.Request{Method: http.MethodPost}, &body); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, err := body.Read(buf)
	if string(buf[:n]) != "hello world!" || err != io.EOF {
		t.Fatalf("read %q, %v; want the three chunks with io.EOF", buf[:n], err)
	}
	// A small buffer takes what fits, the rest follows.
	br = bufio.NewReader(strings.NewReader(raw))
	if _, err := p.ReadResponse(br, &http.Request{Method: http.MethodPost}, &body); err != nil {
		t.Fatal(err)
	}
	var got []byte
	small := make([]byte, 4)
	for {
		n, err := body.Read(small)
		got = append(got, small[:n]...)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if string(got) != "hello world!" {
		t.Fatalf("read %q in small pieces", got)
	}
}

// A streamed chunk is handed on as it arrives, never held for the next.
func TestChunkHandedOnBeforeTheNextArrives(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pr, pw := io.Pipe()
		go func() {
			_, _ = pw.Write([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nevent1\r\n"))
		}()
		br := bufio.NewReader(pr)
		var p Parser
		var body Body
		first := make(chan string, 1)
		go func() {
			if _, err := p.ReadResponse(br, &http.Request{Method: http.MethodPost}, &body); err != nil {
				first <- err.Error()
				return
			}
			buf := make([]byte, 64)
			n, err := body.Read(buf)
			first <- fmt.Sprint(string(buf[:n]), err)
		}()
		synctest.Wait()
		select {
		case got := <-first:
			if got != "event1<nil>" {
				t.Fatalf("first read: %s", got)
			}
		default:
			t.Fatal("the first chunk was held waiting for the next")
		}
		go func() {
			_, _ = pw.Write([]byte("6\r\nevent2\r\n0\r\n\r\n"))
			pw.Close()
		}()
		rest, err := io.ReadAll(&body)
		if string(rest) != "event2" || err != nil {
			t.Fatalf("rest %q, %v", rest, err)
		}
	})
}

func TestWriteRequest(t *testing.T) {
	u, _ := url.Parse("http://engine:8000/v1/chat/completions?x=1")
	req := &http.Request{Method: http.MethodPost, URL: u, Host: u.Host,
		Header: http.Header{"Content-Type": {"application/json"}, "Content-Length": {"999"}, "Transfer-Encoding": {"chunked"}}}
	var out bytes.Buffer
	bw := bufio.NewWriter(&out)
	if err := WriteRequest(bw, req, []byte(`{"a":1}`)); err != nil {
		t.Fatal(err)
	}
	bw.Flush()
	want := "POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: engine:8000\r\nContent-Type: application/json\r\n" +
		"User-Agent: Go-http-client/1.1\r\nContent-Length: 7\r\n\r\n{\"a\":1}"
	if out.String() != want {
		t.Fatalf("wrote %q\nwant  %q", out.String(), want)
	}
	// net/http's server reads it as sent.
	got, err := http.ReadRequest(bufio.NewReader(strings.NewReader(out.String())))
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(got.Body); string(b) != `{"a":1}` || got.Host != "engine:8000" || got.URL.RawQuery != "x=1" {
		t.Fatalf("read back %+v %q", got, b)
	}

	// A body of unknown length goes chunked; one from a reader, as declared.
	for _, tc := range []struct {
		length int64
		body   io.Reader
		want   string
	}{
		{-1, strings.NewReader("abc"), "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"},
		{3, strings.NewReader("abc"), "Content-Length: 3\r\n\r\nabc"},
	} {
		out.Reset()
		req := &http.Request{Method: http.MethodPost, URL: u, Header: http.Header{"User-Agent": {"t"}},
			Body: io.NopCloser(tc.body), ContentLength: tc.length}
		if err := WriteRequest(bw, req, nil); err != nil {
			t.Fatal(err)
		}
		bw.Flush()
		if !strings.HasSuffix(out.String(), "User-Agent: t\r\n"+tc.want) {
			t.Fatalf("wrote %q, want it to end %q", out.String(), tc.want)
		}
	}

	// Fields net/http would refuse to send are refused.
	for _, h := range []http.Header{{"Bad Name": {"x"}}, {"X": {"a\r\nInjected: 1"}}} {
		req := &http.Request{Method: http.MethodPost, URL: u, Header: h}
		if err := WriteRequest(bufio.NewWriter(io.Discard), req, []byte("x")); err == nil {
			t.Fatalf("header %v written", h)
		}
	}
}

// What net/http parses the same bytes into, the parser agrees with when it
// accepts them, and it never panics or reads past the answer.
func FuzzReadResponse(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
		"HTTP/1.0 200 OK\r\n\r\nbody",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n0\r\nT: 1\r\n\r\n",
		"HTTP/1.1 500 x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		br := bufio.NewReaderSize(strings.NewReader(raw), 64)
		var p Parser
		var body Body
		resp, err := p.ReadResponse(br, &http.Request{Method: http.MethodPost}, &body)
		if err != nil {
			return
		}
		got, err := io.ReadAll(&body)
		if err != nil {
			return
		}
		nbr := bufio.NewReader(strings.NewReader(raw))
		want, werr := http.ReadResponse(nbr, &http.Request{Method: http.MethodPost})
		for werr == nil && want.StatusCode >= 100 && want.StatusCode < 200 && want.StatusCode != http.StatusSwitchingProtocols {
			want, werr = http.ReadResponse(nbr, &http.Request{Method: http.MethodPost}) // as the proxy skips them
		}
		if werr != nil {
			return // the stricter side may accept what net/http refuses only in ways checked above
		}
		wb, werr := io.ReadAll(want.Body)
		if werr != nil {
			return
		}
		if resp.StatusCode != want.StatusCode || !bytes.Equal(got, wb) {
			t.Fatalf("%q: status %d body %q; net/http: %d %q", raw, resp.StatusCode, got, want.StatusCode, wb)
		}
		for k := range resp.Header {
			if k != "Content-Length" && k != "Connection" && resp.Header.Get(k) != want.Header.Get(k) {
				t.Fatalf("%q: %s %q; net/http: %q", raw, k, resp.Header.Get(k), want.Header.Get(k))
			}
		}
	})
}
