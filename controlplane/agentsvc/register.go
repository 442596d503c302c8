package agentsvc

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/podwatch"
)

// RegisteredByLabel marks a worker an agent registered (value: the node),
// removed when that agent is gone for good; PATCHing it away adopts the worker.
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

// register submits the hello's engines not registered yet, each in the
// background, as authorize allows (pinned to the model read).
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
	spec, err := s.authorize(ctx, st, create, &smgv1.WorkerSpec{Url: raw})
	if err != nil {
		return // logged by authorize
	}
	spec.Labels = map[string]string{RegisteredByLabel: st.node}
	id, err := s.submit(spec)
	switch {
	case err == nil:
		s.log.Info("Agent registers its engine", "node", st.node, "url", spec.GetUrl(), "model", spec.GetModelId(), "worker_id", id)
	case status.Code(err) == codes.AlreadyExists:
		// A registration of this URL is already under way.
	default:
		s.log.Warn("Agent's engine not registered", "node", st.node, "peer", st.peer, "url", spec.GetUrl(), "reason", status.Convert(err).Message())
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
		if w.Spec.GetLabels()[RegisteredByLabel] != node || w.Spec.GetNode() != node {
			continue
		}
		if err := s.opts.Remove(w.ID); err != nil {
			s.log.Warn("Could not remove a worker of a gone agent", "node", node, "worker_id", w.ID, "error", err)
			continue
		}
		s.log.Info("Agent gone past the stale bound: removed the worker it registered", "node", node, "worker_id", w.ID, "url", w.Spec.GetUrl())
	}
}
