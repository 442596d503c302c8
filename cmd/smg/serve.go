package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/smg-project/smg/internal/backoff"
	"github.com/smg-project/smg/internal/cli"
	"github.com/smg-project/smg/internal/supervise"
)

const serveSummary = `Start engines and the gateway on one machine: --dp-size engines of --backend (each
on its own port from --engine-port, supervised: output prefixed, restarted with backoff
when it exits), and smg launch in front of them. Every flag of smg launch is taken here
with the --router- prefix and the same default (--router-port, --router-worker-overload-shed,
...). Arguments after -- are passed to every engine. On SIGTERM the gateway drains first,
then the engines are stopped.`

// serveFlags are serve's own flags; the gateway's come from launch's table.
type serveFlags struct {
	backend       string
	model         string
	dpSize        int
	engineHost    string
	enginePort    int
	engineBinary  string
	gpusPerEngine int
	stopGrace     time.Duration
	restartMax    time.Duration
}

func (s *serveFlags) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&s.backend, "backend", "", "engine to start: vllm, sglang or sim (required)")
	fs.StringVar(&s.model, "model", "", "model the engines serve (a path or hub name; sim: the served model id, default sim-model)")
	fs.IntVar(&s.dpSize, "dp-size", 1, "number of engines (data parallel), engine i on --engine-port+i")
	fs.StringVar(&s.engineHost, "engine-host", "127.0.0.1", "address the engines listen on")
	fs.IntVar(&s.enginePort, "engine-port", 31000, "port of the first engine")
	fs.StringVar(&s.engineBinary, "engine-binary", "", "engine executable (default: vllm for vllm, python3 for sglang, this smg for sim)")
	fs.IntVar(&s.gpusPerEngine, "gpus-per-engine", 0, "GPUs per engine: engine i gets CUDA_VISIBLE_DEVICES i*N..i*N+N-1 (0: leave CUDA_VISIBLE_DEVICES as it is)")
	fs.DurationVar(&s.stopGrace, "engine-stop-grace", 30*time.Second, "how long an engine has after SIGTERM before it is killed")
	fs.DurationVar(&s.restartMax, "engine-restart-max-backoff", 30*time.Second, "longest wait before restarting an engine that keeps exiting")
}

// validate reports every bad flag at once.
func (s *serveFlags) validate() error {
	var errs []error
	switch s.backend {
	case "vllm", "sglang", "sim":
	case "":
		errs = append(errs, errors.New("--backend is required: vllm, sglang or sim"))
	default:
		errs = append(errs, fmt.Errorf("--backend %q: want vllm, sglang or sim", s.backend))
	}
	if s.model == "" && s.backend != "sim" && s.backend != "" {
		errs = append(errs, fmt.Errorf("--model is required with --backend %s", s.backend))
	}
	if s.dpSize < 1 || s.dpSize > 1024 {
		errs = append(errs, fmt.Errorf("--dp-size must be within 1..1024, got %d", s.dpSize))
	}
	if s.enginePort < 1 || s.enginePort+s.dpSize-1 > 65535 {
		errs = append(errs, fmt.Errorf("--engine-port %d with --dp-size %d leaves the port range", s.enginePort, s.dpSize))
	}
	if s.gpusPerEngine < 0 {
		errs = append(errs, fmt.Errorf("--gpus-per-engine must be >= 0, got %d", s.gpusPerEngine))
	}
	if s.stopGrace <= 0 {
		errs = append(errs, fmt.Errorf("--engine-stop-grace must be > 0, got %s", s.stopGrace))
	}
	if s.restartMax < time.Second {
		errs = append(errs, fmt.Errorf("--engine-restart-max-backoff must be >= 1s, got %s", s.restartMax))
	}
	return errors.Join(errs...)
}

// engineCommand is the command line of engine i, after checking that the
// backend's executable is there.
func (s *serveFlags) engineCommand(i int, passthrough []string) (path string, args []string, err error) {
	port := strconv.Itoa(s.enginePort + i)
	switch s.backend {
	case "sim":
		path = s.engineBinary
		if path == "" {
			if path, err = os.Executable(); err != nil {
				return "", nil, fmt.Errorf("--backend sim: finding this smg binary: %w", err)
			}
		}
		args = []string{"sim", "--host", s.engineHost, "--port", port}
		if s.model != "" {
			args = append(args, "--model", s.model)
		}
	case "vllm":
		path = cmp.Or(s.engineBinary, "vllm")
		args = []string{"serve", s.model, "--host", s.engineHost, "--port", port}
	case "sglang":
		path = cmp.Or(s.engineBinary, "python3")
		args = []string{"-m", "sglang.launch_server", "--model-path", s.model, "--host", s.engineHost, "--port", port}
	}
	resolved, err := exec.LookPath(path)
	if err != nil {
		return "", nil, fmt.Errorf("--backend %s needs %q, which is not installed (%v); install it or pass --engine-binary", s.backend, path, err)
	}
	return resolved, append(args, passthrough...), nil
}

