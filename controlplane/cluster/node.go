package cluster

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"
	"google.golang.org/grpc"

	"github.com/smg-project/smg/controlplane/admin"
	"github.com/smg-project/smg/controlplane/registry"
	"github.com/smg-project/smg/internal/tlsutil"
)

// Leader is what a node runs while it leads.
type Leader interface {
	// Prepare readies the replica to lead in term (its soft state, its
	// epoch) before it takes any stream.
	Prepare(term uint64)
	// Lead runs the leader's loops until ctx ends (leadership lost).
	Lead(ctx context.Context)
}

// Node is one replica of the control plane's registry.
type Node struct {
	opts  Options
	id    string
	log   *slog.Logger
	raft  *raft.Raft
	fsm   *fsm
	store *raftboltdb.BoltStore
	trans *raft.NetworkTransport
	layer *streamLayer

	notify     chan bool
	observed   chan raft.Observation
	adminKey   string
	peerHTTP   *http.Client                // to the other members' HTTP ports
	peerScheme string                      // how they are reached: http or https
	conns      map[string]*grpc.ClientConn // to the leaders' gRPC ports (calls handed on), under mu

	mu        sync.Mutex
	self      Member
	leadCtx   context.Context // while leading, Prepare done (streams and writes are taken); ends when leadership does
	changes   atomic.Int64    // leader changes seen (metrics)
	closeOnce sync.Once
	shutdown  chan struct{}
}

// nodeFile records which node a data dir belongs to.
type nodeFile struct {
	NodeID string `json:"node_id"`
}

const (
	applyTimeout = 5 * time.Second // an admin write's or membership change's wait for its commit
	nodeFileName = "node.json"
	logFileName  = "raft.db"
)

