package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/smg-project/smg/controlplane/registry"
	"github.com/smg-project/smg/internal/testutil"
	"github.com/smg-project/smg/internal/tlsutil"
	"github.com/smg-project/smg/internal/tlsutil/testca"
)

// raftPKI is a cluster CA and the files of the certificates it issues.
type raftPKI struct{ *testca.Dir }

func newRaftPKI(t *testing.T, name string) raftPKI { return raftPKI{testca.NewDir(t, name)} }

// tlsFor loads a Raft TLS setup for a certificate with the common name cn,
// trusting this CA.
func (p raftPKI) tlsFor(t *testing.T, name, cn string) *TLS {
	t.Helper()
	c, k, _ := p.Issue(name, cn)
	log := slog.New(slog.DiscardHandler)
	kp, err := tlsutil.LoadKeyPair(c, k, log)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := tlsutil.LoadPool(p.CAFile, log)
	if err != nil {
		t.Fatal(err)
	}
	return &TLS{Cert: kp, CA: pool}
}

// testNode is one in-process replica and what it logged.
type testNode struct {
	*Node
	reg *registry.Registry
	log *testutil.SyncBuffer
}

// openNode opens a replica; with no peers it waits to be added by a
// leader (as --join does) instead of bootstrapping a cluster of its own.
func openNode(t *testing.T, id, raftAddr string, peers []string, tl *TLS) *testNode {
	t.Helper()
	o := DefaultOptions()
	o.DataDir, o.NodeID, o.RaftAddr, o.Peers, o.TLS = t.TempDir(), id, raftAddr, peers, tl
	// Twice the defaults: a leader on a loaded 2-core box under -race
	// should not lose its lease in the middle of a test's commits.
	o.HeartbeatTimeout, o.ElectionTimeout, o.LeaderLeaseTimeout = time.Second, time.Second, 500*time.Millisecond
	if len(peers) == 0 {
		o.Join = "http://127.0.0.1:1" // never dialled: Run is not called
	}
	buf := &testutil.SyncBuffer{}
	reg := registry.New(id, 0)
	n, err := Open(o, reg, resolve, "", slog.New(slog.NewTextHandler(buf, nil)))
	if err != nil {
		t.Fatalf("open %s: %v", id, err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return &testNode{Node: n, reg: reg, log: buf}
}

// openCluster opens n replicas bootstrapped together, each with the TLS
// setup tlsOf gives it (nil: plaintext).
func openCluster(t *testing.T, n int, tlsOf func(id string) *TLS) []*testNode {
	t.Helper()
	var ids, addrs, peers []string
	for i := range n {
		id := fmt.Sprintf("cp%d", i)
		a := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
		ids, addrs, peers = append(ids, id), append(addrs, a), append(peers, id+"="+a)
	}
	var nodes []*testNode
	for i, id := range ids {
		nodes = append(nodes, openNode(t, id, addrs[i], peers, tlsOf(id)))
	}
	return nodes
}

// leaderOf waits for one node to lead and returns it.
func leaderOf(t *testing.T, nodes []*testNode) *testNode {
	t.Helper()
	var l *testNode
	testutil.WaitFor(t, 10*time.Second, "a leader", func() (bool, string) {
		for _, n := range nodes {
			if n.raft.State() == raft.Leader {
				l = n
				return true, ""
			}
		}
		return false, "no node leads"
	})
	return l
}

// commitAll commits the changes on the leader and waits until every node's
// registry holds the leader's durable state. A change refused or left in
// doubt by a leadership change (a loaded box: the leader missed its lease
// while its connections were re-made) is committed again on the next
// leader: the replicas are compared with the leader, not with a fixed state,
// so a change applied twice leaves them equal.
func commitAll(t *testing.T, nodes []*testNode) {
	t.Helper()
	for _, c := range changes(t) {
		for attempt := 1; ; attempt++ {
			l := leaderOf(t, nodes)
			_, err := l.Commit(context.Background(), c)
			if err == nil {
				break
			}
			if attempt == 5 {
				t.Fatalf("commit on %s: %v (attempt %d)", l.id, err, attempt)
			}
			t.Logf("commit on %s: %v; again on the leader", l.id, err)
		}
	}
	empty := durable(t, registry.New("empty", 0))
	testutil.WaitFor(t, 10*time.Second, "every replica to hold the leader's registry", func() (bool, string) {
		// The leader of now: a new one applies what its predecessor
		// committed before it serves, so read it afresh each time.
		l := leaderOf(t, nodes)
		want := durable(t, l.reg)
		if want == empty {
			return false, "the leader's registry (" + l.id + ") is empty after the commits"
		}
		for _, n := range nodes {
			if got := durable(t, n.reg); got != want {
				return false, n.id + " differs: " + got
			}
		}
		return true, ""
	})
}

// rawDial opens a TLS connection to a Raft port as a client presenting
// cert (nil: none), verifying the server against roots (nil: not at all),
// and returns the connection's state once the server took it: a byte that
// is no Raft RPC makes Raft close it (EOF), while a refused certificate
// surfaces as the handshake's or the first read's error (TLS 1.3 checks
// the client's certificate after the client finished).
func rawDial(addr string, cert *TLS, roots *TLS) (*tls.ConnectionState, error) {
	cfg := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}
	if roots != nil {
		cfg = roots.clientConfig(addr, "")
	}
	if cert != nil {
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert.Cert.Certificate(), nil }
	}
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte{0xff}); err != nil {
		return nil, err
	}
	var b [1]byte
	if _, err := c.Read(b[:]); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read after the handshake: %v", err)
	}
	cs := c.ConnectionState()
	return &cs, nil
}

