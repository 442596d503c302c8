package router

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// reads hands out one read's bytes and error per call.
type reads []struct {
	b   string
	err error
}

func (r *reads) Read(p []byte) (int, error) {
	if len(*r) == 0 {
		return 0, io.EOF
	}
	next := (*r)[0]
	*r = (*r)[1:]
	return copy(p, next.b), next.err
}

// flushLog records what each Flush sent.
type flushLog struct {
	*httptest.ResponseRecorder
	pending string
	flushed []string
}

func (f *flushLog) Write(p []byte) (int, error) {
	f.pending += string(p)
	return f.ResponseRecorder.Write(p)
}

func (f *flushLog) Flush() {
	f.flushed = append(f.flushed, f.pending)
	f.pending = ""
}

// A streamed answer is flushed after every read, so each event reaches the
// client as it arrives, except the bytes read with the body's end, which
// go out with the answer's end; bytes read with an error are flushed
// before it (the client gets them, then the error event). Every chunk is
// progress, stamped by the clock.
func TestCopyBodyFlushesEachReadButTheLast(t *testing.T) {
	at := time.Unix(1000, 0)
	r := &Router{clock: func() time.Time { at = at.Add(time.Millisecond); return at }}
	broken := errors.New("broken")
	for _, c := range []struct {
		name    string
		body    reads
		flushed []string
		err     error
	}{
		{"end with the last bytes", reads{{"data: a\n\n", nil}, {"data: b\n\n", nil}, {"data: [DONE]\n\n", io.EOF}},
			[]string{"data: a\n\n", "data: b\n\n"}, nil},
		{"end alone", reads{{"data: a\n\n", nil}, {"data: [DONE]\n\n", nil}, {"", io.EOF}},
			[]string{"data: a\n\n", "data: [DONE]\n\n"}, nil},
		{"error with bytes", reads{{"data: a\n\n", nil}, {"data: b\n\n", broken}},
			[]string{"data: a\n\n", "data: b\n\n"}, broken},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := &flushLog{ResponseRecorder: httptest.NewRecorder()}
			st := &workerState{}
			var stamps []time.Time
			body := c.body
			err := r.copyBody(w, &body, st, true, func(now time.Time) bool { stamps = append(stamps, now); return true })
			if err != c.err {
				t.Fatalf("err %v, want %v", err, c.err)
			}
			if len(w.flushed) != len(c.flushed) {
				t.Fatalf("flushed %q, want %q", w.flushed, c.flushed)
			}
			for i := range c.flushed {
				if w.flushed[i] != c.flushed[i] {
					t.Fatalf("flushed %q, want %q", w.flushed, c.flushed)
				}
			}
			if n := len(stamps); n == 0 || st.lastProgress.Load() != stamps[n-1].UnixNano() {
				t.Fatalf("last progress %d, want the last chunk's stamp %v", st.lastProgress.Load(), stamps)
			}
		})
	}
	// Not streaming: no flush at all.
	w := &flushLog{ResponseRecorder: httptest.NewRecorder()}
	body := reads{{"{}", nil}, {"", io.EOF}}
	if err := r.copyBody(w, &body, &workerState{}, false, func(time.Time) bool { return true }); err != nil || len(w.flushed) != 0 {
		t.Fatalf("err %v, flushed %q", err, w.flushed)
	}
	var _ http.Flusher = w
}
