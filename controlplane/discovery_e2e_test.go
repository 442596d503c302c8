package controlplane_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/smg-project/smg/agent"
	"github.com/smg-project/smg/internal/podwatch"
	"github.com/smg-project/smg/internal/podwatch/podwatchtest"
	"github.com/smg-project/smg/router"
	"github.com/smg-project/smg/router/watchclient"
	"github.com/smg-project/smg/sim"
)

// simPods starts n simulated engines on one port at 127.0.0.2, 127.0.0.3, ...:
// the pod IPs of n engine pods listening on the discovery port.
func simPods(t *testing.T, n int) (int, []*sim.Server) {
	t.Helper()
	for attempt := 0; attempt < 20; attempt++ {
		probe, err := net.Listen("tcp", "127.0.0.2:0")
		if err != nil {
			t.Fatal(err)
		}
		port := probe.Addr().(*net.TCPAddr).Port
		probe.Close()
		var sims []*sim.Server
		for i := 0; i < n; i++ {
			s, err := sim.Start(net.JoinHostPort("127.0.0."+strconv.Itoa(i+2), strconv.Itoa(port)), sim.DefaultOptions(), nil)
			if err != nil {
				break
			}
			sims = append(sims, s)
		}
		if len(sims) == n {
			for _, s := range sims {
				t.Cleanup(func() { _ = s.Close() })
			}
			return port, sims
		}
		for _, s := range sims {
			_ = s.Close()
		}
	}
	t.Fatal("no common free port on 127.0.0.2..")
	return 0, nil
}

func enginePod(name, ip string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "inference", Labels: map[string]string{"app": "vllm"}},
		Status: corev1.PodStatus{PodIP: ip, Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
}

// Pods in the fake clientset point at real simulated engines: the control
// plane discovers them, registers them through the admin path, probes and
// polls them, and a router routes to them; a deleted pod leaves routing.
func TestDiscoveredPodsAreRoutedTo(t *testing.T) {
	port, sims := simPods(t, 2)
	client := fake.NewClientset(enginePod("vllm-0", "127.0.0.2"), enginePod("vllm-1", "127.0.0.3"))
	opts := fastOptions()
	opts.Discovery = podwatch.DefaultOptions()
	opts.Discovery.Enabled, opts.Discovery.Selector, opts.Discovery.Namespace, opts.Discovery.Port = true, "app=vllm", "inference", port
	opts.KubeClient = podwatchtest.Fake(client)
	h := startCP(t, opts)

	log := slog.New(slog.DiscardHandler)
	r, err := router.New(router.DefaultOptions(), log, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	ctx, cancel := context.WithCancel(context.Background())
	wc := watchclient.New(h.conn, r, watchclient.Options{RouterID: "r1"}, log)
	done := make(chan struct{})
	go func() { defer close(done); _ = wc.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	front := httptest.NewServer(r.Handler())
	t.Cleanup(front.Close)

	urls := []string{sims[0].URL(), sims[1].URL()}
	// Registered, Ready (probed) and polled (a load record), with the pod's
	// name and namespace as labels.
	waitCond(t, "both pods registered, Ready and polled", func() bool {
		snap := h.reg.Snapshot()
		for _, u := range urls {
			w := snap.GetByURL(u)
			if w == nil || !w.Ready() || w.Load == nil {
				return false
			}
		}
		return len(snap.Workers()) == 2
	})
	body := h.do(t, "GET", "/workers", "").body
	for _, want := range []string{`"smg.io/pod":"vllm-0"`, `"smg.io/pod":"vllm-1"`, `"smg.io/namespace":"inference"`} {
		if !strings.Contains(string(body), want) {
			t.Fatalf("GET /workers lacks %s:\n%s", want, body)
		}
	}
	waitCond(t, "the router routes", func() bool { return chat(front.URL) == http.StatusOK })

	// The pod goes: its worker leaves the registry and the router's snapshot,
	// so requests never reach its (now stopped) engine.
	if err := client.CoreV1().Pods("inference").Delete(context.Background(), "vllm-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCond(t, "the deleted pod's worker removed", func() bool { return h.reg.Snapshot().GetByURL(urls[0]) == nil })
	_ = sims[0].Close()
	waitCond(t, "the router's snapshot without the pod", func() bool { return routerWorkers(front.URL) == 1 })
	for i := 0; i < 10; i++ {
		if code := chat(front.URL); code != http.StatusOK {
			t.Fatalf("request %d after the pod left: status %d", i, code)
		}
	}
	if !strings.Contains(h.logs.String(), "Discovered pod removed") || !strings.Contains(h.logs.String(), "pod=vllm-0") {
		t.Errorf("no removal log line naming the pod:\n%s", h.logs)
	}
}

func chat(base string) int {
	resp, err := http.Post(base+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`))
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// routerWorkers counts the workers the router lists (its snapshot).
func routerWorkers(base string) int {
	resp, err := http.Get(base + "/loads")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.Count(string(b), `"url"`)
}

// waitCond waits (bounded) for cond, polling state that other goroutines change.
func waitCond(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition, not timing a rule
	}
}

// An agent discovers the engine pods of its own node only (spec.nodeName),
// registers them under its node through the control plane, and polls them;
// a pod deleted from the node is removed.
func TestAgentDiscoversThePodsOfItsNode(t *testing.T) {
	port, sims := simPods(t, 2)
	mine, other := enginePod("vllm-a", "127.0.0.2"), enginePod("vllm-b", "127.0.0.3")
	mine.Spec.NodeName, other.Spec.NodeName = "node-a", "node-b"
	client := fake.NewClientset(mine, other)
	cpOpts := fastOptions()
	cpOpts.AgentAnyModel = true // agents may register engines (their pods) at all
	h := startCP(t, cpOpts)

	opts := agent.DefaultOptions()
	opts.ControlPlane, opts.Node, opts.Register, opts.PollInterval = h.addr, "node-a", true, 100*time.Millisecond
	opts.Discovery.Enabled, opts.Discovery.Selector, opts.Discovery.Namespace, opts.Discovery.Port = true, "app=vllm", "inference", port
	opts.KubeClient = podwatchtest.Fake(client)
	runAgent(t, opts)

	url := sims[0].URL()
	waitCond(t, "the node's pod registered under the node and fed by its agent", func() bool {
		w := h.reg.Snapshot().GetByURL(url)
		return w != nil && w.Spec.GetNode() == "node-a" && w.AgentNode == "node-a" && w.Load != nil &&
			w.Spec.GetLabels()[podwatch.LabelSource] == podwatch.SourceAgent("node-a") && w.Spec.GetLabels()[podwatch.LabelPod] == "vllm-a"
	})
	if n := len(h.reg.Snapshot().Workers()); n != 1 {
		t.Fatalf("%d workers: the other node's pod must not be registered by this agent", n)
	}
	if err := client.CoreV1().Pods("inference").Delete(context.Background(), "vllm-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCond(t, "the deleted pod's worker removed", func() bool { return len(h.reg.Snapshot().Workers()) == 0 })
	_ = sims[1]
}
