package agentsvc

import (
	"bufio"
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// An agent speaks only for its node: records, events and heartbeats about
// another node's worker, or about an unnamed worker at an address that is
// not the agent's, change nothing, and its stream breaking fails none of them.
func TestAgentSpeaksOnlyForItsNode(t *testing.T) {
	cfg := defaultConfig()
	cfg.liveness.StallSecs = 0 // one transport failure would veto
	h := start(t, cfg)
	other := worker("w-other", "http://127.0.0.1:8002", "n2") // named for another node
	remote := worker("w-remote", "http://10.99.0.1:8000", "") // unnamed, not at the agent's address
	mine := worker("w-mine", "http://127.0.0.1:8003", "n1")   // named for the agent's node
	local := worker("w-local", "http://127.0.0.1:8004", "")   // unnamed, at the agent's (loopback) address
	h.put(t, other, remote, mine, local)
	ctx, cancel := context.WithCancel(t.Context())
	st, _ := h.open(t, ctx, &smgv1.AgentHello{Node: "n1", EngineUrls: []string{other.Spec.Url, remote.Spec.Url}})
	for _, u := range []string{other.Spec.Url, remote.Spec.Url} {
		send(t, st, record(u, 99))
		send(t, st, event(u, smgv1.EngineEventKind_ENGINE_EVENT_KIND_TRANSPORT_FAILURE))
		send(t, st, &smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Heartbeat{Heartbeat: &smgv1.AgentHeartbeat{WorkerUrls: []string{u}}}})
	}
	send(t, st, record(mine.Spec.Url, 99))
	send(t, st, record(local.Spec.Url+"/", 99)) // an alias of the registered URL
	h.waitFor(t, "the agent's own workers overloaded", func(s *registry.Snapshot) bool {
		return s.Get("w-mine").Overloaded && s.Get("w-local").Overloaded
	})
	cancel() // the stream breaks
	h.waitFor(t, "the agent's own workers unreachable", func(s *registry.Snapshot) bool {
		return s.Get("w-mine").Liveness == smgv1.Veto_VETO_UNREACHABLE && s.Get("w-local").Liveness == smgv1.Veto_VETO_UNREACHABLE
	})
	for _, id := range []string{"w-other", "w-remote"} {
		w := h.reg.Snapshot().Get(id)
		if w.Overloaded || w.Liveness != smgv1.Veto_VETO_UNSPECIFIED || w.AgentNode != "" || w.Load != nil {
			t.Errorf("%s is not on node n1 but the agent changed it: overloaded %v, liveness %v, agent node %q, load %v",
				id, w.Overloaded, w.Liveness, w.AgentNode, w.Load)
		}
	}
}

const tokN1 = "n1-0123456789abcdef"

// A token from --agent-token-file names its node: a hello for another node
// is refused, and an unknown token is refused.
func TestTokenFileBindsTheNode(t *testing.T) {
	nodes, err := parseTokens("tokens", scanner("# node tokens\n"+tokN1+" n1 10.0.0.1\nn2-0123456789abcdef n2\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := nodes[tokN1]; got.Node != "n1" || !slices.Equal(got.Hosts, []string{"10.0.0.1"}) {
		t.Fatalf("parsed %+v", got)
	}
	withCIDR, err := parseTokens("tokens", scanner(tokN1+" n1 10.0.0.1 10.244.3.7/24\n"))
	if err != nil {
		t.Fatal(err)
	}
	hs := newHostSet(withCIDR[tokN1], t.Context())
	for host, want := range map[string]bool{"10.0.0.1": true, "10.244.3.17": true, "10.244.4.1": false, "127.0.0.1": false} {
		if got := hs.contains(host); got != want {
			t.Errorf("node with 10.244.3.0/24: %s on it %v, want %v", host, got, want)
		}
	}
	cfg := defaultConfig()
	cfg.opts.Auth = TokenAuth{Nodes: nodes}
	h := start(t, cfg)
	open := func(tok, node string) error {
		ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+tok)
		st, err := smgv1.NewAgentServiceClient(h.conn).Report(ctx)
		if err != nil {
			return err
		}
		_ = st.Send(&smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Hello{Hello: &smgv1.AgentHello{Node: node}}})
		_, err = st.Recv()
		_ = st.CloseSend()
		return err
	}
	if err := open(tokN1, "n2"); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `"n1"`) {
		t.Fatalf("n1's token naming n2: %v, want PermissionDenied naming n1", err)
	}
	if err := open("n3-0123456789abcdef", "n3"); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("unknown token: %v, want Unauthenticated", err)
	}
	if err := open(tokN1, "n1"); err != nil {
		t.Fatalf("n1's token for n1: %v", err)
	}
	for name, file := range map[string]string{
		"short token": "short n1\n",
		"no node":     tokN1 + "\n",
		"token twice": tokN1 + " n1\n" + tokN1 + " n2\n",
		"node twice":  tokN1 + " n1\nn1-fedcba9876543210 n1\n",
		"empty":       "# nothing\n",
		"bad prefix":  tokN1 + " n1 10.244.3.0/33\n",
	} {
		if _, err := parseTokens("tokens", scanner(file)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// An agent registers only engines on its node whose model the admin allowed,
// each pinned to that model and marked as the agent's.
func TestRegisterOnlyOwnEnginesOfAllowedModels(t *testing.T) {
	models := map[string]string{
		"http://127.0.0.1:9001": "allowed", "http://127.0.0.1:9002": "forbidden", "http://10.99.0.2:9003": "allowed",
	}
	var mu sync.Mutex
	var discovered []string
	cfg := defaultConfig()
	cfg.opts.Registration = RegistrationPolicy{Models: []string{"allowed"}, Discover: func(_ context.Context, url string) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		discovered = append(discovered, url)
		return models[url], nil
	}}
	h := start(t, cfg)
	h.put(t, worker("w1", "http://127.0.0.1:9000", ""))
	st, _ := h.open(t, t.Context(), &smgv1.AgentHello{Node: "n1", Register: true,
		EngineUrls: []string{"http://127.0.0.1:9000", "http://127.0.0.1:9001/", "http://127.0.0.1:9002", "http://10.99.0.2:9003"}})
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := len(discovered)
		mu.Unlock()
		h.mu.Lock()
		s := len(h.submitted)
		h.mu.Unlock()
		if n == 2 && s == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("discovered %v, submitted %d", discovered, s)
		}
		time.Sleep(10 * time.Millisecond) // polling, not an assertion
	}
	closeCleanly(t, st)
	h.mu.Lock()
	defer h.mu.Unlock()
	sub := h.submitted[0]
	if len(h.submitted) != 1 || sub.GetUrl() != "http://127.0.0.1:9001" || sub.GetNode() != "n1" || sub.GetModelId() != "allowed" ||
		sub.GetLabels()[RegisteredByLabel] != "n1" {
		t.Fatalf("submitted %v, want only http://127.0.0.1:9001, node n1, model allowed, marked as n1's", h.submitted)
	}
	if slices.Contains(discovered, "http://10.99.0.2:9003") {
		t.Fatal("an engine off the agent's node was contacted")
	}
}