// intruderTerm is the term an intruder's RequestVote claims: far above any
// the test's elections reach.
const intruderTerm = 1 << 40

// rpcFrom sends a Raft RPC to target through a transport with the given
// TLS (nil: plaintext), as a node of another cluster or a plaintext node
// would.
func rpcFrom(t *testing.T, tl *TLS, target string) error {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	layer := newStreamLayer(ln, addr(ln.Addr().String()), tl, handshakeTimeout, slog.New(slog.DiscardHandler))
	trans := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{Stream: layer, MaxPool: 1, Timeout: 2 * time.Second})
	defer trans.Close()
	var resp raft.RequestVoteResponse
	return trans.RequestVote("intruder", raft.ServerAddress(target), &raft.RequestVoteRequest{
		RPCHeader: raft.RPCHeader{ID: []byte("intruder"), Addr: []byte(ln.Addr().String())}, Term: intruderTerm,
	}, &resp)
}

func TestRaftTLSThreeNodesElectReplicateAndRefuseStrangers(t *testing.T) {
	pki := newRaftPKI(t, "cluster-ca")
	nodes := openCluster(t, 3, func(id string) *TLS { return pki.tlsFor(t, id, "smg:controlplane:"+id) })
	commitAll(t, nodes)
	for _, n := range nodes {
		if in, out := n.layer.refusedIn.Load(), n.layer.refusedOut.Load(); in+out != 0 {
			t.Errorf("%s refused %d in, %d out among its own peers", n.id, in, out)
		}
	}
	target := nodes[0]
	taddr := string(target.trans.LocalAddr())

	// A member's certificate of the cluster CA connects (the checks below
	// can fail).
	peer := pki.tlsFor(t, "peer", "smg:controlplane:cp1")
	if _, err := rawDial(taddr, peer, peer); err != nil {
		t.Fatalf("a certificate of the cluster CA naming a member was refused: %v", err)
	}
	other := newRaftPKI(t, "other-ca")
	for _, tc := range []struct {
		name string
		send func() error
	}{
		{"another CA's control-plane certificate", func() error {
			_, err := rawDial(taddr, other.tlsFor(t, "o", "smg:controlplane:cp0"), nil)
			return err
		}},
		{"the cluster CA's agent certificate", func() error {
			_, err := rawDial(taddr, pki.tlsFor(t, "agent", "smg:agent:gpu-1"), nil)
			return err
		}},
		{"no client certificate", func() error { _, err := rawDial(taddr, nil, nil); return err }},
		{"the cluster CA's certificate for a control plane that is no member", func() error {
			_, err := rawDial(taddr, pki.tlsFor(t, "cp9", "smg:controlplane:cp9"), nil)
			return err
		}},
		{"a Raft RPC from another CA's node", func() error { return rpcFrom(t, other.tlsFor(t, "o2", "smg:controlplane:cp1"), taddr) }},
		{"a Raft RPC from a plaintext node", func() error { return rpcFrom(t, nil, taddr) }},
	} {
		before := target.layer.refusedIn.Load()
		if err := tc.send(); err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
		testutil.WaitFor(t, 5*time.Second, tc.name+" counted as refused", func() (bool, string) {
			got := target.layer.refusedIn.Load()
			return got >= before+1, fmt.Sprintf("refused %d, want at least %d", got, before+1)
		})
	}
	if !strings.Contains(target.log.String(), "Raft TLS handshake refused") {
		t.Errorf("refusals not logged:\n%s", target.log.String())
	}
	// The intruders' RequestVote with a huge term reached no Raft: a node
	// that saw it would have taken that term.
	if got := target.raft.CurrentTerm(); got >= intruderTerm {
		t.Errorf("term %d: an intruder's RPC reached Raft", got)
	}

	// A member removed from the configuration is cut off, its certificate
	// still valid.
	l := leaderOf(t, nodes)
	var gone *testNode
	for _, n := range nodes {
		if n != l && n != target {
			gone = n
		}
	}
	if err := l.raft.RemoveServer(raft.ServerID(gone.id), 0, 5*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, gone.id+" refused once removed", func() (bool, string) {
		_, err := rawDial(taddr, gone.opts.TLS, nil)
		return err != nil && strings.Contains(target.log.String(), "is not a member of this cluster"), fmt.Sprint(err)
	})

	// A TLS node dialling a plaintext one is refused on its side too.
	plain := openNode(t, "plain", "127.0.0.1:0", nil, nil)
	if _, err := target.layer.dial(string(plain.trans.LocalAddr()), "", 2*time.Second); !errors.Is(err, errUntrusted) {
		t.Errorf("dialling a plaintext Raft port: %v, want a refused handshake", err)
	}
}

