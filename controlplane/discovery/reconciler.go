// Package discovery keeps the registry in step with the engine pods that
// service discovery sees, from the control plane's own informers or from
// agents watching their node. Every change goes through the admin API's
// registration path (Registrar), so a discovered worker is validated,
// registered by a job and logged exactly like one added by hand.
//
// It owns the mapping from pods to registrations; it writes only through the
// Registrar, never the registry directly.
package discovery

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/podwatch"
)

// Registrar is the admin API's registration path (admin.Service).
type Registrar interface {
	// Submit validates spec and registers it in the background.
	Submit(spec *smgv1.WorkerSpec) (string, error)
	// Replace re-registers worker id with spec in the background.
	Replace(id string, spec *smgv1.WorkerSpec) error
	// Remove removes worker id, or cancels its registration under way.
	Remove(id string) error
}

// Options configure a Reconciler.
type Options struct {
	// Grace is how long a registered pod may stay not Ready before its
	// worker is removed: as long as the health checker would keep a failing
	// worker (--health-failure-threshold × --health-check-interval-secs).
	Grace time.Duration
	// CheckOverload range-checks an overload annotation the way registration
	// would; a bad block is dropped (gateway thresholds) instead of failing
	// the registration.
	CheckOverload func(*smgv1.OverloadBlock) error
	// Now is the clock of the grace rule.
	Now func() time.Time
}

// Reconciler turns pod observations into registrations and removals. It
// implements podwatch.Sink.
type Reconciler struct {
	reg  *registry.Registry
	r    Registrar
	opts Options
	log  *slog.Logger
	m    *Metrics

	mu   sync.Mutex
	pods map[string]*tracked // by source + " " + pod key
}

// tracked is one pod as the reconciler last saw it.
type tracked struct {
	source        string
	pod           podwatch.Pod
	spec          *smgv1.WorkerSpec // pod.Spec with a bad overload block dropped
	url           string            // URL registered (or submitted) for the pod; "" none
	notReadySince time.Time         // set while a registered pod is not Ready
	logged        string            // the problem and warnings last logged
	rejected      string            // the URL whose submission was refused (logged once)
}

// New returns a reconciler writing through r.
func New(reg *registry.Registry, r Registrar, opts Options, m *Metrics, log *slog.Logger) *Reconciler {
	return &Reconciler{reg: reg, r: r, opts: opts, log: log, m: m, pods: map[string]*tracked{}}
}

func podKey(source, key string) string { return source + " " + key }

// Upsert applies the latest state of a matching pod.
func (rc *Reconciler) Upsert(source string, pod podwatch.Pod) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.upsertLocked(source, pod, rc.opts.Now())
	rc.gauge()
}

func (rc *Reconciler) upsertLocked(source string, pod podwatch.Pod, now time.Time) {
	k := podKey(source, pod.Key())
	t := rc.pods[k]
	if t == nil {
		t = &tracked{source: source}
		rc.pods[k] = t
		rc.log.Info("Discovered pod", "pod", pod.Name, "namespace", pod.Namespace, "ip", pod.IP, "ready", pod.Ready, "source", source)
	}
	t.pod, t.spec = pod, pod.Spec
	notes := pod.Warnings
	if t.spec.GetOverload() != nil {
		if err := rc.opts.CheckOverload(t.spec.GetOverload()); err != nil {
			t.spec = proto.CloneOf(t.spec)
			t.spec.Overload = nil
			notes = append(slices.Clone(notes), fmt.Sprintf("annotation %s: %v; the gateway thresholds apply", podwatch.AnnotationOverload, err))
		}
	}
	rc.note(t, notes)
	rc.reconcile(t, now)
}

