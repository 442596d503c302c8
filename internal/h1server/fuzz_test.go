package h1server

import (
	"bufio"
	"bytes"
	"io"
	"maps"
	"net/http"
	"testing"
)

// parseOne runs the lean parser and reads the body: the request, its body
// and what follows it on the connection.
func parseOne(data []byte) (*http.Request, []byte, []byte, error) {
	br := bufio.NewReaderSize(bytes.NewReader(data), bufSize)
	p := parser{br: br, limits: Limits{}.withDefaults()}
	req := &http.Request{Header: http.Header{}}
	var h reqHead
	if err := p.readRequest(req, &h); err != nil {
		return nil, nil, nil, err
	}
	b := &body{c: &conn{}, br: br, chunked: h.chunked, remaining: max(h.length, 0)}
	got, err := io.ReadAll(b)
	if err != nil {
		return nil, nil, nil, err
	}
	rest, _ := io.ReadAll(br)
	return req, got, rest, nil
}

// Whatever the lean parser accepts, net/http reads as the same request,
// with the same body, ending at the same byte: the two can never disagree
// on where one request ends and the next begins.
func FuzzRequestParser(f *testing.F) {
	for _, seed := range []string{
		"GET / HTTP/1.1\r\nHost: h\r\n\r\n",
		"GET /a/b?c=d HTTP/1.1\r\nHost: h:80\r\nAccept: */*\r\nX-A: 1\r\nX-A: 2\r\n\r\nGET / HTTP/1.1\r\n",
		"POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhelloGET",
		"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3;e=1\r\nabc\r\n0\r\nT: 1\r\n\r\nNEXT",
		"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n",
		"GET http://x.example/p%20q?r HTTP/1.1\r\nHost: h\r\n\r\n",
		"OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n",
		"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\nx",
		"\r\nGET / HTTP/1.1\r\nHost: h\r\nX: a\r\n b\r\n\r\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, body, rest, err := parseOne(data)
		if err != nil {
			return
		}
		want, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(data)))
		if err != nil {
			t.Fatalf("lean accepted what net/http refuses (%v): %q", err, data)
		}
		wantBody, err := io.ReadAll(want.Body)
		if err != nil {
			t.Fatalf("lean read a body net/http cannot (%v): %q", err, data)
		}
		// net/http's reader hides what it buffered: find where it stopped.
		wbr := bufio.NewReader(bytes.NewReader(data))
		want2, _ := http.ReadRequest(wbr)
		_, _ = io.ReadAll(want2.Body)
		wantRest, _ := io.ReadAll(wbr)
		if !bytes.Equal(rest, wantRest) || !bytes.Equal(body, wantBody) {
			t.Fatalf("body %q rest %q, net/http: body %q rest %q, for %q", body, rest, wantBody, wantRest, data)
		}
		if req.Method != want.Method || req.URL.String() != want.URL.String() || req.Host != want.Host ||
			req.ContentLength != want.ContentLength || req.Close != want.Close || req.RequestURI != want.RequestURI ||
			req.ProtoMinor != want.ProtoMinor {
			t.Fatalf("lean %s %s host=%q cl=%d close=%v; net/http %s %s host=%q cl=%d close=%v; for %q",
				req.Method, req.URL, req.Host, req.ContentLength, req.Close,
				want.Method, want.URL, want.Host, want.ContentLength, want.Close, data)
		}
		h, wh := maps.Clone(req.Header), maps.Clone(want.Header)
		for _, k := range []string{"Host", "Transfer-Encoding"} {
			delete(h, k)
			delete(wh, k)
		}
		if !maps.EqualFunc(h, wh, func(a, b []string) bool { return slicesEqual(a, b) }) {
			t.Fatalf("header %v, net/http %v, for %q", h, wh, data)
		}
	})
}

func slicesEqual(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