func TestRaftJoinNeedsTheClusterCertificate(t *testing.T) {
	pki := newRaftPKI(t, "cluster-ca")
	nodes := openCluster(t, 1, func(id string) *TLS { return pki.tlsFor(t, id, "smg:controlplane:"+id) })
	l := leaderOf(t, nodes)
	other := newRaftPKI(t, "other-ca")
	for _, tc := range []struct {
		name, id string
		tls      *TLS
	}{
		{"another CA", "cp1", other.tlsFor(t, "o", "smg:controlplane:cp1")},
		{"a certificate naming another node", "cp1", pki.tlsFor(t, "cp9", "smg:controlplane:cp9")},
		{"an agent certificate", "cp1", pki.tlsFor(t, "ag", "smg:agent:cp1")},
		{"plaintext", "cp1", nil},
	} {
		cand := openNode(t, tc.id, "127.0.0.1:0", nil, tc.tls)
		code, msg := l.join(JoinRequest{Member: Member{ID: tc.id}, RaftAddr: string(cand.trans.LocalAddr())})
		if code != http.StatusForbidden || !strings.Contains(msg, "smg:controlplane:cp1") {
			t.Errorf("%s: join answered %d %q, want 403 naming the certificate wanted", tc.name, code, msg)
		}
		if got := len(l.raft.GetConfiguration().Configuration().Servers); got != 1 {
			t.Fatalf("%s: the configuration has %d servers after a refused join", tc.name, got)
		}
		_ = cand.Close()
	}
	// The real thing joins and replicates.
	good := openNode(t, "cp1", "127.0.0.1:0", nil, pki.tlsFor(t, "cp1", "smg:controlplane:cp1"))
	if code, msg := l.join(JoinRequest{Member: Member{ID: "cp1"}, RaftAddr: string(good.trans.LocalAddr())}); code != http.StatusOK {
		t.Fatalf("join of a node with the cluster's certificate: %d %s", code, msg)
	}
	testutil.WaitFor(t, 10*time.Second, "cp1 to follow cp0", func() (bool, string) {
		_, leader := good.raft.LeaderWithID()
		return leader == "cp0" && good.raft.AppliedIndex() >= l.raft.AppliedIndex(), fmt.Sprintf("cp1 follows %q at %d", leader, good.raft.AppliedIndex())
	})
	commitAll(t, []*testNode{l, good})
}

