package agent

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/smg-project/smg/controlplane/admin"
	"github.com/smg-project/smg/controlplane/agentsvc"
	"github.com/smg-project/smg/controlplane/evidence"
	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/sim"
)

// controlPlane is the real ingest side of a control plane: registry,
// ingester, liveness tracker and AgentService on a loopback gRPC port.
type controlPlane struct {
	addr string
	reg  *registry.Registry
	srv  *agentsvc.Server
}

type cpConfig struct {
	token    string
	liveness judge.LivenessConfig
	now      func() time.Time
	register bool // a real admin service registers engines
}

func startControlPlane(t *testing.T, cfg cpConfig) *controlPlane {
	t.Helper()
	if cfg.liveness == (judge.LivenessConfig{}) {
		cfg.liveness = judge.DefaultLivenessConfig()
	}
	cp := &controlPlane{reg: registry.New("epoch", 0)}
	tr := evidence.New(cp.reg, evidence.Options{Rules: cfg.liveness, Now: cfg.now}, discard(), prometheus.NewRegistry())
	submit := func(*smgv1.WorkerSpec) (string, error) { t.Error("unexpected registration"); return "", nil }
	var policy agentsvc.RegistrationPolicy
	if cfg.register {
		client := &http.Client{Transport: &http.Transport{}}
		svc := admin.New(cp.reg, admin.Options{RegistrationTimeout: 5 * time.Second},
			func(*smgv1.OverloadBlock) (judge.Thresholds, error) { return judge.Thresholds{WaitingRequests: 8}, nil },
			client, discard())
		t.Cleanup(func() { svc.Close(); client.CloseIdleConnections() })
		submit = svc.Submit
		policy = agentsvc.RegistrationPolicy{Models: []string{"sim-model"}, Discover: func(ctx context.Context, url string) (string, error) {
			return admin.DiscoverModel(ctx, client, url, "")
		}}
	}
	cp.srv = agentsvc.New(cp.reg, tr, submit,
		agentsvc.Options{Auth: agentsvc.TokenAuth{Shared: cfg.token}, Now: cfg.now, Registration: policy}, discard())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cp.addr = lis.Addr().String()
	gs := newGRPCServer()
	smgv1.RegisterAgentServiceServer(gs, cp.srv)
	go gs.Serve(lis)
	t.Cleanup(func() { cp.srv.Close(); gs.Stop() })
	return cp
}