// Open opens (or creates) the node's data dir and starts its Raft instance,
// which applies changes to reg, resolving thresholds as the admin API does.
func Open(opts Options, reg *registry.Registry, resolve admin.ThresholdResolver, adminKey string, log *slog.Logger) (*Node, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	n := &Node{opts: opts, id: opts.nodeID(), log: log, fsm: newFSM(reg, resolve), adminKey: adminKey,
		notify: make(chan bool, 16), observed: make(chan raft.Observation, 16), shutdown: make(chan struct{}), conns: map[string]*grpc.ClientConn{}}
	pt := &http.Transport{IdleConnTimeout: 90 * time.Second}
	n.peerScheme = "http"
	if opts.PeerHTTPTLS != nil {
		pt.DialTLSContext = tlsutil.DialTLSContext(*opts.PeerHTTPTLS)
		n.peerScheme = "https"
	}
	n.peerHTTP = &http.Client{Timeout: 5 * time.Second, Transport: pt}
	if err := n.claimDataDir(); err != nil {
		return nil, err
	}
	dir := opts.DataDir
	store, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, logFileName), BoltOptions: &bbolt.Options{Timeout: time.Second}})
	if err != nil {
		return nil, fmt.Errorf("--data-dir %s: cannot open %s (corrupt, not a Raft log, or in use by another control plane): %v", dir, logFileName, err)
	}
	n.store = store
	fail := func(err error) (*Node, error) {
		if n.raft != nil {
			_ = n.raft.Shutdown().Error()
		}
		if n.trans != nil {
			_ = n.trans.Close()
		}
		_ = store.Close()
		return nil, err
	}
	hlog := hclog.New(&hclog.LoggerOptions{Name: "raft", Level: hclog.Warn, Output: slog.NewLogLogger(log.Handler(), slog.LevelWarn).Writer(), DisableTime: true})
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, 2, hlog)
	if err != nil {
		return fail(fmt.Errorf("--data-dir %s: snapshots: %v", dir, err))
	}
	cache, err := raft.NewLogCache(512, store)
	if err != nil {
		return fail(err)
	}
	ln, err := net.Listen("tcp", opts.RaftAddr)
	if err != nil {
		return fail(fmt.Errorf("--raft-addr %s: %v", opts.RaftAddr, err))
	}
	advertise := opts.advertise()
	if host, port, _ := net.SplitHostPort(advertise); port == "0" {
		_, p, _ := net.SplitHostPort(ln.Addr().String())
		advertise = net.JoinHostPort(host, p)
	}
	n.layer = newStreamLayer(ln, addr(advertise), opts.TLS, handshakeTimeout, log)
	n.trans = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{Stream: n.layer, MaxPool: 3, Timeout: 2 * time.Second, Logger: hlog})

	conf := raft.DefaultConfig()
	conf.LocalID = raft.ServerID(n.id)
	conf.HeartbeatTimeout = opts.HeartbeatTimeout
	conf.ElectionTimeout = opts.ElectionTimeout
	conf.LeaderLeaseTimeout = opts.LeaderLeaseTimeout
	conf.CommitTimeout = 20 * time.Millisecond
	conf.SnapshotThreshold = 1024 // log entries
	conf.SnapshotInterval = 30 * time.Second
	conf.NotifyCh = n.notify
	conf.Logger = hlog

	existing, err := raft.HasExistingState(cache, store, snaps)
	if err != nil {
		return fail(fmt.Errorf("--data-dir %s: %v", dir, err))
	}
	peers, _ := ParsePeers(opts.Peers)
	if !existing && opts.Join == "" {
		cfg := raft.Configuration{}
		if len(peers) == 0 {
			peers = map[string]string{n.id: advertise}
		}
		for id, a := range peers {
			cfg.Servers = append(cfg.Servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(id), Address: raft.ServerAddress(a)})
		}
		if err := raft.BootstrapCluster(conf, cache, store, snaps, n.trans, cfg); err != nil {
			return fail(fmt.Errorf("bootstrap: %v", err))
		}
		log.Info("Bootstrapped a new cluster", "node_id", n.id, "voters", len(cfg.Servers))
	}
	r, err := raft.NewRaft(conf, n.fsm, cache, store, snaps, n.trans)
	if err != nil {
		return fail(fmt.Errorf("--data-dir %s: %v", dir, err))
	}
	n.raft = r
	members := func() map[string]string { m, _ := n.configuration(); return m }
	n.layer.members.Store(&members)
	if existing {
		if err := n.checkPeers(peers); err != nil {
			return fail(err)
		}
	}
	n.warnPlaintext(peers)
	r.RegisterObserver(raft.NewObserver(n.observed, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	}))
	go n.logLeaders()
	return n, nil
}

// claimDataDir makes sure the data dir is this node's: a dir written for
// another node id, or holding a log smg did not write, is refused.
func (n *Node) claimDataDir() error {
	dir := n.opts.DataDir
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("--data-dir %s: %v", dir, err)
	}
	b, err := os.ReadFile(filepath.Join(dir, nodeFileName))
	switch {
	case err == nil:
		var f nodeFile
		if err := json.Unmarshal(b, &f); err != nil || f.NodeID == "" {
			return fmt.Errorf("--data-dir %s: %s is corrupt (%v); it names the node that owns the directory", dir, nodeFileName, err)
		}
		if f.NodeID != n.id {
			return fmt.Errorf("--data-dir %s belongs to node %q, not to this node (--node-id %s): give each node its own directory", dir, f.NodeID, n.id)
		}
		return nil
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("--data-dir %s: %v", dir, err)
	}
	if _, err := os.Stat(filepath.Join(dir, logFileName)); err == nil {
		return fmt.Errorf("--data-dir %s holds a %s without %s: not a directory this control plane wrote", dir, logFileName, nodeFileName)
	}
	b, _ = json.Marshal(nodeFile{NodeID: n.id})
	tmp := filepath.Join(dir, nodeFileName+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("--data-dir %s: %v", dir, err)
	}
	return os.Rename(tmp, filepath.Join(dir, nodeFileName))
}

