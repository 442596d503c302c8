// Package enginegrpctest serves an SGLang scheduler that misbehaves on
// purpose, for tests of what smg does with a hostile gRPC worker.
package enginegrpctest

import (
	"context"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"

	sglangpb "github.com/smg-project/smg/gen/sglang/grpc/scheduler"
	commonpb "github.com/smg-project/smg/gen/smg/grpc/common"
)

// Servicer answers model "m" and the given loads, unless told otherwise.
type Servicer struct {
	sglangpb.UnimplementedSglangSchedulerServer
	// Hang: HealthCheck never answers (until the caller's deadline).
	Hang bool
	// BigModel: GetModelInfo's answer is over 2 MiB.
	BigModel bool
	// Loads is GetLoads's answer.
	Loads []*sglangpb.SchedulerLoad
	// Tokenizer streams GetTokenizer (nil: Unimplemented).
	Tokenizer func(grpc.ServerStreamingServer[commonpb.GetTokenizerChunk]) error
	// KVEvents streams SubscribeKvEvents (nil: Unimplemented).
	KVEvents func(grpc.ServerStreamingServer[commonpb.KvEventBatch]) error
}

// HealthCheck answers healthy, or never with Hang.
func (f *Servicer) HealthCheck(ctx context.Context, _ *sglangpb.HealthCheckRequest) (*sglangpb.HealthCheckResponse, error) {
	if f.Hang {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return &sglangpb.HealthCheckResponse{Healthy: true}, nil
}

// GetModelInfo answers model "m" (with a 2 MiB model path with BigModel).
func (f *Servicer) GetModelInfo(context.Context, *sglangpb.GetModelInfoRequest) (*sglangpb.GetModelInfoResponse, error) {
	r := &sglangpb.GetModelInfoResponse{ServedModelName: "m"}
	if f.BigModel {
		r.ModelPath = strings.Repeat("x", 2<<20)
	}
	return r, nil
}

// GetServerInfo answers no server arguments.
func (f *Servicer) GetServerInfo(context.Context, *sglangpb.GetServerInfoRequest) (*sglangpb.GetServerInfoResponse, error) {
	return &sglangpb.GetServerInfoResponse{}, nil
}

// GetLoads answers Loads.
func (f *Servicer) GetLoads(context.Context, *sglangpb.GetLoadsRequest) (*sglangpb.GetLoadsResponse, error) {
	return &sglangpb.GetLoadsResponse{Loads: f.Loads}, nil
}

// GetTokenizer runs Tokenizer.
func (f *Servicer) GetTokenizer(req *commonpb.GetTokenizerRequest, st grpc.ServerStreamingServer[commonpb.GetTokenizerChunk]) error {
	if f.Tokenizer == nil {
		return f.UnimplementedSglangSchedulerServer.GetTokenizer(req, st)
	}
	return f.Tokenizer(st)
}

// SubscribeKvEvents runs KVEvents.
func (f *Servicer) SubscribeKvEvents(req *commonpb.SubscribeKvEventsRequest, st grpc.ServerStreamingServer[commonpb.KvEventBatch]) error {
	if f.KVEvents == nil {
		return f.UnimplementedSglangSchedulerServer.SubscribeKvEvents(req, st)
	}
	return f.KVEvents(st)
}

// Serve serves f on loopback until the test ends and returns its grpc:// URL.
func Serve(t testing.TB, f *Servicer) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	sglangpb.RegisterSglangSchedulerServer(gs, f)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	return "grpc://" + ln.Addr().String()
}
