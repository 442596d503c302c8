package suite

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/smg-project/smg/internal/testutil"
)

// Proc is a child smg process (internal/testutil's harness) whose output is
// watched for the addresses it prints when it starts.
type Proc struct {
	*testutil.Proc
	done <-chan struct{}
}

// startProc runs bin with args, in its own process group, and calls onLine
// with every stdout and stderr line. A non-empty pin is a command bin runs
// under (taskset -c N: the CPUs it may run on).
func startProc(pin []string, bin string, args []string, onLine func(string), env ...string) (*Proc, error) {
	name := filepath.Base(bin) + " " + firstArg(args)
	if len(pin) > 0 {
		bin, args = pin[0], append(append(slices.Clone(pin[1:]), bin), args...)
	}
	p, err := testutil.Start(name, bin, args, testutil.Options{OnLine: onLine, Group: true, Env: env})
	if err != nil {
		return nil, err
	}
	return &Proc{Proc: p, done: p.Done()}, nil
}

func firstArg(args []string) string {
	if len(args) == 0 {
		return ""
	}
	return args[0]
}

// Stop interrupts the process and kills its group if it has not exited
// within grace.
func (p *Proc) Stop(grace time.Duration) {
	if p == nil {
		return
	}
	p.Proc.Stop(syscall.SIGINT, grace)
}

// Fleet is a running smg sim process with its engines' URLs.
type Fleet struct {
	*Proc
	URLs []string
	// GRPCURLs are the engines' grpc:// URLs, in URLs' order, when the
	// simulator serves gRPC too (--grpc-port).
	GRPCURLs   []string
	ControlURL string // /sim/fault for every engine, reachable whatever the faults
}

var controlRe = regexp.MustCompile(`msg="control listener" url=(\S+)`)

// StartFleet runs `smg sim --count n` on free ports with simArgs added.
func StartFleet(ctx context.Context, bin string, n int, simArgs []string) (*Fleet, error) {
	return startFleet(ctx, nil, bin, n, simArgs)
}

// startFleet is StartFleet run under pin (see startProc).
func startFleet(ctx context.Context, pin []string, bin string, n int, simArgs []string) (*Fleet, error) {
	f := &Fleet{}
	var mu sync.Mutex
	ready := make(chan struct{})
	var once sync.Once
	args := append([]string{"sim", "--count", fmt.Sprint(n), "--port", "0", "--control-port", "0"}, simArgs...)
	p, err := startProc(pin, bin, args, func(line string) {
		mu.Lock()
		defer mu.Unlock()
		if strings.HasPrefix(line, "http://") {
			// "http://host:port", then " grpc://host:port" with gRPC.
			urls := strings.Fields(line)
			f.URLs = append(f.URLs, urls[0])
			if len(urls) > 1 {
				f.GRPCURLs = append(f.GRPCURLs, urls[1])
			}
		} else if m := controlRe.FindStringSubmatch(line); m != nil {
			f.ControlURL = m[1]
		}
		if len(f.URLs) == n && f.ControlURL != "" {
			once.Do(func() { close(ready) })
		}
	})
	if err != nil {
		return nil, err
	}
	f.Proc = p
	select {
	case <-ready:
		return f, nil
	case <-p.done:
		return nil, fmt.Errorf("smg sim exited: %s", p.Log())
	case <-time.After(10 * time.Second):
	case <-ctx.Done():
	}
	p.Stop(time.Second)
	return nil, fmt.Errorf("smg sim did not print its URLs: %s", p.Log())
}

// Fault patches engine i's faults through the control port (see docs/sim.md).
func (f *Fleet) Fault(ctx context.Context, engine int, patch map[string]any) error {
	patch["engine"] = engine
	b, _ := json.Marshal(patch)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.ControlURL, bytes.NewReader(b))
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("fault: %s: %s", resp.Status, msg)
	}
	return nil
}

// Gateway is a running smg launch.
type Gateway struct {
	*Proc
	URL  string
	GRPC string // HOST:PORT of the control plane's gRPC, for agents
}

var servingRe = regexp.MustCompile(`msg="smg launch serving" http=(\S+) grpc=(\S+)`)

// StartGateway runs `smg launch` in front of workers with extra flags and
// waits until every worker is Ready.
func StartGateway(ctx context.Context, bin string, workers []string, extra []string) (*Gateway, error) {
	return startGatewayEnv(ctx, nil, bin, workers, extra, nil)
}