// checkPeers compares --raft-peers with the stored configuration: every
// listed node must be a member at the listed address. Members that joined
// later are fine.
func (n *Node) checkPeers(peers map[string]string) error {
	stored, err := n.configuration()
	if err != nil {
		return err
	}
	if len(stored) > 0 {
		if _, ok := stored[n.id]; !ok {
			return fmt.Errorf("--data-dir %s: this node (%s) is not a member of the stored cluster configuration (%s)", n.opts.DataDir, n.id, formatPeers(stored))
		}
	}
	for id, a := range peers {
		if got, ok := stored[id]; !ok || got != a {
			return fmt.Errorf("--raft-peers disagrees with the configuration stored in --data-dir %s: it lists %s=%s, the stored one is %s; the flag only bootstraps an empty dir: fix it or change membership through the leader", n.opts.DataDir, id, a, formatPeers(stored))
		}
	}
	return nil
}

// configuration is the latest configuration: node id -> Raft address.
func (n *Node) configuration() (map[string]string, error) {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, s := range f.Configuration().Servers {
		m[string(s.ID)] = string(s.Address)
	}
	return m, nil
}

// warnPlaintext says once, at start, that Raft runs in the clear when this
// node has (or will have) peers and no --raft-tls-* files.
func (n *Node) warnPlaintext(peers map[string]string) {
	if n.opts.TLS != nil {
		return
	}
	if stored, _ := n.configuration(); len(peers) > 1 || n.opts.Join != "" || len(stored) > 1 {
		n.log.Warn("Raft traffic is plaintext: anyone who reaches the Raft port can read the registry or inject Raft RPCs (set --raft-tls-cert-file, --raft-tls-key-file and --raft-tls-ca-file; docs/ha.md#raft-security)",
			"raft_addr", n.opts.RaftAddr)
	}
}

func formatPeers(m map[string]string) string {
	var parts []string
	for id, a := range m {
		parts = append(parts, id+"="+a)
	}
	if len(parts) == 0 {
		return "empty"
	}
	return strings.Join(parts, " ")
}

// ID is this node's id.
func (n *Node) ID() string { return n.id }

// Advertise sets how this node is reached (its gRPC and HTTP HOST:PORT,
// with the host from --advertise-host).
func (n *Node) Advertise(grpcPort, httpPort string) {
	host, _, _ := net.SplitHostPort(n.opts.advertise())
	host = cmp.Or(n.opts.AdvertiseHost, host)
	n.mu.Lock()
	n.self = Member{ID: n.id, GRPC: net.JoinHostPort(host, grpcPort), HTTP: net.JoinHostPort(host, httpPort)}
	n.mu.Unlock()
}

// Run follows leadership until ctx ends: Prepare and Lead while this node
// leads; it keeps its addresses known to the cluster (joining it with --join).
func (n *Node) Run(ctx context.Context, l Leader) error {
	errc := make(chan error, 1)
	go func() { errc <- n.announce(ctx) }()
	var end func() // the current term's loops: cancel and wait for them
	stop := func() {
		if end == nil {
			return
		}
		n.mu.Lock()
		n.leadCtx = nil
		n.mu.Unlock()
		end()
		end = nil
	}
	defer stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			if err != nil {
				return err
			}
			errc = nil
		case lead := <-n.notify:
			stop()
			if !lead {
				n.log.Warn("This control plane is no longer the leader: its loops stop, streams move to the new leader")
				continue
			}
			// Every entry committed by earlier terms is applied before
			// this node judges anything.
			if err := n.raft.Barrier(applyTimeout).Error(); err != nil {
				n.log.Warn("Leadership not taken up: barrier failed", "error", err)
				continue
			}
			term := n.raft.CurrentTerm()
			l.Prepare(term)
			lctx, cancel := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() { defer close(done); l.Lead(lctx) }()
			end = func() { cancel(); <-done }
			n.mu.Lock()
			n.leadCtx = lctx
			n.mu.Unlock()
			n.log.Info("This control plane is the leader", "node_id", n.id, "term", term)
		}
	}
}

// Leading reports whether this node leads and has taken up its duties, with
// a context that ends when it stops leading.
func (n *Node) Leading() (context.Context, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.leadCtx, n.leadCtx != nil
}