// Rotating a node's certificate, or the cluster's CA, takes effect on the
// next handshake, and the cluster keeps replicating through it.
func TestRaftTLSRotation(t *testing.T) {
	pki := newRaftPKI(t, "cluster-ca")
	tlsOf := map[string]*TLS{}
	nodes := openCluster(t, 3, func(id string) *TLS {
		tlsOf[id] = pki.tlsFor(t, id, "smg:controlplane:"+id)
		return tlsOf[id]
	})
	leaderOf(t, nodes)
	n0 := nodes[0]
	addr0 := string(n0.trans.LocalAddr())
	probe := pki.tlsFor(t, "probe", "smg:controlplane:cp1")

	// A new certificate for cp0, written over its files.
	old := tlsutil.Fingerprint(tlsOf["cp0"].Cert.Leaf())
	pki.Issue("cp0", "smg:controlplane:cp0")
	if err := tlsOf["cp0"].Cert.Reload(); err != nil {
		t.Fatal(err)
	}
	cs, err := rawDial(addr0, probe, probe)
	if err != nil {
		t.Fatal(err)
	}
	if got := tlsutil.Fingerprint(cs.PeerCertificates[0]); got == old || got != tlsutil.Fingerprint(tlsOf["cp0"].Cert.Leaf()) {
		t.Errorf("after the reload cp0 serves %s, want the new certificate (old %s)", got, old)
	}

	// A new CA: trusted once every bundle holds it.
	next := newRaftPKI(t, "next-ca")
	fromNext := next.tlsFor(t, "n", "smg:controlplane:cp2")
	if _, err := rawDial(addr0, fromNext, nil); err == nil {
		t.Fatal("a certificate of a CA not yet in the bundle was accepted")
	}
	bundle := append(append([]byte{}, pki.CA.CertPEM...), next.CA.CertPEM...)
	if err := os.WriteFile(pki.CAFile+".tmp", bundle, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(pki.CAFile+".tmp", pki.CAFile); err != nil {
		t.Fatal(err)
	}
	for _, tl := range tlsOf {
		if err := tl.CA.Reload(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := rawDial(addr0, fromNext, nil); err != nil {
		t.Errorf("a certificate of the CA added to the bundle was refused: %v", err)
	}
	// Replication goes on, over new connections too: close the pooled ones.
	for _, n := range nodes {
		n.trans.CloseStreams()
	}
	commitAll(t, nodes)
}

// A connection that opens the Raft port and says nothing is dropped after
// the handshake timeout, counted as refused, and holds nothing after.
func TestRaftTLSSilentConnectionDropped(t *testing.T) {
	pki := newRaftPKI(t, "cluster-ca")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	layer := newStreamLayer(ln, addr(ln.Addr().String()), pki.tlsFor(t, "cp0", "smg:controlplane:cp0"), 100*time.Millisecond, slog.New(slog.DiscardHandler))
	defer layer.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var b [1]byte
	if _, err := c.Read(b[:]); !errors.Is(err, io.EOF) {
		t.Fatalf("a silent connection: read %v, want the server to close it", err)
	}
	testutil.WaitFor(t, 5*time.Second, "the silent connection counted", func() (bool, string) {
		return layer.refusedIn.Load() == 1, fmt.Sprint(layer.refusedIn.Load())
	})
}
