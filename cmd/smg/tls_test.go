package main

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/smg-project/smg/internal/tlsutil/testca"
)

// The Raft TLS flags go together, need --data-dir, and a bad file stops the
// start naming the flag, on both commands that run a control plane.
func TestRaftTLSFlagsRefusedAtStartup(t *testing.T) {
	ca := testca.NewDir(t, "raft-ca")
	cert, key, _ := ca.Issue("cp0", "smg:controlplane:cp0")
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no CA", []string{"--data-dir", dir, "--raft-tls-cert-file", cert, "--raft-tls-key-file", key}, "go together"},
		{"no key", []string{"--data-dir", dir, "--raft-tls-cert-file", cert, "--raft-tls-ca-file", ca.CAFile}, "--raft-tls-cert-file and --raft-tls-key-file go together"},
		{"server name alone", []string{"--data-dir", dir, "--raft-tls-server-name", "cp"}, "--raft-tls-server-name needs"},
		{"no data dir", []string{"--raft-tls-cert-file", cert, "--raft-tls-key-file", key, "--raft-tls-ca-file", ca.CAFile}, "need --data-dir"},
		{"a key for the CA file", []string{"--data-dir", dir, "--raft-tls-cert-file", cert, "--raft-tls-key-file", key, "--raft-tls-ca-file", key}, "--raft-tls-ca-file"},
	} {
		for name, runCmd := range map[string]func(context.Context, []string, io.Writer, io.Writer) error{
			"controlplane": runControlPlane,
			"launch":       runLaunch,
		} {
			args := append([]string{"--port", "0", "--grpc-port", "0"}, tc.args...)
			if err := runCmd(context.Background(), args, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("smg %s, %s: got %v, want an error naming %q", name, tc.name, err, tc.want)
			}
		}
	}
}