// checkBackend fails early when the backend's package is missing: sglang
// runs as a Python module, so python3 alone is not enough.
func (s *serveFlags) checkBackend(ctx context.Context, python string) error {
	if s.backend != "sglang" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, python, "-c", "import sglang").CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if i := strings.LastIndexByte(msg, '\n'); i >= 0 {
			msg = msg[i+1:]
		}
		return fmt.Errorf("--backend sglang: %s cannot import sglang (%v: %s); install SGLang or pass --engine-binary", python, err, msg)
	}
	return nil
}

func (s *serveFlags) engineEnv(i int) []string {
	if s.gpusPerEngine == 0 {
		return nil
	}
	ids := make([]string, s.gpusPerEngine)
	for g := range ids {
		ids[g] = strconv.Itoa(i*s.gpusPerEngine + g)
	}
	return []string{"CUDA_VISIBLE_DEVICES=" + strings.Join(ids, ",")}
}

// routerPrefixed registers every flag of launch's table on fs again as
// --router-<name>, sharing its value and default; a usage that names another
// launch flag names it with the prefix too.
func routerPrefixed(fs *flag.FlagSet, l *launchConfig) {
	launch := flag.NewFlagSet("launch", flag.ContinueOnError)
	l.addFlags(launch)
	launch.VisitAll(func(f *flag.Flag) {
		usage := flagRef.ReplaceAllStringFunc(f.Usage, func(ref string) string {
			if launch.Lookup(ref[2:]) == nil {
				return ref
			}
			return "--router-" + ref[2:]
		})
		fs.Var(f.Value, "router-"+f.Name, usage)
	})
}

// flagRef matches a flag named in a usage text.
var flagRef = regexp.MustCompile(`--[a-z][a-z0-9-]*[a-z0-9]`)

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("serve", serveSummary, stdout)
	var s serveFlags
	s.addFlags(fs)
	var l launchConfig
	routerPrefixed(fs, &l)
	passthrough := []string{}
	if i := slices.Index(args, "--"); i >= 0 {
		args, passthrough = args[:i], args[i+1:]
	}
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if err := s.validate(); err != nil {
		return err
	}
	log, err := l.common.logger(stderr)
	if err != nil {
		return err
	}
	engines := make([]*supervise.Process, s.dpSize)
	urls := make([]string, s.dpSize)
	out := &supervise.SyncWriter{W: stderr}
	for i := range engines {
		path, eargs, err := s.engineCommand(i, passthrough)
		if err != nil {
			return err
		}
		if i == 0 {
			if err := s.checkBackend(ctx, path); err != nil {
				return err
			}
		}
		engines[i] = &supervise.Process{
			Name: "engine-" + strconv.Itoa(i), Path: path, Args: eargs, Env: s.engineEnv(i), Output: out,
			StopGrace: s.stopGrace, StableAfter: time.Minute,
			Restart: backoff.Policy{Initial: 500 * time.Millisecond, Max: s.restartMax},
		}
		urls[i] = "http://" + net.JoinHostPort(s.engineHost, strconv.Itoa(s.enginePort+i))
	}
	if len(l.cp.WorkerURLs) == 0 {
		l.cp.WorkerURLs = urls
	}
	// Engines outlive ctx: on SIGTERM the gateway drains first, and only then
	// are the engines stopped.
	engineCtx, stopEngines := context.WithCancel(context.WithoutCancel(ctx))
	gatewayCtx, stopGateway := context.WithCancel(ctx)
	defer stopGateway()
	var (
		wg        sync.WaitGroup
		once      sync.Once
		engineErr error
	)
	for _, e := range engines {
		wg.Go(func() {
			// An engine that cannot be started at all ends serve.
			if err := e.Run(engineCtx, log); err != nil {
				once.Do(func() {
					log.Error("Engine cannot be started; stopping", "err", err)
					engineErr = err
					stopGateway()
				})
			}
		})
	}
	log.Info("smg serve starting", "backend", s.backend, "engines", s.dpSize, "worker_urls", strings.Join(urls, " "))
	err = l.run(gatewayCtx, log)
	stopEngines()
	wg.Wait()
	return errors.Join(err, engineErr)
}
