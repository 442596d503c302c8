package agentsvc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/podwatch"
	"github.com/smg-project/smg/internal/workerurl"
)

// action is what an agent's message would do with a worker.
type action int

const (
	// describe: feed a registered worker evidence (records, events,
	// heartbeats), mark it as fed by the agent, fail it when the stream
	// breaks.
	describe action = iota
	// create: register an engine (hello.register, discovered pods).
	create
)

var (
	errNotOnNode = errors.New("the engine is not on the agent's node: its spec names another node, or its host is neither the address the agent connects from nor one the control plane's --agent-token-file gives the node")
	errNoModels  = errors.New("the control plane allows agents to register no model (--agent-models, --agent-register-any-model)")
	errNoURL     = errors.New("no engine URL")
)

// authorize is the one gate between an agent's messages and the registry,
// passed with the worker's spec (describe: as registered; create: as the
// agent proposes it). An agent speaks only for engines on its node and
// registers only engines at its node's addresses serving a model the admin
// allowed. create returns the spec to register: canonical URL, node, the
// model read from the engine, and the agent's role, bootstrap port and
// overload block; nothing else. describe costs no allocation and no network.
func (s *Server) authorize(ctx context.Context, st *agentStream, act action, spec *smgv1.WorkerSpec) (*smgv1.WorkerSpec, error) {
	if act == describe { // a spec naming a node is judged by it alone, else by its host
		if n := spec.GetNode(); (n != "" && n != st.node) || (n == "" && !st.hosts.contains(workerurl.Host(spec.GetUrl()))) {
			return nil, s.refused(st, spec.GetUrl(), errNotOnNode)
		}
		return spec, nil
	}
	if spec.GetUrl() == "" {
		return nil, s.refused(st, "", errNoURL)
	}
	u, err := workerurl.Normalize(spec.GetUrl(), workerurl.Options{})
	if err != nil {
		return nil, s.refused(st, spec.GetUrl(), err)
	}
	if (spec.GetNode() != "" && spec.GetNode() != st.node) || !st.hosts.contains(workerurl.Host(u)) {
		return nil, s.refused(st, u, errNotOnNode)
	}
	p := s.opts.Registration
	if p.Discover == nil || (!p.AnyModel && len(p.Models) == 0) {
		return nil, s.refused(st, u, errNoModels)
	}
	model := s.registeredModel(st, u)
	if model == "" {
		dctx, cancel := context.WithTimeout(ctx, max(p.Timeout, time.Second))
		model, err = p.Discover(dctx, u)
		cancel()
		if err != nil {
			return nil, s.refused(st, u, fmt.Errorf("its model could not be read: %w", err))
		}
	}
	if !p.AnyModel && !slices.Contains(p.Models, model) {
		return nil, s.refused(st, u, fmt.Errorf("model %s is not one the admin allowed agents to serve (--agent-models)", model))
	}
	return &smgv1.WorkerSpec{Url: u, Node: st.node, ModelId: model, WorkerType: spec.GetWorkerType(),
		BootstrapPort: spec.BootstrapPort, Overload: spec.GetOverload()}, nil
}

// registeredModel is the model of the worker at url when this node's agent
// registered it (pinned then: a new leader re-reads an agent's pods without
// a round of model reads), or "".
func (s *Server) registeredModel(st *agentStream, url string) string {
	w := s.reg.Snapshot().GetByURL(url)
	if w == nil || w.Spec.GetNode() != st.node {
		return ""
	}
	lb := w.Spec.GetLabels()
	if lb[RegisteredByLabel] != st.node && lb[podwatch.LabelSource] != podwatch.SourceAgent(st.node) {
		return ""
	}
	return w.Spec.GetModelId()
}

// refused logs a refusal (once per URL and stream) and returns err.
func (s *Server) refused(st *agentStream, url string, err error) error {
	if s.opts.Refused != nil {
		s.opts.Refused(st.node, url, err)
	}
	st.mu.Lock()
	first := !st.refused[url] && len(st.refused) < maxKnown
	if first {
		st.refused[url] = true
	}
	st.mu.Unlock()
	if first {
		s.log.Warn("Agent refused: its message is about an engine it may not speak for; ignored",
			"node", st.node, "peer", st.peer, "url", workerurl.Redact(url), "reason", err.Error())
	}
	return err
}
