package e2e

import (
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// freePortPair finds a port p such that p and p+1 are both free, for two
// engines on consecutive ports.
func freePortPair(t *testing.T) int {
	t.Helper()
	for range 50 {
		p := freePort(t)
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+1))
		if err == nil {
			ln.Close()
			return p
		}
	}
	t.Fatal("no two consecutive free ports")
	return 0
}

var engineStarted = regexp.MustCompile(`msg="Engine started" engine=(engine-\d+) pid=(\d+)`)

// enginePIDs returns the pid of every start of each engine, in order.
func enginePIDs(log string) map[string][]int {
	pids := map[string][]int{}
	for _, m := range engineStarted.FindAllStringSubmatch(log, -1) {
		pid, _ := strconv.Atoi(m[2])
		pids[m[1]] = append(pids[m[1]], pid)
	}
	return pids
}

// processAlive reports whether pid is a live process; a zombie (reparented to
// a PID 1 that does not reap) is not.
func processAlive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(stat), ") ")
	return !strings.HasPrefix(rest, "Z")
}

// `smg serve --backend sim`: two supervised engines and the gateway in front
// of them answer requests; an engine killed is restarted and serves again;
// SIGTERM drains the gateway, then stops the engines, and serve exits.
func TestServeSimEnginesSupervisedAndDrained(t *testing.T) {
	enginePort, port, grpcPort := freePortPair(t), freePort(t), freePort(t)
	p := startSMG(t, "serve", argsf("serve --backend sim --dp-size 2 --engine-port %d --engine-stop-grace 5s --router-port %d --router-grpc-port %d --router-shutdown-grace-secs 5",
		enginePort, port, grpcPort)...)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	waitHTTP200(t, p, base+"/readyz")
	urls := []string{fmt.Sprintf("http://127.0.0.1:%d", enginePort), fmt.Sprintf("http://127.0.0.1:%d", enginePort+1)}
	a := admin{base: base}
	a.waitReady(t, urls...)
	a.waitRoutersApplied(t, 1)
	if err := chat(base, 8, true, 30*time.Second).completeStream(); err != nil {
		t.Fatalf("streamed chat completion through serve: %v", err)
	}
	if log := p.stderr.String(); !strings.Contains(log, "[engine-0] ") || !strings.Contains(log, "[engine-1] ") {
		t.Errorf("engine output is not prefixed with its name:\n%s", tail(log, 2000))
	}

	first := enginePIDs(p.stderr.String())["engine-0"]
	if len(first) != 1 {
		t.Fatalf("engine-0 starts logged: %v", first)
	}
	if err := syscall.Kill(first[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "engine-0 restarted", func() (bool, string) {
		got := enginePIDs(p.stderr.String())["engine-0"]
		return len(got) == 2, fmt.Sprint(got)
	})
	a.waitReady(t, urls[0])
	for i := range 4 {
		if err := chat(base, 4, false, 30*time.Second).completeJSON(); err != nil {
			t.Fatalf("chat %d after the restart: %v", i, err)
		}
	}

	pids := enginePIDs(p.stderr.String())
	running := []int{pids["engine-0"][1], pids["engine-1"][0]}
	p.Stop(syscall.SIGTERM, 20*time.Second)
	if p.Cmd.ProcessState == nil || !p.Cmd.ProcessState.Success() {
		t.Fatalf("serve after SIGTERM: %v\n%s", p.Cmd.ProcessState, tail(p.stderr.String(), 2000))
	}
	log := p.stderr.String()
	drain, stopped := strings.Index(log, "Draining"), strings.Index(log, "Engine stopped")
	if drain < 0 || stopped < 0 || stopped < drain {
		t.Errorf("the gateway must drain before the engines stop (drain at %d, stop at %d)", drain, stopped)
	}
	for _, pid := range running {
		if processAlive(pid) {
			t.Errorf("engine pid %d outlived serve", pid)
		}
	}
}

// A backend that is not installed is a clear error naming it, exit non-zero.
func TestServeBackendNotInstalled(t *testing.T) {
	p := startSMG(t, "serve", "serve", "--backend", "vllm", "--model", "m", "--engine-binary", "vllm-not-installed-here")
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		t.Fatal("serve with a missing backend did not exit")
	}
	if p.Cmd.ProcessState.Success() {
		t.Fatal("serve with a missing backend exited 0")
	}
	if log := p.stderr.String(); !strings.Contains(log, `--backend vllm needs "vllm-not-installed-here", which is not installed`) {
		t.Errorf("stderr does not name the missing backend:\n%s", log)
	}
}
