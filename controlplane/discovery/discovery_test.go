package discovery

import (
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/podwatch"
)

// waitFor waits (bounded) for cond, which reads state the informers'
// goroutine changes without a registry commit.
func (e *env) waitFor(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling a condition, not timing a rule
	}
}

var engineLabels = map[string]string{"app": "engine"}

func TestPodLifecycle(t *testing.T) {
	e := newEnv(t, 2)
	e.watch(podwatch.Options{Selector: "app=engine"}, "")

	// Created without an IP, then with an IP but not Ready: nothing registered.
	e.create(pod("p0", "", false, engineLabels))
	e.waitFor("no_ip pod", func() bool { return e.pods("no_ip") == 1 })
	e.edit("p0", func(p *corev1.Pod) { p.Status.PodIP = e.ips[0] })
	e.waitFor("not_ready pod", func() bool { return e.pods("not_ready") == 1 })
	e.waitState()

	// Becoming Ready registers it, with the pod's name and namespace as labels.
	e.edit("p0", func(p *corev1.Pod) { setReady(p, true) })
	e.waitState(e.url(0) + " regular")
	w := e.worker(e.url(0))
	if l := w.Spec.GetLabels(); l[podwatch.LabelPod] != "p0" || l[podwatch.LabelNamespace] != "default" || l[podwatch.LabelSource] != podwatch.SourceControlPlane {
		t.Fatalf("labels = %v", l)
	}
	// The gauges follow the registration on the reconciler's goroutine: wait
	// for them rather than read them the instant the worker appears.
	e.waitFor("one added event and one ready pod", func() bool { return e.events("added") == 1 && e.pods("ready") == 1 })

	// Losing Ready keeps the worker for as long as the health checker would.
	e.edit("p0", func(p *corev1.Pod) { setReady(p, false) })
	e.waitFor("lost_ready", func() bool { return e.events("lost_ready") == 1 })
	e.clock.Add(grace - time.Second)
	e.rc.Sweep()
	e.waitState(e.url(0) + " regular")
	e.clock.Add(time.Second)
	e.rc.Sweep()
	e.waitState()
	e.waitFor("one removed event", func() bool { return e.events("removed") == 1 })

	// Ready again: back. A new IP is a re-registration.
	e.edit("p0", func(p *corev1.Pod) { setReady(p, true) })
	e.waitState(e.url(0) + " regular")
	e.edit("p0", func(p *corev1.Pod) { p.Status.PodIP = e.ips[1] })
	e.waitState(e.url(1) + " regular")
	e.waitFor("one ip_changed event", func() bool { return e.events("ip_changed") == 1 })

	// Relabelled out of the selector: removed; back in: registered.
	e.edit("p0", func(p *corev1.Pod) { p.Labels = map[string]string{"app": "other"} })
	e.waitState()
	e.edit("p0", func(p *corev1.Pod) { p.Labels = engineLabels })
	e.waitState(e.url(1) + " regular")

	// Deleted: removed, and no longer counted.
	e.delete("p0")
	e.waitState()
	e.waitFor("no pods counted", func() bool { return e.pods("ready")+e.pods("not_ready")+e.pods("no_ip") == 0 })
}

func TestRegainsReadyWithinGraceKeepsWorker(t *testing.T) {
	e := newEnv(t, 1)
	e.watch(podwatch.Options{Selector: "app=engine"}, "")
	e.create(pod("p0", e.ips[0], true, engineLabels))
	e.waitState(e.url(0) + " regular")
	id := e.worker(e.url(0)).ID
	e.edit("p0", func(p *corev1.Pod) { setReady(p, false) })
	e.waitFor("lost_ready", func() bool { return e.events("lost_ready") == 1 })
	e.clock.Add(grace / 2)
	e.edit("p0", func(p *corev1.Pod) { setReady(p, true) })
	e.waitFor("ready again", func() bool { return e.pods("ready") == 1 })
	// The grace clock restarts: a second loss is judged from its own start.
	e.edit("p0", func(p *corev1.Pod) { setReady(p, false) })
	e.waitFor("lost_ready again", func() bool { return e.events("lost_ready") == 2 })
	e.clock.Add(grace - time.Second)
	e.rc.Sweep()
	if w := e.reg.Snapshot().GetByURL(e.url(0)); w == nil || w.ID != id || e.events("removed") != 0 {
		t.Fatalf("worker removed within the grace: %v, removed=%v", w, e.events("removed"))
	}
}

