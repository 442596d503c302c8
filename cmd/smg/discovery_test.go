package main

import (
	"context"
	"io"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/labels"
)

// A bad selector fails `smg controlplane` and `smg agent` at startup with the
// Kubernetes parser's message, before anything listens.
func TestBadSelectorFailsAtStartup(t *testing.T) {
	_, perr := labels.Parse("app in (vllm")
	for name, runCmd := range map[string]func(context.Context, []string, io.Writer, io.Writer) error{
		"controlplane": runControlPlane,
		"agent":        runAgent,
	} {
		args := []string{"--port", "0", "--service-discovery", "--selector", "app in (vllm"}
		if name == "agent" {
			args = append(args, "--register", "--node", "n1")
		} else {
			args = append(args, "--grpc-port", "0")
		}
		err := runCmd(context.Background(), args, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), perr.Error()) || !strings.Contains(err.Error(), "--selector") {
			t.Errorf("smg %s: got %v, want the parser's message %q", name, err, perr)
		}
	}
}