// startGatewayEnv is StartGateway run under pin (see startProc) with env
// added to the process's environment (the profiling variables of
// docs/benchmarks.md).
func startGatewayEnv(ctx context.Context, pin []string, bin string, workers, extra, env []string) (*Gateway, error) {
	g := &Gateway{}
	addr := make(chan []string, 1)
	// Info level: the address comes in the "smg launch serving" line.
	args := append([]string{"launch", "--port", "0", "--grpc-port", "0", "--log-level", "info",
		"--worker-urls"}, workers...)
	args = append(args, extra...)
	p, err := startProc(pin, bin, args, func(line string) {
		if m := servingRe.FindStringSubmatch(line); m != nil {
			select {
			case addr <- m[1:]:
			default:
			}
		}
	}, env...)
	if err != nil {
		return nil, err
	}
	g.Proc = p
	select {
	case a := <-addr:
		g.URL, g.GRPC = "http://"+a[0], a[1]
	case <-p.done:
		return nil, fmt.Errorf("smg launch exited: %s", p.Log())
	case <-time.After(15 * time.Second):
		p.Stop(time.Second)
		return nil, fmt.Errorf("smg launch did not start: %s", p.Log())
	}
	if err := g.waitReady(ctx, len(workers), 20*time.Second); err != nil {
		p.Stop(time.Second)
		return nil, err
	}
	return g, nil
}

// WorkerState is the part of GET /workers the bench reads.
type WorkerState struct {
	URL     string
	Ready   bool
	Health  string
	Vetoed  bool
	Veto    string
	Reason  string
	Waiting int
	// AgentNode names the agent whose stream feeds the worker ("": polled over HTTP).
	AgentNode string
	// Window is the worker's admission window (0: none, or windows off).
	Window int
}

// Workers reads GET /workers.
func (g *Gateway) Workers(ctx context.Context) ([]WorkerState, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, g.URL+"/workers", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Workers []struct {
			Spec struct {
				URL string `json:"url"`
			} `json:"spec"`
			Health     string `json:"health"`
			AgentNode  string `json:"agent_node"`
			Ready      bool   `json:"ready"`
			EngineLoad *struct {
				Waiting int `json:"waiting_requests"`
			} `json:"engine_load"`
			Verdict struct {
				Vetoed bool   `json:"vetoed"`
				Veto   string `json:"veto"`
				Reason string `json:"reason"`
			} `json:"verdict"`
			Admission *struct {
				Window json.Number `json:"window"` // an int64: a JSON string
			} `json:"admission"`
		} `json:"workers"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("GET /workers: %w", err)
	}
	out := make([]WorkerState, 0, len(body.Workers))
	for _, w := range body.Workers {
		s := WorkerState{URL: w.Spec.URL, Ready: w.Ready, Health: w.Health, Vetoed: w.Verdict.Vetoed,
			Veto: w.Verdict.Veto, Reason: w.Verdict.Reason, AgentNode: w.AgentNode}
		if w.EngineLoad != nil {
			s.Waiting = w.EngineLoad.Waiting
		}
		if w.Admission != nil {
			s.Window, _ = strconv.Atoi(strings.Trim(w.Admission.Window.String(), `"`))
		}
		out = append(out, s)
	}
	return out, nil
}

func (g *Gateway) waitReady(ctx context.Context, n int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		ws, err := g.Workers(ctx)
		ready := 0
		for _, w := range ws {
			if w.Ready {
				ready++
			}
		}
		if err == nil && ready == n {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.Join(fmt.Errorf("%d of %d workers Ready after %s", ready, n, within), err)
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// StartAgent runs `smg agent` for the engines, pushing to the gateway's
// control plane every poll, and waits until the gateway shows every engine
// fed by it (its poller then leaves them to the agent).
func StartAgent(ctx context.Context, bin string, gw *Gateway, node string, engines []string, poll time.Duration) (*Proc, error) {
	args := append([]string{"agent", "--port", "0", "--controlplane", gw.GRPC, "--node", node,
		"--poll-interval", poll.String(), "--log-level", "warn", "--engine-urls"}, engines...)
	p, err := startProc(nil, bin, args, func(string) {})
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		ws, err := gw.Workers(ctx)
		fed := 0
		for _, w := range ws {
			if w.AgentNode == node {
				fed++
			}
		}
		if err == nil && fed == len(engines) {
			return p, nil
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("smg agent exited: %s", p.Log())
		case <-ctx.Done():
			p.Stop(time.Second)
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.Stop(time.Second)
			return nil, fmt.Errorf("%d of %d engines fed by agent %s after 15s: %v %s", fed, len(engines), node, err, p.Log())
		}
	}
}
