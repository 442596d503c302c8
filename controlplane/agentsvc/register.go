package agentsvc

import (
	"context"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/podwatch"
	"github.com/smg-project/smg/internal/workerurl"
)

// RegisteredByLabel marks a worker an agent registered; its value is the
// node. Such workers are removed when their node's agent is gone for good.
// An admin who PATCHes the labels without it adopts the worker.
const RegisteredByLabel = "smg.agent-registered"

// RegistrationPolicy bounds what agents may register: engines on their own
// node only, serving a model the admin allowed.
type RegistrationPolicy struct {
	// Models agents may register engines for (--agent-models).
	Models []string
	// AnyModel lets agents register engines for any model
	// (--agent-register-any-model).
	AnyModel bool
	// Discover asks an engine for its model (admin.DiscoverModel). Nil:
	// agents may not register at all.
	Discover func(ctx context.Context, url string) (string, error)
	// Timeout bounds one engine's discovery.
	Timeout time.Duration
}

func (p RegistrationPolicy) allows(model string) bool {
	return p.AnyModel || slices.Contains(p.Models, model)
}

// register submits the hello's engines that are not registered yet, each in
// the background: only an engine on the agent's node, whose model the admin
// allowed agents to serve, is registered, pinned to that model.
func (s *Server) register(ctx context.Context, st *agentStream) {
	snap := s.reg.Snapshot()
	for _, u := range st.own {
		if snap.GetByURL(u) != nil {
			continue
		}
		go s.registerOne(ctx, st, u)
	}
}

func (s *Server) registerOne(ctx context.Context, st *agentStream, raw string) {
	refuse := func(why string) {
		s.log.Warn("Agent's engine not registered", "node", st.node, "peer", st.peer, "url", workerurl.Redact(raw), "reason", why)
	}
	u, err := workerurl.Normalize(raw, workerurl.Options{})
	if err != nil {
		refuse(err.Error())
		return
	}
	if !st.hosts.contains(workerurl.Host(u)) {
		refuse("the engine is not on the agent's node: its host is neither the address the agent connects from nor one the control plane's --agent-token-file gives the node")
		return
	}
	p := s.opts.Registration
	if p.Discover == nil || (!p.AnyModel && len(p.Models) == 0) {
		refuse("the control plane allows agents to register no model (--agent-models, --agent-register-any-model)")
		return
	}
	dctx, cancel := context.WithTimeout(ctx, max(p.Timeout, time.Second))
	model, err := p.Discover(dctx, u)
	cancel()
	if err != nil {
		refuse("its model could not be read: " + err.Error())
		return
	}
	if !p.allows(model) {
		refuse("model " + model + " is not one the admin allowed agents to serve (--agent-models)")
		return
	}
	id, err := s.submit(&smgv1.WorkerSpec{Url: u, Node: st.node, ModelId: model,
		Labels: map[string]string{RegisteredByLabel: st.node}})
	switch {
	case err == nil:
		s.log.Info("Agent registers its engine", "node", st.node, "url", u, "model", model, "worker_id", id)
	case status.Code(err) == codes.AlreadyExists:
		// A registration of this URL is already under way.
	default:
		refuse(status.Convert(err).Message())
	}
}

// scheduleGone arms the removal of the workers node's agent registered, for
// when it stays away past GoneAfter. Caller holds s.mu.
func (s *Server) scheduleGone(node string) {
	if s.opts.GoneAfter <= 0 || s.opts.Remove == nil {
		return
	}
	if stop := s.gone[node]; stop != nil {
		stop()
	}
	s.gone[node] = s.opts.AfterFunc(s.opts.GoneAfter, func() { s.removeGone(node) })
}

// removeGone removes the workers node's agent registered, unless the agent
// came back meanwhile.
func (s *Server) removeGone(node string) {
	s.mu.Lock()
	_, back := s.nodes[node]
	delete(s.gone, node)
	s.mu.Unlock()
	if back {
		return
	}
	if s.opts.Discovery != nil {
		// The pods it discovered go with it (their workers are removed).
		s.opts.Discovery.ReplaceSource(podwatch.SourceAgent(node), nil)
	}
	for _, w := range s.reg.Snapshot().Workers() {
		if !registeredBy(w, node) {
			continue
		}
		if err := s.opts.Remove(w.ID); err != nil {
			s.log.Warn("Could not remove a worker of a gone agent", "node", node, "worker_id", w.ID, "error", err)
			continue
		}
		s.log.Info("Agent gone past the stale bound: removed the worker it registered", "node", node, "worker_id", w.ID, "url", w.Spec.GetUrl())
	}
}

func registeredBy(w *registry.Worker, node string) bool {
	return w.Spec.GetLabels()[RegisteredByLabel] == node && w.Spec.GetNode() == node
}