// note logs a pod's problem and bad annotations once per change.
func (rc *Reconciler) note(t *tracked, warnings []string) {
	all := fmt.Sprint(t.pod.Problem, warnings)
	if all == t.logged {
		return
	}
	t.logged = all
	if t.pod.Problem != "" {
		rc.log.Warn("Discovered pod not registered", "pod", t.pod.Name, "namespace", t.pod.Namespace, "reason", t.pod.Problem)
		rc.m.event("conflict")
	}
	for _, w := range warnings {
		rc.log.Warn("Discovered pod has a bad annotation", "pod", t.pod.Name, "namespace", t.pod.Namespace, "reason", w)
		rc.m.event("bad_annotation")
	}
}

// reconcile registers, keeps or removes the pod's worker.
func (rc *Reconciler) reconcile(t *tracked, now time.Time) {
	p := t.pod
	url := t.spec.GetUrl()
	want, reason := "", ""
	switch {
	case p.Problem != "":
		reason = p.Problem
	case url == "":
		reason = "the pod has no IP"
	case p.Ready:
		want, t.notReadySince = url, time.Time{}
	case t.url == url:
		// Registered and lost Ready: the health checker takes the worker
		// out of routing; the registry keeps it for as long as the health
		// checker would keep a failing worker.
		if t.notReadySince.IsZero() {
			t.notReadySince = now
			rc.log.Info("Discovered pod is not Ready", "pod", p.Name, "namespace", p.Namespace, "url", url, "removed_after", rc.opts.Grace)
			rc.m.event("lost_ready")
		}
		if now.Sub(t.notReadySince) < rc.opts.Grace {
			want = url
		} else {
			reason = fmt.Sprintf("not Ready for %s (longer than the health checker allows)", now.Sub(t.notReadySince).Round(time.Second))
		}
	default:
		reason = "the pod is not Ready"
	}
	if t.url != "" && t.url != want {
		if want != "" {
			reason = "the pod's IP changed to " + p.IP
			rc.m.event("ip_changed")
		}
		rc.remove(t, reason)
	}
	if want != "" {
		rc.ensure(t)
	} else {
		t.notReadySince = time.Time{}
	}
}

// ensure makes the registry hold the pod's worker with the pod's spec.
func (rc *Reconciler) ensure(t *tracked) {
	spec, url := t.spec, t.spec.GetUrl()
	t.url = url
	w := rc.reg.Snapshot().GetByURL(url)
	switch {
	case w == nil:
		id, err := rc.r.Submit(spec)
		switch {
		case err == nil:
			t.rejected = ""
			rc.log.Info("Discovered pod registered", "pod", t.pod.Name, "namespace", t.pod.Namespace, "url", url,
				"worker_id", id, "worker_type", spec.GetWorkerType(), "source", t.source)
			rc.m.event("added")
		case status.Code(err) == codes.AlreadyExists:
			// Its registration is under way.
		default:
			if t.rejected != url {
				t.rejected = url
				rc.log.Warn("Discovered pod could not be registered", "pod", t.pod.Name, "namespace", t.pod.Namespace,
					"url", url, "error", status.Convert(err).Message())
				rc.m.event("rejected")
			}
		}
	case w.Spec.GetLabels()[podwatch.LabelSource] != t.source:
		// Registered by hand, by --worker-urls or by another source: not ours.
	case !proto.Equal(owned(w.Spec), owned(spec)):
		err := rc.r.Replace(w.ID, spec)
		if err == nil {
			rc.log.Info("Discovered pod changed; worker re-registered", "pod", t.pod.Name, "namespace", t.pod.Namespace,
				"url", url, "worker_id", w.ID, "worker_type", spec.GetWorkerType())
			rc.m.event("updated")
		}
	}
}

// owned is the part of a spec discovery decides.
func owned(s *smgv1.WorkerSpec) *smgv1.WorkerSpec {
	return &smgv1.WorkerSpec{Url: s.GetUrl(), WorkerType: s.GetWorkerType(), BootstrapPort: s.BootstrapPort,
		Overload: s.GetOverload(), Labels: s.GetLabels(), Node: s.GetNode()}
}

