package agent

import (
	"maps"
	"slices"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/podwatch"
)

// podSet is the engine pods service discovery sees on this node. It is a
// podwatch.Sink; the control plane gets the complete set after every change
// (and after each hello), never a partial one before the first list.
type podSet struct {
	a      *Agent
	pods   map[string]podwatch.Pod // by namespace/name; guarded by a.mu
	synced bool
	dirty  bool
}

func (s *podSet) Upsert(_ string, p podwatch.Pod) {
	s.change(func() { s.pods[p.Key()] = p })
	s.a.log.Info("Engine pod seen on this node", "pod", p.Name, "namespace", p.Namespace, "ip", p.IP, "ready", p.Ready)
}

func (s *podSet) Delete(_, key string) {
	s.change(func() { delete(s.pods, key) })
	s.a.log.Info("Engine pod gone from this node", "pod", key)
}

func (s *podSet) Synced(string) { s.change(func() { s.synced = true }) }

func (s *podSet) change(fn func()) {
	s.a.mu.Lock()
	fn()
	s.dirty = true
	s.a.mu.Unlock()
	s.a.kick()
}

// messageLocked returns the set to send, if any; a.mu is held.
func (s *podSet) messageLocked(all bool) *smgv1.ReportRequest {
	if s == nil || !s.synced || !(s.dirty || all) {
		return nil
	}
	s.dirty = false
	m := &smgv1.DiscoveredPods{}
	for _, k := range slices.Sorted(maps.Keys(s.pods)) {
		p := s.pods[k]
		m.Pods = append(m.Pods, &smgv1.DiscoveredPod{Namespace: p.Namespace, Name: p.Name, Ip: p.IP, Ready: p.Ready,
			Spec: p.Spec, Problem: p.Problem, Warnings: p.Warnings})
	}
	return &smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Pods{Pods: m}}
}

// newPodWatcher builds this node's pod informers (in-cluster credentials
// unless the options carry a client).
func (a *Agent) newPodWatcher() (*podwatch.Watcher, error) {
	client := a.opts.KubeClient
	if client == nil {
		var err error
		if client, err = podwatch.InCluster(); err != nil {
			return nil, err
		}
	}
	return podwatch.NewWatcher(client, a.opts.Discovery, a.opts.Node, podwatch.SourceAgent(a.opts.Node), a.pods, a.log)
}

// kick wakes the sender.
func (a *Agent) kick() {
	select {
	case a.wake <- struct{}{}:
	default:
	}
}
