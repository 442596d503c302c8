package e2e

import (
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// outcome of one request in the restart test.
type outcome struct {
	full    bool   // a whole answer
	code    string // an explicit error's code
	problem string // neither: what went wrong
	after   bool   // started after the control plane came back
}

// A control-plane restart mid-load loses no request: every request through the
// routers ends in a full answer or an explicit error, none hangs or is cut.
func TestControlPlaneRestartLosesNoRequest(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("restarts a control plane under load for several seconds")
	}
	sims := startSims(t, 2, "--itl-ms", "10")
	cpArgs := []string{"--load-monitor-interval", "1", "--health-success-threshold", "1"}
	cp := newControlPlane(t, sims, cpArgs...)
	routers := map[string]string{}
	for i := range 2 {
		id := fmt.Sprintf("e2e-router-%d", i+1)
		routers[id] = startRouter(t, id, cp.grpcPort, "--load-monitor-interval", "1")
	}
	bases := []string{routers["e2e-router-1"], routers["e2e-router-2"]}
	cp.admin.waitReady(t, sims...)
	waitConverged(t, cp.admin, routers)
	epoch, err := getRouterLoads(bases[0])
	if err != nil {
		t.Fatal(err)
	}

	const total, concurrency, killAt, downFor = 200, 8, 40, 40
	var (
		next, done atomic.Int64
		restarted  atomic.Bool
		results    = make([]outcome, total)
		wg         sync.WaitGroup
	)
	for range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= total {
					return
				}
				stream := i%2 == 1
				after := restarted.Load()
				a := chat(bases[i%2], 20, stream, 30*time.Second)
				results[i] = classify(a, stream)
				results[i].after = after
				done.Add(1)
			}
		}()
	}
	for done.Load() < killAt {
		time.Sleep(5 * time.Millisecond) // polling the client loop's progress
	}
	cp.proc.kill() // SIGKILL: no goodbye to the routers
	killed := done.Load()
	// The routers keep answering on their last snapshot while it is gone.
	for done.Load() < killed+downFor && next.Load() < total {
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("control plane killed after %d answers, restarted after %d", killed, done.Load())
	cp.start(t) // same ports, same --worker-urls
	restarted.Store(true)
	t.Logf("control plane serving again after %d answers", done.Load())
	wg.Wait()

	var full, explicit, lost, fullAfter int
	codes := map[string]int{}
	var problems []string
	for i, r := range results {
		switch {
		case r.full:
			full++
			if r.after {
				fullAfter++
			}
		case r.code != "":
			explicit++
			codes[r.code]++
		default:
			lost++
			problems = append(problems, fmt.Sprintf("request %d: %s", i, r.problem))
		}
	}
	t.Logf("%d requests: %d full answers (%d started after the restart), %d explicit errors %v, %d lost",
		total, full, fullAfter, explicit, codes, lost)
	sort.Strings(problems)
	for _, p := range problems {
		t.Error(p)
	}
	if fullAfter == 0 {
		t.Errorf("no request completed after the restart: the restart did not happen mid-load")
	}

	// The routers are back on the new control plane, at its revision.
	cp.admin.waitReady(t, sims...)
	waitConverged(t, cp.admin, routers)
	now, err := getRouterLoads(bases[0])
	if err != nil {
		t.Fatal(err)
	}
	if now.Epoch == epoch.Epoch || now.FailOpen {
		t.Errorf("router after restart: epoch %q (before %q), fail_open %v; want the new control plane's epoch", now.Epoch, epoch.Epoch, now.FailOpen)
	}
}

func classify(a answer, stream bool) outcome {
	check := a.completeJSON
	if stream {
		check = a.completeStream
	}
	err := check()
	if err == nil {
		return outcome{full: true}
	}
	if a.err == nil {
		if code := a.errorCode(); code != "" {
			return outcome{code: code}
		}
	}
	return outcome{problem: err.Error()}
}