// remove takes the pod's worker out of the registry (or cancels its
// registration), if this source added it.
func (rc *Reconciler) remove(t *tracked, reason string) {
	url := t.url
	t.url, t.notReadySince = "", time.Time{}
	snap := rc.reg.Snapshot()
	id := ""
	if w := snap.GetByURL(url); w != nil {
		if w.Spec.GetLabels()[podwatch.LabelSource] != t.source {
			return
		}
		id = w.ID
	} else {
		for _, j := range snap.Jobs() {
			if j.URL == url && j.Spec.GetLabels()[podwatch.LabelSource] == t.source {
				id = j.WorkerID
			}
		}
	}
	if id != "" && rc.r.Remove(id) == nil {
		rc.log.Info("Discovered pod removed", "pod", t.pod.Name, "namespace", t.pod.Namespace, "url", url, "reason", reason)
		rc.m.event("removed")
	}
}

// Delete forgets a pod that is gone or matches no selector.
func (rc *Reconciler) Delete(source, key string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.deleteLocked(podKey(source, key))
	rc.gauge()
}

func (rc *Reconciler) deleteLocked(k string) {
	t := rc.pods[k]
	if t == nil {
		return
	}
	delete(rc.pods, k)
	if t.url != "" {
		rc.remove(t, "the pod was deleted or no longer matches a selector")
	} else {
		rc.log.Info("Discovered pod gone", "pod", t.pod.Name, "namespace", t.pod.Namespace)
	}
}

// Synced removes the workers source added whose pods it no longer reports:
// pods deleted while no one watched (a control-plane restart, a leader
// change, an agent restart).
func (rc *Reconciler) Synced(source string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.collect(source)
}

// collect removes the workers source added whose pods it does not track.
func (rc *Reconciler) collect(source string) {
	live := map[string]bool{}
	for _, t := range rc.pods {
		if t.source == source && t.url != "" {
			live[t.url] = true
		}
	}
	for _, w := range rc.reg.Snapshot().Workers() {
		u := w.Spec.GetUrl()
		if w.Spec.GetLabels()[podwatch.LabelSource] != source || live[u] {
			continue
		}
		if err := rc.r.Remove(w.ID); err == nil {
			lb := w.Spec.GetLabels()
			rc.log.Info("Discovered pod removed", "pod", lb[podwatch.LabelPod], "namespace", lb[podwatch.LabelNamespace],
				"url", u, "reason", "the pod is no longer seen")
			rc.m.event("removed")
		}
	}
}

// ReplaceSource applies the complete set of pods a source sees (an agent's
// node): pods not in it are gone.
func (rc *Reconciler) ReplaceSource(source string, pods []podwatch.Pod) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	now := rc.opts.Now()
	seen := map[string]bool{}
	for _, p := range pods {
		seen[podKey(source, p.Key())] = true
		rc.upsertLocked(source, p, now)
	}
	for _, k := range slices.Sorted(maps.Keys(rc.pods)) {
		if rc.pods[k].source == source && !seen[k] {
			rc.deleteLocked(k)
		}
	}
	rc.collect(source)
	rc.gauge()
}

// Sweep applies the grace rule and brings back discovered workers deleted by
// hand while their pods exist.
func (rc *Reconciler) Sweep() {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	now := rc.opts.Now()
	for _, k := range slices.Sorted(maps.Keys(rc.pods)) {
		rc.reconcile(rc.pods[k], now)
	}
	rc.gauge()
}

// Run sweeps every interval until ctx ends.
func (rc *Reconciler) Run(ctx context.Context, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			rc.Sweep()
		}
	}
}

// State is how discovery classes a pod (smg_discovery_pods{state}).
func (t *tracked) state() string {
	switch {
	case t.pod.Problem != "":
		return "conflict"
	case t.pod.IP == "":
		return "no_ip"
	case !t.pod.Ready:
		return "not_ready"
	}
	return "ready"
}

func (rc *Reconciler) gauge() {
	n := map[string]int{}
	for _, t := range rc.pods {
		n[t.state()]++
	}
	for _, s := range PodStates {
		rc.m.pods.WithLabelValues(s).Set(float64(n[s]))
	}
}
