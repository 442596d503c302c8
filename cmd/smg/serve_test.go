package main

import (
	"bytes"
	"context"
	"flag"
	"strings"
	"testing"

	"github.com/smg-project/smg/internal/cli"
)

// Every flag of smg launch is taken by smg serve with the --router- prefix and
// the same default, walked from launch's own table so a new launch flag cannot
// be missing under serve.
func TestServeTakesEveryLaunchFlagWithTheRouterPrefix(t *testing.T) {
	launch := flag.NewFlagSet("launch", flag.ContinueOnError)
	var ref launchConfig
	ref.addFlags(launch)
	serve := flag.NewFlagSet("serve", flag.ContinueOnError)
	var s serveFlags
	s.addFlags(serve)
	var l launchConfig
	routerPrefixed(serve, &l)
	n := 0
	launch.VisitAll(func(f *flag.Flag) {
		n++
		g := serve.Lookup("router-" + f.Name)
		if g == nil {
			t.Errorf("smg serve has no --router-%s", f.Name)
			return
		}
		if g.DefValue != f.DefValue {
			t.Errorf("--router-%s defaults to %q, launch's --%s to %q", f.Name, g.DefValue, f.Name, f.DefValue)
		}
	})
	if n < 50 {
		t.Fatalf("launch has %d flags: the walk is broken", n)
	}
	// serve's own flags do not shadow a launch flag under its plain name.
	serve.VisitAll(func(f *flag.Flag) {
		if !strings.HasPrefix(f.Name, "router-") && launch.Lookup(f.Name) != nil {
			t.Errorf("serve's own --%s has the name of a launch flag", f.Name)
		}
	})
}

// The spec's own examples set the gateway's options under serve.
func TestServeRouterFlagsReachTheGateway(t *testing.T) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	var s serveFlags
	s.addFlags(fs)
	var l launchConfig
	routerPrefixed(fs, &l)
	err := cli.Parse(fs, []string{"--backend", "sim", "--router-worker-overload-shed", "--router-worker-stall-secs", "7",
		"--router-worker-wedge-secs", "9", "--router-worker-stale-secs", "20", "--router-port", "31234",
		"--router-worker-urls", "http://a:1", "http://b:2"})
	if err != nil {
		t.Fatal(err)
	}
	if !l.router.WorkerOverloadShed {
		t.Error("--router-worker-overload-shed did not reach the router")
	}
	if l.common.port != 31234 {
		t.Errorf("--router-port: %d", l.common.port)
	}
	if got := l.cp.WorkerURLs.String(); got != "http://a:1 http://b:2" {
		t.Errorf("--router-worker-urls: %q", got)
	}
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name == "router-worker-stall-secs" && f.Value.String() != "7" ||
			f.Name == "router-worker-wedge-secs" && f.Value.String() != "9" ||
			f.Name == "router-worker-stale-secs" && f.Value.String() != "20" {
			t.Errorf("--%s = %s", f.Name, f.Value)
		}
	})
}

func TestServeRefusesBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--backend is required"},
		{[]string{"--backend", "tgi"}, `--backend "tgi"`},
		{[]string{"--backend", "vllm"}, "--model is required"},
		{[]string{"--backend", "sim", "--dp-size", "0"}, "--dp-size"},
		{[]string{"--backend", "sim", "--engine-port", "65535", "--dp-size", "2"}, "leaves the port range"},
		{[]string{"--backend", "sim", "--gpus-per-engine", "-1"}, "--gpus-per-engine"},
		{[]string{"--backend", "vllm", "--model", "m", "--engine-binary", "/nonexistent/vllm"}, `needs "/nonexistent/vllm", which is not installed`},
		{[]string{"--backend", "sglang", "--model", "m", "--engine-binary", "/nonexistent/python3"}, `needs "/nonexistent/python3"`},
	} {
		var out bytes.Buffer
		if code := run(context.Background(), append([]string{"serve"}, tc.args...), &out, &out); code == 0 {
			t.Errorf("serve %v exited 0", tc.args)
		}
		if !strings.Contains(out.String(), tc.want) {
			t.Errorf("serve %v: %q does not say %q", tc.args, out.String(), tc.want)
		}
	}
}

func TestServeEngineCommands(t *testing.T) {
	s := serveFlags{backend: "sim", model: "m", enginePort: 9000, engineHost: "127.0.0.1", engineBinary: "true", gpusPerEngine: 2}
	_, args, err := s.engineCommand(1, []string{"--max-running-requests", "4"})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(args, " "); got != "sim --host 127.0.0.1 --port 9001 --model m --max-running-requests 4" {
		t.Errorf("sim engine 1: %q", got)
	}
	if got := s.engineEnv(1); len(got) != 1 || got[0] != "CUDA_VISIBLE_DEVICES=2,3" {
		t.Errorf("engine 1 of 2 GPUs each: %v", got)
	}
	s.backend = "sglang"
	if _, args, _ = s.engineCommand(0, nil); strings.Join(args, " ") != "-m sglang.launch_server --model-path m --host 127.0.0.1 --port 9000" {
		t.Errorf("sglang engine 0: %q", args)
	}
	s.backend = "vllm"
	if _, args, _ = s.engineCommand(0, nil); strings.Join(args, " ") != "serve m --host 127.0.0.1 --port 9000" {
		t.Errorf("vllm engine 0: %q", args)
	}
}