// With no model allowed, an agent registers nothing.
func TestRegisterRefusedByDefault(t *testing.T) {
	h := start(t, defaultConfig())
	st, _ := h.open(t, t.Context(), &smgv1.AgentHello{Node: "n1", Register: true, EngineUrls: []string{"http://127.0.0.1:9001"}})
	closeCleanly(t, st)
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.submitted) != 0 {
		t.Fatalf("submitted %v with no model allowed", h.submitted)
	}
}

// The workers an agent registered are removed once its node has had no
// stream for the stale bound; a reconnect in time keeps them.
func TestGoneAgentsWorkersRemoved(t *testing.T) {
	var mu sync.Mutex
	var armed []func()
	var removed []string
	var stopped int
	cfg := defaultConfig()
	cfg.opts.GoneAfter = 15 * time.Second
	cfg.opts.AfterFunc = func(d time.Duration, f func()) func() bool {
		if d != 15*time.Second {
			t.Errorf("removal armed after %s, want the stale bound", d)
		}
		mu.Lock()
		defer mu.Unlock()
		armed = append(armed, f)
		return func() bool { mu.Lock(); defer mu.Unlock(); stopped++; return true }
	}
	var h *harness
	cfg.opts.Remove = func(id string) error {
		mu.Lock()
		removed = append(removed, id)
		mu.Unlock()
		_, err := h.reg.Update(func(tx *registry.Txn) error { tx.Delete(id); return nil })
		return err
	}
	h = start(t, cfg)
	byAgent := worker("w-agent", "http://127.0.0.1:9001", "n1")
	byAgent.Spec.Labels = map[string]string{RegisteredByLabel: "n1"}
	byAdmin := worker("w-admin", "http://127.0.0.1:9002", "n1")
	otherNode := worker("w-n2", "http://127.0.0.1:9003", "n2")
	otherNode.Spec.Labels = map[string]string{RegisteredByLabel: "n2"}
	h.put(t, byAgent, byAdmin, otherNode)

	st, _ := h.open(t, t.Context(), &smgv1.AgentHello{Node: "n1"})
	closeCleanly(t, st)
	waitArmed := func(n int) func() {
		t.Helper()
		for range 500 {
			mu.Lock()
			if len(armed) == n {
				f := armed[n-1]
				mu.Unlock()
				return f
			}
			mu.Unlock()
			time.Sleep(10 * time.Millisecond) // polling for the stream's end, not an assertion
		}
		t.Fatalf("removal not armed %d times", n)
		return nil
	}
	// The agent comes back before the bound: the pending removal is stopped,
	// and firing it late removes nothing.
	first := waitArmed(1)
	st, _ = h.open(t, t.Context(), &smgv1.AgentHello{Node: "n1"})
	first()
	mu.Lock()
	if stopped != 1 || len(removed) != 0 {
		t.Fatalf("after a reconnect: %d stops, removed %v", stopped, removed)
	}
	mu.Unlock()
	// Gone for good: the bound passes.
	closeCleanly(t, st)
	waitArmed(2)()
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(removed, []string{"w-agent"}) {
		t.Fatalf("removed %v, want only the worker n1's agent registered", removed)
	}
}

func scanner(s string) *bufio.Scanner { return bufio.NewScanner(strings.NewReader(s)) }

// A record that arrives before its engine's registration is applied by the
// first heartbeat after it: the agent sends records only on change, so the
// worker would otherwise never be fed.
func TestRecordBeforeRegistrationAppliedByTheNextHeartbeat(t *testing.T) {
	h := start(t, defaultConfig())
	const u = "http://127.0.0.1:9100"
	st, _ := h.open(t, t.Context(), &smgv1.AgentHello{Node: "n1", EngineUrls: []string{u}})
	send(t, st, record(u, 6))
	send(t, st, record("http://127.0.0.1:9199", 6)) // not in the hello: never kept
	h.put(t, worker("w1", u, ""))
	send(t, st, &smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Heartbeat{Heartbeat: &smgv1.AgentHeartbeat{WorkerUrls: []string{u}}}})
	h.waitFor(t, "the early record applied", func(s *registry.Snapshot) bool {
		w := s.Get("w1")
		return w.AgentNode == "n1" && w.Load.GetWaitingRequests() == 6 && w.Overloaded
	})
	closeCleanly(t, st)
}
