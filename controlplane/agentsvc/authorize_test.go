package agentsvc

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/podwatch"
)

// podSink is a discovery sink that keeps what it was handed.
type podSink struct {
	mu    sync.Mutex
	calls [][]podwatch.Pod
}

func (p *podSink) ReplaceSource(_ string, pods []podwatch.Pod) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, pods)
}

// Every AgentService message that creates, changes or describes a worker
// passes authorize: with node A's token, no message registers or feeds node
// B's engine, an engine at an address on no node, or an engine on A serving
// a model the admin did not allow. The cases are the oneof of the agent's
// message: a message type added without its hostile case fails the test.
func TestEveryAgentMessageIsAuthorized(t *testing.T) {
	const (
		tokA      = "node-a-0123456789abcdef"
		onB       = "http://10.0.0.2:8000"    // node B's address, not registered
		offFleet  = "http://203.0.113.9:8000" // no node's address
		forbidden = "http://127.0.0.1:9002"   // on A (the agent connects over loopback), model not allowed
		bNamed    = "http://127.0.0.1:8001"   // registered for node B by name
		bHost     = "http://10.0.0.2:8002"    // registered without a node, at B's address
	)
	creates := []string{onB, offFleet, forbidden}
	describes := []string{bNamed, bHost, offFleet}
	load := &smgv1.EngineLoad{Source: "vllm", WaitingRequests: 99, Ranks: []*smgv1.RankLoad{{WaitingRequests: 99, RunningRequests: 1}}}
	records := func(urls []string) []*smgv1.LoadRecord {
		var out []*smgv1.LoadRecord
		for _, u := range urls {
			out = append(out, &smgv1.LoadRecord{WorkerUrl: u, Load: load})
		}
		return out
	}
	type hostile struct {
		hello   *smgv1.AgentHello      // the stream's hello (nil: a harmless one)
		msgs    []*smgv1.ReportRequest // sent after it
		refused []string               // URLs authorize must refuse
	}
	cases := map[protoreflect.Name]hostile{
		"hello": {hello: &smgv1.AgentHello{Node: "node-a", Register: true, EngineUrls: creates}, refused: creates},
		"record": {msgs: func() (m []*smgv1.ReportRequest) {
			for _, r := range records(describes) {
				m = append(m, &smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Record{Record: r}})
			}
			return m
		}(), refused: []string{bNamed, bHost}},
		"records": {msgs: []*smgv1.ReportRequest{{Msg: &smgv1.ReportRequest_Records{Records: &smgv1.LoadRecords{Records: records(describes)}}}},
			refused: []string{bNamed, bHost}},
		"event": {msgs: func() (m []*smgv1.ReportRequest) {
			for _, u := range describes {
				m = append(m, event(u, smgv1.EngineEventKind_ENGINE_EVENT_KIND_TRANSPORT_FAILURE))
			}
			return m
		}(), refused: []string{bNamed, bHost}},
		"heartbeat": {msgs: []*smgv1.ReportRequest{{Msg: &smgv1.ReportRequest_Heartbeat{Heartbeat: &smgv1.AgentHeartbeat{WorkerUrls: describes}}}},
			refused: []string{bNamed, bHost}},
		"pods": {msgs: []*smgv1.ReportRequest{{Msg: &smgv1.ReportRequest_Pods{Pods: &smgv1.DiscoveredPods{Pods: []*smgv1.DiscoveredPod{
			{Namespace: "ns", Name: "b", Ip: "10.0.0.2", Ready: true, Spec: &smgv1.WorkerSpec{Url: onB, Node: "node-a", ModelId: "allowed"}},
			{Namespace: "ns", Name: "off", Ip: "203.0.113.9", Ready: true, Spec: &smgv1.WorkerSpec{Url: offFleet, ModelId: "allowed"}},
			{Namespace: "ns", Name: "forbidden", Ip: "127.0.0.1", Ready: true, Spec: &smgv1.WorkerSpec{Url: forbidden, ModelId: "allowed"}},
			{Namespace: "ns", Name: "b-named", Ip: "127.0.0.1", Ready: true, Spec: &smgv1.WorkerSpec{Url: bNamed, Node: "node-b"}},
		}}}}}, refused: []string{onB, offFleet, forbidden, bNamed}},
	}
	oneof := (&smgv1.ReportRequest{}).ProtoReflect().Descriptor().Oneofs().ByName("msg")
	for i := range oneof.Fields().Len() {
		name := oneof.Fields().Get(i).Name()
		c, ok := cases[name]
		if !ok {
			t.Errorf("AgentService message %q has no hostile case: add one here, and make its path pass authorize", name)
			continue
		}
		t.Run(string(name), func(t *testing.T) {
			var mu sync.Mutex
			refused := map[string]bool{}
			var contacted []string
			sink := &podSink{}
			cfg := defaultConfig()
			cfg.liveness.StallSecs = 0 // one transport failure would veto
			cfg.opts.Auth = TokenAuth{Nodes: map[string]Identity{
				tokA:                      {Node: "node-a", Hosts: []string{"10.0.0.1"}},
				"node-b-0123456789abcdef": {Node: "node-b", Hosts: []string{"10.0.0.2"}},
			}}
			cfg.opts.Discovery = sink
			cfg.opts.Registration = RegistrationPolicy{Models: []string{"allowed"}, Discover: func(_ context.Context, url string) (string, error) {
				mu.Lock()
				defer mu.Unlock()
				contacted = append(contacted, url)
				if url == forbidden {
					return "forbidden", nil
				}
				return "allowed", nil
			}}
			cfg.opts.Refused = func(node, url string, _ error) {
				mu.Lock()
				defer mu.Unlock()
				if node != "node-a" {
					t.Errorf("refusal for node %q", node)
				}
				refused[url] = true
			}
			h := start(t, cfg)
			h.put(t, worker("w-b-named", bNamed, "node-b"), worker("w-b-host", bHost, ""))
			hello := c.hello
			if hello == nil {
				hello = &smgv1.AgentHello{Node: "node-a"}
			}
			ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+tokA)
			st, _ := h.open(t, ctx, hello)
			for _, m := range c.msgs {
				send(t, st, m)
			}
			deadline := time.Now().Add(10 * time.Second)
			for {
				mu.Lock()
				all := true
				for _, u := range c.refused {
					all = all && refused[u]
				}
				mu.Unlock()
				if all {
					break
				}
				if time.Now().After(deadline) {
					mu.Lock()
					t.Errorf("refused %v, want at least %v", refused, c.refused)
					mu.Unlock()
					break
				}
				time.Sleep(10 * time.Millisecond) // polling background registrations, not timing a rule
			}
			closeCleanly(t, st)
			h.mu.Lock()
			if len(h.submitted) > 0 {
				t.Errorf("registered %v", h.submitted)
			}
			h.mu.Unlock()
			sink.mu.Lock()
			for _, call := range sink.calls {
				for _, p := range call {
					if p.Spec != nil {
						t.Errorf("pod %s handed to discovery with spec %v", p.Name, p.Spec)
					}
				}
			}
			sink.mu.Unlock()
			mu.Lock()
			for _, u := range []string{onB, offFleet} {
				if slices.Contains(contacted, u) {
					t.Errorf("the engine at %s, on no node of the agent's, was contacted", u)
				}
			}
			mu.Unlock()
			snap := h.reg.Snapshot()
			if n := len(snap.Workers()); n != 2 {
				t.Errorf("%d workers, want the 2 registered", n)
			}
			for _, id := range []string{"w-b-named", "w-b-host"} {
				w := snap.Get(id)
				if w.Overloaded || w.Liveness != smgv1.Veto_VETO_UNSPECIFIED || w.AgentNode != "" || w.Load != nil {
					t.Errorf("%s is node B's but node A's agent changed it: overloaded %v, liveness %v, agent node %q, load %v",
						id, w.Overloaded, w.Liveness, w.AgentNode, w.Load)
				}
			}
		})
	}
}

