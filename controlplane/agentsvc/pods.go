package agentsvc

import (
	"sync"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/podwatch"
)

// maxPods bounds the pods one message may name (a node runs a few dozen;
// kubelet's default cap is 110): the rest are refused.
const maxPods = 1024

// podReads bounds the engines one stream's pods are read (for their model)
// at once.
const podReads = 8

// podsSlot holds a stream's latest pods not applied yet: authorizing them
// may read engines' models, so it runs beside the receive loop.
type podsSlot struct {
	mu      sync.Mutex
	latest  *smgv1.DiscoveredPods
	running bool
}

// pods hands the node's discovered pods to discovery, each authorized as a
// registration of this node's agent (whatever node, model or source the
// agent wrote), so that this agent polls them.
func (s *Server) pods(st *agentStream, m *smgv1.DiscoveredPods) {
	if s.opts.Discovery == nil || !s.current(st) {
		return
	}
	st.pods.mu.Lock()
	st.pods.latest = m
	start := !st.pods.running
	st.pods.running = true
	st.pods.mu.Unlock()
	if start {
		go s.applyPods(st)
	}
}

func (s *Server) applyPods(st *agentStream) {
	for {
		st.pods.mu.Lock()
		m := st.pods.latest
		st.pods.latest = nil
		if m == nil {
			st.pods.running = false
			st.pods.mu.Unlock()
			return
		}
		st.pods.mu.Unlock()
		pods := s.authorizePods(st, m)
		if st.ctx.Err() == nil && s.current(st) {
			s.opts.Discovery.ReplaceSource(podwatch.SourceAgent(st.node), pods)
		}
	}
}

// authorizePods turns the agent's pods into discovery's, a spec kept only
// as authorize makes it; a pod not Ready keeps one only when this node's
// agent registered it already (its engine is not asked for its model yet).
func (s *Server) authorizePods(st *agentStream, m *smgv1.DiscoveredPods) []podwatch.Pod {
	in := m.GetPods()
	if len(in) > maxPods {
		s.log.Warn("Agent sent more pods than a node runs; the rest are ignored", "node", st.node, "pods", len(in), "kept", maxPods)
		in = in[:maxPods]
	}
	source := podwatch.SourceAgent(st.node)
	pods := make([]podwatch.Pod, 0, len(in)) // never grown past len(in): &pods[i] stays valid
	sem := make(chan struct{}, podReads)
	var wg sync.WaitGroup
	for _, p := range in {
		if p.GetName() == "" || p.GetNamespace() == "" {
			s.log.Warn("Agent sent a pod without a name or namespace; ignored", "node", st.node)
			continue
		}
		pods = append(pods, podwatch.Pod{Namespace: p.GetNamespace(), Name: p.GetName(), IP: p.GetIp(), Ready: p.GetReady(),
			Problem: p.GetProblem(), Warnings: p.GetWarnings()})
		spec := p.GetSpec()
		if spec == nil || (!p.GetReady() && s.registeredModel(st, canonicalURL(spec.GetUrl())) == "") {
			continue
		}
		pod := &pods[len(pods)-1]
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if spec, _ := s.authorize(st.ctx, st, create, spec); spec != nil {
				spec.Labels = map[string]string{podwatch.LabelPod: pod.Name, podwatch.LabelNamespace: pod.Namespace, podwatch.LabelSource: source}
				pod.Spec = spec
			}
		})
	}
	wg.Wait()
	return pods
}