// put registers a Ready worker for url with a waiting-requests ceiling of 2.
func (cp *controlPlane) put(t *testing.T, id, url, node string) {
	t.Helper()
	_, err := cp.reg.Update(func(tx *registry.Txn) error {
		tx.Insert(&registry.Worker{Registered: registry.Registered{ID: id, Spec: &smgv1.WorkerSpec{Url: url, Node: node}, Model: "sim-model", Type: "regular", Thresholds: judge.Thresholds{WaitingRequests: 2, TokenUsage: 1}}, State: registry.State{Health: registry.HealthHealthy}})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// waitFor waits, on registry commits, until cond holds.
func (cp *controlPlane) waitFor(t *testing.T, what string, cond func(s *registry.Snapshot) bool) {
	t.Helper()
	deadline := time.NewTimer(5 * time.Second)
	defer deadline.Stop()
	for {
		changed := cp.reg.Changed()
		if cond(cp.reg.Snapshot()) {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func TestVerdictFollowsTheEngineOfAnAssignedWorker(t *testing.T) {
	cp := startControlPlane(t, cpConfig{})
	eng := engineSim(t, sim.FlavorVLLM)
	cp.put(t, "w1", eng.URL(), "n1") // registered with the node's name: the agent is assigned it
	a := runAgent(t, fastOpts(cp.addr))

	cp.waitFor(t, "the assigned worker fed by the agent", func(s *registry.Snapshot) bool {
		w := s.Get("w1")
		return w.AgentNode == "n1" && w.Load != nil
	})
	if got := a.Engines(); len(got) != 1 || got[0] != eng.URL() {
		t.Fatalf("agent polls %v, want the assigned engine", got)
	}
	gen := newLoadGen(t)
	for range 4 { // one runs, three wait: over the ceiling of 2
		gen.start(eng.URL())
	}
	cp.waitFor(t, "overloaded by the pushed load", func(s *registry.Snapshot) bool { return s.Get("w1").Overloaded })
	gen.stop()
	cp.waitFor(t, "back in routing once the queue drained", func(s *registry.Snapshot) bool { return !s.Get("w1").Overloaded })
}

func TestFrozenEngineIsWedgedByItsOwnSilence(t *testing.T) {
	clk := newClock() // the agent's and the control plane's clock
	cp := startControlPlane(t, cpConfig{now: clk.Now})
	eng := engineSim(t, sim.FlavorVLLM)
	cp.put(t, "w1", eng.URL(), "")
	newLoadGen(t).start(eng.URL())
	opts := fastOpts(cp.addr, eng.URL())
	opts.Now = clk.Now
	runAgent(t, opts)
	cp.waitFor(t, "a running request reported", func(s *registry.Snapshot) bool {
		return s.Get("w1").Load.GetRunningRequests() == 1
	})
	if err := eng.SetFault(sim.Fault{Freeze: true}); err != nil {
		t.Fatal(err)
	}
	// 4 s pass with no step (the wedge bound is 3 s); a step under way when
	// the freeze landed may restart the count once, so advance until vetoed.
	deadline := time.Now().Add(5 * time.Second)
	for cp.reg.Snapshot().Get("w1").Liveness != smgv1.Veto_VETO_WEDGED {
		if time.Now().After(deadline) {
			t.Fatal("the frozen engine was never vetoed as wedged")
		}
		clk.Advance(4 * time.Second)
		wait := time.NewTimer(500 * time.Millisecond)
		select {
		case <-cp.reg.Changed():
		case <-wait.C:
		}
		wait.Stop()
	}
	if err := eng.SetFault(sim.Fault{}); err != nil {
		t.Fatal(err)
	}
	cp.waitFor(t, "re-admitted once the engine steps again", func(s *registry.Snapshot) bool {
		return s.Get("w1").Liveness == smgv1.Veto_VETO_UNSPECIFIED
	})
}

func TestRegisterRegistersTheEnginesWithTheNode(t *testing.T) {
	cp := startControlPlane(t, cpConfig{register: true})
	eng := engineSim(t, sim.FlavorSGLang)
	opts := fastOpts(cp.addr, eng.URL())
	opts.Register = true
	runAgent(t, opts)
	cp.waitFor(t, "the engine registered under the node", func(s *registry.Snapshot) bool {
		w := s.GetByURL(eng.URL())
		return w != nil && w.Spec.GetNode() == "n1" && w.Model == "sim-model"
	})
}

func TestShutdownClosesTheStreamCleanly(t *testing.T) {
	cp := startControlPlane(t, cpConfig{liveness: judge.LivenessConfig{StallSecs: 0, WedgeSecs: 3, StaleSecs: 15}})
	eng := engineSim(t, sim.FlavorVLLM)
	cp.put(t, "w1", eng.URL(), "")
	a, err := New(fastOpts(cp.addr, eng.URL()), discard(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	cp.waitFor(t, "fed by the agent", func(s *registry.Snapshot) bool { return s.Get("w1").AgentNode == "n1" })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	// Run returns once the control plane has ended the stream.
	w := cp.reg.Snapshot().Get("w1")
	if w.Liveness != smgv1.Veto_VETO_UNSPECIFIED || w.AgentNode != "" {
		t.Fatalf("after a clean shutdown: liveness %v, agent node %q; want no veto and no feeding node", w.Liveness, w.AgentNode)
	}
}

func TestWrongTokenIsRefused(t *testing.T) {
	cp := startControlPlane(t, cpConfig{token: "right"})
	opts := fastOpts(cp.addr)
	opts.Token = "wrong"
	a, err := New(opts, discard(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = a.Run(ctx)
	if err == nil || !strings.Contains(err.Error(), "refused") || !strings.Contains(err.Error(), "token") {
		t.Fatalf("Run with a wrong token: %v, want a refusal naming the token", err)
	}
}
