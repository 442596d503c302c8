package e2e

import (
	"strings"
	"testing"
	"time"
)

// A gRPC engine behind `smg launch`: registered over gRPC, it reaches the
// router through the watch stream as a routing candidate, and the router
// serves it chat completions, plain and streamed, tokenizing with the
// engine's own tokenizer (GetTokenizer) and detokenizing its token stream.
func TestLaunchServesGRPCWorker(t *testing.T) {
	lines := startSims(t, 1, "--grpc-port", "0")
	fields := strings.Fields(lines[0])
	if len(fields) != 2 || !strings.HasPrefix(fields[1], "grpc://") {
		t.Fatalf("sim line %q has no gRPC URL", lines[0])
	}
	grpcURL := fields[1]
	base, _ := startLaunch(t, "launch", []string{grpcURL})
	a := admin{base: base}
	a.waitReady(t, grpcURL)
	a.waitRoutersApplied(t, 1)
	if err := chat(base, 16, false, 30*time.Second).completeJSON(); err != nil {
		t.Errorf("chat completion from the gRPC worker: %v", err)
	}
	if err := chat(base, 16, true, 30*time.Second).completeStream(); err != nil {
		t.Errorf("streamed chat completion from the gRPC worker: %v", err)
	}
}
