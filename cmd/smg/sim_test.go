package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/smg-project/smg/internal/cli"
	"github.com/smg-project/smg/internal/enginegrpc"
)

func TestRunSimServesFleetUntilCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- runSim(ctx, []string{"--port", "0", "--count", "2", "--flavor", "sglang", "--itl-ms", "0.5",
			"--fault-freeze", "--fault-engines", "1", "--log-level", "warn"}, outW, io.Discard)
		outW.Close()
	}()
	sc := bufio.NewScanner(outR)
	var urls []string
	for len(urls) < 2 && sc.Scan() {
		urls = append(urls, sc.Text())
	}
	if len(urls) != 2 {
		t.Fatalf("printed %v, want one URL per engine", urls)
	}
	for i, u := range urls {
		if !strings.HasPrefix(u, "http://127.0.0.1:") {
			t.Errorf("engine %d URL %q", i, u)
		}
		resp, err := http.Get(u + "/v1/loads")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("engine %d /v1/loads: %d", i, resp.StatusCode)
		}
		resp, err = http.Get(u + "/sim/fault")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if frozen := bytes.Contains(b, []byte(`"freeze":true`)); frozen != (i == 1) {
			t.Errorf("engine %d fault %s: --fault-engines 1 must freeze engine 1 only", i, b)
		}
	}
	cancel()
	go io.Copy(io.Discard, outR)
	if err := <-done; err != nil {
		t.Errorf("runSim returned %v after cancel, want nil", err)
	}
}

func TestRunSimFlags(t *testing.T) {
	var help bytes.Buffer
	if err := runSim(t.Context(), []string{"--help"}, io.Discard, &help); !errors.Is(err, cli.ErrHelp) {
		t.Errorf("--help: %v", err)
	}
	for _, flag := range []string{"--max-running-requests", "--kv-capacity-tokens", "--prefill-tokens-per-sec", "--itl-ms",
		"--itl-growth", "--default-max-tokens", "--dp-size", "--role", "--bootstrap-timeout-secs", "--seed", "--control-port"} {
		if !strings.Contains(help.String(), strings.TrimPrefix(flag, "-")) {
			t.Errorf("--help lacks %s", flag)
		}
	}
	for _, args := range [][]string{
		{"--flavor", "tgi", "--port", "0"},
		{"--count", "0", "--port", "0"},
		{"--port", "0", "--fault-engines", "5"},
		{"--bootstrap-timeout-secs", "1.5"},
		{"--port", "0", "--grpc-port", "70000"},
		{"--port", "0", "--grpc-port", "0", "--grpc-extensions", "some"},
	} {
		if err := runSim(t.Context(), args, io.Discard, io.Discard); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

func TestVersionFlagPrintsTheBuild(t *testing.T) {
	for _, arg := range []string{"--version", "version"} {
		var out bytes.Buffer
		if code := run(t.Context(), []string{arg}, &out, io.Discard); code != 0 {
			t.Fatalf("smg %s exited %d", arg, code)
		}
		if !strings.HasPrefix(out.String(), "smg ") || !strings.Contains(out.String(), "commit ") {
			t.Fatalf("smg %s printed %q, want the version and commit", arg, out.String())
		}
	}
}

// TestRunSimGRPCPort: with --grpc-port each engine prints its HTTP and its
// gRPC URL on one line, and the gRPC port answers.
func TestRunSimGRPCPort(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- runSim(ctx, []string{"--port", "0", "--grpc-port", "0", "--count", "2", "--log-level", "warn"}, outW, io.Discard)
		outW.Close()
	}()
	sc := bufio.NewScanner(outR)
	for i := range 2 {
		if !sc.Scan() {
			t.Fatal("no URL line")
		}
		f := strings.Fields(sc.Text())
		if len(f) != 2 || !strings.HasPrefix(f[0], "http://127.0.0.1:") || !strings.HasPrefix(f[1], "grpc://127.0.0.1:") {
			t.Fatalf("engine %d printed %q", i, sc.Text())
		}
		c, err := enginegrpc.New(f[1], enginegrpc.Options{})
		if err != nil {
			t.Fatal(err)
		}
		err = c.Health(ctx)
		c.Close()
		if err != nil {
			t.Fatalf("engine %d gRPC: %v", i, err)
		}
	}
	cancel()
	go io.Copy(io.Discard, outR)
	if err := <-done; err != nil {
		t.Errorf("runSim returned %v after cancel, want nil", err)
	}
}