// An agent's pods at its node's addresses (the token file's pod CIDR)
// serving an allowed model are handed to discovery as authorize makes them:
// pinned to the model read from the engine, under the agent's node, with the
// role, bootstrap port and overload block the agent gave and nothing else.
// A pod that is not Ready is not read (its engine may not answer yet).
func TestAgentsPodsAuthorized(t *testing.T) {
	const tok = "node-a-0123456789abcdef"
	nodes, err := parseTokens("tokens", scanner(tok+" node-a 10.0.0.1 10.244.3.0/24\n"))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var contacted []string
	sink := &podSink{}
	cfg := defaultConfig()
	cfg.opts.Auth = TokenAuth{Nodes: nodes}
	cfg.opts.Discovery = sink
	cfg.opts.Registration = RegistrationPolicy{Models: []string{"allowed"}, Discover: func(_ context.Context, url string) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		contacted = append(contacted, url)
		return "allowed", nil
	}}
	h := start(t, cfg)
	bp := int32(8998)
	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+tok)
	st, _ := h.open(t, ctx, &smgv1.AgentHello{Node: "node-a"})
	send(t, st, &smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Pods{Pods: &smgv1.DiscoveredPods{Pods: []*smgv1.DiscoveredPod{
		{Namespace: "ns", Name: "p0", Ip: "10.244.3.17", Ready: true, Spec: &smgv1.WorkerSpec{Url: "HTTP://10.244.3.17:8000/", WorkerType: "prefill",
			BootstrapPort: &bp, ApiKey: "stolen", Priority: proto.Int32(1000), Cost: proto.Float64(0.001), ModelId: "other", Labels: map[string]string{"x": "y"}}},
		{Namespace: "ns", Name: "p1", Ip: "10.244.3.18", Spec: &smgv1.WorkerSpec{Url: "http://10.244.3.18:8000"}}, // not Ready
	}}}})
	var got []podwatch.Pod
	deadline := time.Now().Add(10 * time.Second)
	for got == nil {
		sink.mu.Lock()
		if len(sink.calls) > 0 {
			got = sink.calls[0]
		}
		sink.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatal("no pods handed to discovery")
		}
		time.Sleep(10 * time.Millisecond) // polling the background authorization, not timing a rule
	}
	closeCleanly(t, st)
	if len(got) != 2 || got[1].Spec != nil {
		t.Fatalf("handed %+v, want both pods, the one not Ready without a spec", got)
	}
	want := &smgv1.WorkerSpec{Url: "http://10.244.3.17:8000", Node: "node-a", ModelId: "allowed", WorkerType: "prefill", BootstrapPort: &bp,
		Labels: map[string]string{podwatch.LabelPod: "p0", podwatch.LabelNamespace: "ns", podwatch.LabelSource: podwatch.SourceAgent("node-a")}}
	if !proto.Equal(got[0].Spec, want) {
		t.Errorf("spec %v\nwant %v", got[0].Spec, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(contacted, []string{"http://10.244.3.17:8000"}) {
		t.Errorf("read the models of %v, want only the Ready pod's engine", contacted)
	}
}