func TestPDRolesAndAnnotations(t *testing.T) {
	e := newEnv(t, 6)
	e.watch(podwatch.Options{PrefillSelector: "prefill=true", DecodeSelector: "decode=true"}, "")
	pre := map[string]string{"prefill": "true"}
	dec := map[string]string{"decode": "true"}

	a := pod("pre-a", e.ips[0], true, pre)
	a.Annotations = map[string]string{podwatch.AnnotationBootstrapPort: "9100"}
	b := pod("dec-b", e.ips[1], true, dec)
	b.Annotations = map[string]string{podwatch.AnnotationOverload: `{"waiting_requests": 4, "token_usage": 0.5}`}
	c := pod("pre-bad-port", e.ips[2], true, pre)
	c.Annotations = map[string]string{podwatch.AnnotationBootstrapPort: "http"}
	d := pod("dec-bad-json", e.ips[3], true, dec)
	d.Annotations = map[string]string{podwatch.AnnotationOverload: `{"waiting_requests": 4,`}
	f := pod("dec-bad-range", e.ips[4], true, dec)
	f.Annotations = map[string]string{podwatch.AnnotationOverload: `{"waiting_requests": 0}`}
	both := pod("both", e.ips[5], true, map[string]string{"prefill": "true", "decode": "true"})
	for _, p := range []*corev1.Pod{a, b, c, d, f, both} {
		e.create(p)
	}
	e.waitState(e.url(0)+" prefill", e.url(1)+" decode", e.url(2)+" prefill", e.url(3)+" decode", e.url(4)+" decode")

	if got := e.worker(e.url(0)).Spec.GetBootstrapPort(); got != 9100 {
		t.Errorf("bootstrap port = %d, want 9100 from the annotation", got)
	}
	if th := e.worker(e.url(1)).Thresholds; th.WaitingRequests != 4 || th.TokenUsage != 0.5 {
		t.Errorf("thresholds = %+v, want the annotation's block", th)
	}
	if w := e.worker(e.url(2)); w.Spec.BootstrapPort != nil {
		t.Errorf("bad bootstrap annotation kept: %d", w.Spec.GetBootstrapPort())
	}
	gw := e.worker(e.url(0)).Thresholds
	for _, i := range []int{3, 4} {
		w := e.worker(e.url(i))
		if w.Spec.GetOverload() != nil || w.Thresholds != gw {
			t.Errorf("%s: overload %v thresholds %+v, want the gateway thresholds %+v", w.Spec.GetUrl(), w.Spec.GetOverload(), w.Thresholds, gw)
		}
	}
	e.waitFor("three bad_annotation events", func() bool { return e.events("bad_annotation") == 3 })
	e.waitFor("the pod matching two roles counted as a conflict", func() bool { return e.pods("conflict") == 1 && e.events("conflict") == 1 })

	// Relabelled from decode to prefill: the worker is re-registered as prefill.
	e.edit("dec-b", func(p *corev1.Pod) { p.Labels = pre })
	e.waitState(e.url(0)+" prefill", e.url(1)+" prefill", e.url(2)+" prefill", e.url(3)+" decode", e.url(4)+" decode")
	e.waitFor("one updated event", func() bool { return e.events("updated") == 1 })
	// The conflict resolved: registered.
	e.edit("both", func(p *corev1.Pod) { p.Labels = dec })
	e.waitState(e.url(0)+" prefill", e.url(1)+" prefill", e.url(2)+" prefill", e.url(3)+" decode", e.url(4)+" decode", e.url(5)+" decode")
}

func TestDeletedByHandComesBack(t *testing.T) {
	e := newEnv(t, 1)
	e.watch(podwatch.Options{Selector: "app=engine"}, "")
	e.create(pod("p0", e.ips[0], true, engineLabels))
	e.waitState(e.url(0) + " regular")
	if err := e.admin.Remove(e.worker(e.url(0)).ID); err != nil {
		t.Fatal(err)
	}
	e.waitState()
	e.rc.Sweep()
	e.waitState(e.url(0) + " regular")
}

func TestWorkersOfVanishedPodsRemovedAtSync(t *testing.T) {
	e := newEnv(t, 2)
	// A worker discovered before a restart whose pod is gone, and one added by hand.
	if _, err := e.admin.Submit(&smgv1.WorkerSpec{Url: e.url(0), Labels: map[string]string{podwatch.LabelSource: podwatch.SourceControlPlane}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.Submit(&smgv1.WorkerSpec{Url: e.url(1)}); err != nil {
		t.Fatal(err)
	}
	e.waitState(e.url(0)+" regular", e.url(1)+" regular")
	e.watch(podwatch.Options{Selector: "app=engine"}, "")
	e.waitState(e.url(1) + " regular")
}

// A watch that ends with 410 Gone makes the informer list again; a pod deleted
// while the watch was down is removed, one created is added.
func TestWatchRestart(t *testing.T) {
	e := newEnv(t, 2)
	first := watch.NewFake()
	var watches atomic.Int32
	e.client.PrependWatchReactor("pods", func(k8stesting.Action) (bool, watch.Interface, error) {
		if watches.Add(1) == 1 {
			return true, first, nil
		}
		return false, nil, nil
	})
	e.create(pod("p0", e.ips[0], true, engineLabels))
	e.watch(podwatch.Options{Selector: "app=engine"}, "")
	e.waitState(e.url(0) + " regular")

	// Changes the first watch never delivers.
	e.delete("p0")
	e.create(pod("p1", e.ips[1], true, engineLabels))
	gone := apierrors.NewResourceExpired("too old resource version")
	first.Error(&gone.ErrStatus)
	first.Stop()
	e.waitState(e.url(1) + " regular")
	e.waitFor("a second watch after the relist", func() bool { return watches.Load() >= 2 })
}
