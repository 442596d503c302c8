package scale

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"sync/atomic"
	"syscall"
	"time"
)

// childEnv carries a child process's spec (JSON). A process started with it
// runs that role and exits: see MaybeChild.
const childEnv = "SMG_SCALE_CHILD"

// childSpec is what one child process runs.
type childSpec struct {
	Role string // "agents", "routers" or "joiner" (timed joins alone)
	Addr string // the control plane's gRPC address

	// agents: workers [Lo, Hi) fed by Agents streams, the first named AgentBase.
	Lo, Hi      int
	Agents      int
	AgentBase   int
	URLBase     string
	ReportRate  float64 // per worker per second
	FlipRate    float64 // this process's flips per second
	FlipOn      int32   // waiting requests reported while flipped on (over the threshold)
	FlipSpacing time.Duration
	NoClock     bool // send no sent_at (Config.AgentsNoClock)

	// CPUProfile, when set, is a file to write this child's CPU profile
	// of the window to (Config.ChildProfiles).
	CPUProfile string

	// routers: Routers watch streams, the first named RouterBase; Joins
	// timed joins spread over the window.
	Routers    int
	RouterBase int
	Joins      int
}

// childResult is what a child prints on stdout when it ends.
type childResult struct {
	Role string
	// CPUSecs is this process's CPU time over the window (user + system):
	// what the clients cost, apart from the control plane; QuietCPUSecs
	// over the quiet window before it.
	CPUSecs, QuietCPUSecs float64
	// agents
	Sent  int64       // records sent inside the window
	Due   int64       // records the rate asked for inside the window
	Flips []flipEvent // every flip sent (the parent keeps those in the window)
	// SendBlockedSecs: time the agent streams spent inside Send in the
	// window, summed over streams (flow control: the control plane not
	// reading shows here, a starved child does not).
	SendBlockedSecs float64
	// routers
	Seen      map[string]*seenAgg // by flipKey: when the routers applied it
	Messages  int64               // messages received inside the window, all routers
	Bytes     int64               // their encoded size
	Snapshots int64
	Joins     []joinSample
	Errors    []string
}

// flipEvent is one verdict flip an agent caused by its report.
type flipEvent struct {
	Worker int
	N      int // the worker's n-th flip
	On     bool
	At     int64 // Unix ns, just before the record was sent
}

// seenAgg is how many routers applied a flip, the last of them, and the
// lowest revision of a message that carried it (the flip's commit, or the
// first commit after it that a stream picked up).
type seenAgg struct {
	Count  int
	Last   int64
	MinRev uint64
}

func flipKey(worker, n int) string { return fmt.Sprintf("%d/%d", worker, n) }

// MaybeChild runs this process as a harness child when the environment says
// so, and exits; otherwise it returns at once. Programs that start children
// (the benchmark suite, the test binary) call it first thing.
func MaybeChild() {
	raw, ok := os.LookupEnv(childEnv)
	if !ok {
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	code := 0
	if err := runChild(ctx, []byte(raw), os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "scale child:", err)
		code = 1
	}
	os.Exit(code)
}

func runChild(ctx context.Context, raw []byte, in io.Reader, out io.Writer) error {
	var spec childSpec
	if err := json.Unmarshal(raw, &spec); err != nil {
		return fmt.Errorf("bad %s: %w", childEnv, err)
	}
	// The parent writes the measurement window on stdin once the fleet has
	// settled. Children outlive it by a grace period so that flips sent at
	// its end can still be seen; the parent kills none of them.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	win := &window{set: make(chan struct{})}
	go func() {
		var quiet, start, end int64
		if _, err := fmt.Fscan(in, &quiet, &start, &end); err != nil {
			cancel() // the parent went away
			return
		}
		win.quiet.Store(quiet)
		win.start.Store(start)
		win.end.Store(end)
		close(win.set)
		select {
		case <-time.After(time.Until(time.Unix(0, end).Add(grace))):
			cancel()
		case <-ctx.Done():
		}
	}()
	cpu := make(chan [2]float64, 1)
	go func() { cpu <- win.cpuSecs(ctx) }()
	profiled := make(chan error, 1)
	go func() { profiled <- win.profile(ctx, spec.CPUProfile) }()
	var res *childResult
	var err error
	switch spec.Role {
	case "agents":
		res, err = runAgents(ctx, spec, win)
	case "routers", "joiner":
		res, err = runRouters(ctx, spec, win)
	default:
		err = fmt.Errorf("unknown role %q", spec.Role)
	}
	if err != nil {
		return err
	}
	c := <-cpu
	if err := <-profiled; err != nil {
		res.Errors = append(res.Errors, fmt.Sprintf("cpu profile: %v", err))
	}
	res.Role, res.QuietCPUSecs, res.CPUSecs = spec.Role, c[0], c[1]
	return json.NewEncoder(out).Encode(res)
}

// grace is how long children run past the window.
const grace = 2 * time.Second

// window is the measurement window, Unix ns, once the parent has sent it:
// [start, end), and before it the quiet window [quiet, start) in which no
// verdict flips (quiet == start: none).
type window struct {
	quiet, start, end atomic.Int64
	set               chan struct{} // closed when sent
}

// cpuSecs is this process's CPU time over the quiet window and over the
// window (zeros when ctx ends first).
func (w *window) cpuSecs(ctx context.Context) [2]float64 {
	select {
	case <-w.set:
	case <-ctx.Done():
		return [2]float64{}
	}
	var at [3]time.Duration
	for i, t := range []int64{w.quiet.Load(), w.start.Load(), w.end.Load()} {
		select {
		case <-time.After(time.Until(time.Unix(0, t))):
		case <-ctx.Done():
			return [2]float64{}
		}
		at[i] = cpuTime()
	}
	return [2]float64{(at[1] - at[0]).Seconds(), (at[2] - at[1]).Seconds()}
}

// profile writes this process's CPU profile of the window to path (none
// when path is empty or ctx ends first).
func (w *window) profile(ctx context.Context, path string) error {
	if path == "" {
		return nil
	}
	select {
	case <-w.set:
	case <-ctx.Done():
		return nil
	}
	select {
	case <-time.After(time.Until(time.Unix(0, w.start.Load()))):
	case <-ctx.Done():
		return nil
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := pprof.StartCPUProfile(f); err != nil {
		return err
	}
	defer pprof.StopCPUProfile()
	select {
	case <-time.After(time.Until(time.Unix(0, w.end.Load()))):
	case <-ctx.Done():
	}
	return nil
}

// flips says whether verdicts may flip at t: any time but the quiet window.
func (w *window) flips(t time.Time) bool {
	n, q := t.UnixNano(), w.quiet.Load()
	return q == 0 || n < q || n >= w.start.Load()
}

// overlap is how much of [t0, t1] falls inside the window.
func (w *window) overlap(t0, t1 time.Time) time.Duration {
	s := w.start.Load()
	if s == 0 {
		return 0
	}
	lo, hi := max(t0.UnixNano(), s), min(t1.UnixNano(), w.end.Load())
	return time.Duration(max(hi-lo, 0))
}

func (w *window) contains(t time.Time) bool {
	n, s := t.UnixNano(), w.start.Load()
	return s != 0 && n >= s && n < w.end.Load()
}
