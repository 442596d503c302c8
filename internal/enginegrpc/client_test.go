package enginegrpc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sglangpb "github.com/smg-project/smg/gen/sglang/grpc/scheduler"
	commonpb "github.com/smg-project/smg/gen/smg/grpc/common"
	"github.com/smg-project/smg/internal/engine"
	"github.com/smg-project/smg/internal/enginegrpc/enginegrpctest"
	"github.com/smg-project/smg/sim"
)

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func simOptions(flavor string) sim.Options {
	o := sim.DefaultOptions()
	o.Flavor = flavor
	o.GRPC = true
	o.ITL = time.Millisecond
	o.MaxRunningRequests = 12
	return o
}

func startSim(t *testing.T, o sim.Options) *sim.Server {
	t.Helper()
	s, err := sim.Start("127.0.0.1:0", o, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newClient(t *testing.T, url string, o Options) *Client {
	t.Helper()
	c, err := New(url, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestInfoFromSimulator: flavor detection, model, window, DP size and PD
// role read from both flavors' servicers.
func TestInfoFromSimulator(t *testing.T) {
	for _, tc := range []struct {
		flavor, role string
		dp           int
	}{{sim.FlavorSGLang, sim.RolePrefill, 2}, {sim.FlavorVLLM, sim.RoleDecode, 3}, {sim.FlavorVLLM, sim.RoleRegular, 1}} {
		t.Run(tc.flavor+"-"+tc.role, func(t *testing.T) {
			o := simOptions(tc.flavor)
			o.Role, o.DPSize = tc.role, tc.dp
			s := startSim(t, o)
			c := newClient(t, s.GRPCURL(), Options{})
			info, err := c.Info(ctxT(t, 10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			wantRole := tc.role
			if wantRole == sim.RoleRegular {
				wantRole = ""
			}
			if info.Flavor != tc.flavor || info.Model != o.Model || info.MaxRunningRequests != 12 || info.DPSize != tc.dp || info.Role != wantRole {
				t.Fatalf("info %+v", info)
			}
			if tc.flavor == sim.FlavorSGLang && (info.BootstrapPort == 0 || !strings.HasSuffix(s.URL(), ":"+strconv.Itoa(info.BootstrapPort))) {
				t.Fatalf("bootstrap port %d, engine at %s", info.BootstrapPort, s.URL())
			}
			rep, err := c.Read(ctxT(t, 5*time.Second))
			if err != nil || len(rep.Ranks) != tc.dp || rep.Ranks[0].MaxRunning != 12 || rep.KVCapacity() != int64(tc.dp*o.KVCapacityTokens) {
				t.Fatalf("report %+v %v", rep, err)
			}
			tok, err := c.Tokenizer(ctxT(t, 5*time.Second), MaxTokenizerBytes)
			if err != nil || len(tok) == 0 {
				t.Fatalf("tokenizer: %d bytes, %v", len(tok), err)
			}
			if err := c.Health(ctxT(t, 5*time.Second)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// TestHTTPPortIsNamed: a grpc:// URL at an HTTP/1 server fails with an
// error naming the worker and saying it answers HTTP.
func TestHTTPPortIsNamed(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	defer srv.Close()
	url := "grpc://" + strings.TrimPrefix(srv.URL, "http://")
	c := newClient(t, url, Options{})
	_, err := c.Info(ctxT(t, 5*time.Second))
	if err == nil || !strings.Contains(err.Error(), url) || !strings.Contains(err.Error(), "answers HTTP") {
		t.Fatalf("err = %v", err)
	}
}

// TestNeverAnswers: a servicer that never answers ends the call at the
// caller's deadline, and a load poll at engine.RequestTimeout at most; the
// deadline is not a connection failure.
func TestNeverAnswers(t *testing.T) {
	c := newClient(t, enginegrpctest.Serve(t, &enginegrpctest.Servicer{Hang: true}), Options{})
	start := time.Now()
	_, err := c.Info(ctxT(t, 300*time.Millisecond))
	if status.Code(err) != codes.DeadlineExceeded || IsConnectionFailure(err) || Answered(err) {
		t.Fatalf("err = %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatal("the deadline did not bound the call")
	}
}

// TestTokenizerBounded: an endless, oversized, digest-less, mismatched or
// non-zip tokenizer stream is refused with an error naming the worker.
func TestTokenizerBounded(t *testing.T) {
	chunk := func(st grpc.ServerStreamingServer[commonpb.GetTokenizerChunk], data []byte, sum string) error {
		return st.Send(&commonpb.GetTokenizerChunk{Data: data, Sha256: sum})
	}
	for name, tc := range map[string]struct {
		send func(grpc.ServerStreamingServer[commonpb.GetTokenizerChunk]) error
		want string
	}{
		"endless empty chunks": {func(st grpc.ServerStreamingServer[commonpb.GetTokenizerChunk]) error {
			for {
				if err := chunk(st, nil, ""); err != nil {
					return err
				}
			}
		}, "chunks"},
		"oversized": {func(st grpc.ServerStreamingServer[commonpb.GetTokenizerChunk]) error {
			for {
				if err := chunk(st, make([]byte, 64<<10), ""); err != nil {
					return err
				}
			}
		}, "more than"},
		"no digest": {func(st grpc.ServerStreamingServer[commonpb.GetTokenizerChunk]) error {
			return chunk(st, []byte("PK"), "")
		}, "without a SHA-256"},
		"wrong digest": {func(st grpc.ServerStreamingServer[commonpb.GetTokenizerChunk]) error {
			return chunk(st, []byte("PK"), "00")
		}, "does not match"},
		"not a zip": {func(st grpc.ServerStreamingServer[commonpb.GetTokenizerChunk]) error {
			return chunk(st, []byte("abc"), sha("abc"))
		}, "not a zip"},
		"after the digest": {func(st grpc.ServerStreamingServer[commonpb.GetTokenizerChunk]) error {
			_ = chunk(st, []byte("a"), sha("a"))
			return chunk(st, []byte("b"), "")
		}, "after the one with the digest"},
		"error status": {func(grpc.ServerStreamingServer[commonpb.GetTokenizerChunk]) error {
			return status.Error(codes.NotFound, "no tokenizer")
		}, "no tokenizer"},
	} {
		t.Run(name, func(t *testing.T) {
			url := enginegrpctest.Serve(t, &enginegrpctest.Servicer{Tokenizer: tc.send})
			c := newClient(t, url, Options{})
			_, err := c.Tokenizer(ctxT(t, 20*time.Second), 1<<20)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), url) {
				t.Fatalf("err = %v", err)
			}
		})
	}
}

// TestReceiveLimit: a message above the receive limit fails the call
// (ResourceExhausted) instead of being buffered.
func TestReceiveLimit(t *testing.T) {
	var over atomic.Int64
	c := newClient(t, enginegrpctest.Serve(t, &enginegrpctest.Servicer{BigModel: true}), Options{MaxRecvMsgSize: 1 << 20, Oversized: func(string, error) { over.Add(1) }})
	_, err := c.Info(ctxT(t, 5*time.Second))
	if status.Code(err) != codes.ResourceExhausted || over.Load() != 1 {
		t.Fatalf("err = %v, counted %d", err, over.Load())
	}
}

// TestAbsurdLoads: negative counts, NaN usage, a rank of 2^31-1, a rank
// listed twice and no rank at all are no report (the engine answered).
func TestAbsurdLoads(t *testing.T) {
	for name, loads := range map[string][]*sglangpb.SchedulerLoad{
		"negative":    {{NumWaitingReqs: -1}},
		"NaN usage":   {{TokenUsage: math.NaN()}},
		"huge rank":   {{DpRank: math.MaxInt32}},
		"twice":       {{DpRank: 0}, {DpRank: 0}},
		"none":        nil,
		"inf thr":     {{GenThroughput: math.Inf(1)}},
		"negative mx": {{MaxRunningRequests: -3}},
		"negative kv": {{MaxTotalNumTokens: -5}},
	} {
		t.Run(name, func(t *testing.T) {
			c := newClient(t, enginegrpctest.Serve(t, &enginegrpctest.Servicer{Loads: loads}), Options{Flavor: FlavorSGLang})
			_, err := c.Read(ctxT(t, 5*time.Second))
			if !errors.Is(err, engine.ErrNoReport) {
				t.Fatalf("err = %v", err)
			}
		})
	}
	c := newClient(t, enginegrpctest.Serve(t, &enginegrpctest.Servicer{Loads: []*sglangpb.SchedulerLoad{{DpRank: 1, NumWaitingReqs: 2, TokenUsage: 0.5}, {DpRank: 0}}}), Options{Flavor: FlavorSGLang})
	rep, err := c.Read(ctxT(t, 5*time.Second))
	if err != nil || rep.Source != engine.SourceGRPCSGLang || len(rep.Ranks) != 2 || rep.Ranks[1].Waiting != 2 || rep.Ranks[0].DPRank != 0 {
		t.Fatalf("report %+v %v", rep, err)
	}
}

// TestConnectionFailure: nothing listening is a connection failure.
func TestConnectionFailure(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	c := newClient(t, "grpc://"+addr, Options{Flavor: FlavorVLLM})
	_, err := c.Read(ctxT(t, 5*time.Second))
	if !IsConnectionFailure(err) || Answered(err) || !strings.Contains(err.Error(), addr) {
		t.Fatalf("err = %v", err)
	}
}

func TestNewRefusesOtherSchemes(t *testing.T) {
	for _, u := range []string{"http://h:1", "grpc://", "::", "grpc://h:1/x"} {
		if _, err := New(u, Options{}); err == nil {
			t.Errorf("%q accepted", u)
		}
	}
	if _, err := New("grpc://h:1", Options{Flavor: "tgi"}); err == nil {
		t.Error("flavor tgi accepted")
	}
}