// awaitLeader waits, within ctx and at most Options.LeaderWait, until
// Ready: right after a start or an election Raft may have no leader yet, or
// this node is still in Prepare, and a call would find no one to answer it.
func (n *Node) awaitLeader(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, n.opts.LeaderWait)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond) // leader changes and announcements land in the log, which signals nothing
	defer tick.Stop()
	for !n.Ready() {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
	}
}

// Ready reports whether writes are taken: this node leads with its duties
// taken up, or another member leads, its addresses known, and this one can
// hand writes to it.
func (n *Node) Ready() bool {
	if _, ok := n.Leading(); ok {
		return true
	}
	lm, ok := n.LeaderMember()
	return ok && lm.ID != n.id
}

// LeaderMember returns the current leader's addresses, if a leader is known
// and has announced them.
func (n *Node) LeaderMember() (Member, bool) {
	_, id := n.raft.LeaderWithID()
	if id == "" {
		return Member{}, false
	}
	if string(id) == n.id {
		n.mu.Lock()
		defer n.mu.Unlock()
		return n.self, n.self.GRPC != ""
	}
	return n.fsm.member(string(id))
}

// Commit replicates an admin change and returns its outcome on this
// leader. Without leadership the change is refused (never half-written):
// 503 with Retry-After.
func (n *Node) Commit(ctx context.Context, c *admin.Change) (*registry.Worker, error) {
	b, err := json.Marshal(entry{Change: c})
	if err != nil {
		return nil, err
	}
	timeout := applyTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl))
	}
	f := n.raft.Apply(b, timeout)
	if err := f.Error(); err != nil {
		return nil, applyError(err)
	}
	r, _ := f.Response().(result)
	return r.old, r.err
}

// applyError turns a Raft apply failure into the admin API's answer: a
// write that never entered the log is refused; one that did may still
// commit under the next leader, and the answer says so.
func applyError(err error) error {
	switch {
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrEnqueueTimeout), errors.Is(err, raft.ErrRaftShutdown):
		return admin.ErrNoLeader("this control plane is not the leader and the write was not made (" + err.Error() + "); retry")
	default:
		return admin.ErrOutcomeUnknown("leadership changed while the write was being committed (" + err.Error() + "): it may or may not be stored; read it back before retrying")
	}
}

func (n *Node) apply(e entry) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	return n.raft.Apply(b, applyTimeout).Error()
}

// logLeaders logs every leader change.
func (n *Node) logLeaders() {
	for {
		select {
		case <-n.shutdown:
			return
		case o := <-n.observed:
			lo, _ := o.Data.(raft.LeaderObservation)
			n.changes.Add(1)
			if lo.LeaderID == "" {
				n.log.Warn("Raft: no leader", "node_id", n.id, "term", n.raft.CurrentTerm())
				continue
			}
			n.log.Info("Raft: leader changed", "leader", string(lo.LeaderID), "leader_raft_addr", string(lo.LeaderAddr), "term", n.raft.CurrentTerm(), "node_id", n.id)
		}
	}
}

// Close stops Raft and closes the data dir.
func (n *Node) Close() (err error) {
	n.closeOnce.Do(func() {
		close(n.shutdown)
		err = n.raft.Shutdown().Error()
		_ = n.trans.Close()
		n.peerHTTP.CloseIdleConnections()
		n.mu.Lock()
		for _, c := range n.conns {
			_ = c.Close()
		}
		n.mu.Unlock()
		err = errors.Join(err, n.store.Close())
	})
	return err
}

// Handover hands leadership to another voter before this node stops (a
// rolling upgrade, a drain), so the cluster does not wait out an election
// timeout. Bounded; a node that does not lead does nothing.
func (n *Node) Handover() {
	if n.raft.State() != raft.Leader {
		return
	}
	if m, err := n.configuration(); err != nil || len(m) < 2 {
		return
	}
	// Raft gives the transfer up within twice its election timeout.
	if err := n.raft.LeadershipTransfer().Error(); err != nil {
		n.log.Warn("Leadership transfer before stopping failed; the others elect a leader after their timeout", "error", err)
	} else {
		n.log.Info("Leadership handed over before stopping")
	}
}
