// Package cluster replicates the control plane's durable intent (worker
// registrations, updates, deletions and registration outcomes) with
// hashicorp/raft, its log and stable store in bbolt (raft-boltdb) and its
// snapshots in files, all under --data-dir. Loads, evidence, verdicts and
// shares are not replicated: they are the leader's soft state, rebuilt from
// agents and polls after a handover.
//
// A node knows when it leads, which node leads and where to reach it, so
// that followers forward admin calls to the leader and answer watch and
// agent streams with the leader's address.
//
// It owns the Raft node, its transport and stores and the apply of committed
// admin writes; it never replicates or touches soft state.
package cluster

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/smg-project/smg/internal/cli"
	"github.com/smg-project/smg/internal/tlsutil"
)

// Options configure a replicated control plane; AddFlags describes each
// flag's field. With no DataDir the control plane keeps its registry in
// memory and none of the rest applies.
type Options struct {
	DataDir            string
	NodeID             string
	RaftAddr           string
	RaftAdvertise      string
	Peers              cli.List // --raft-peers
	Join               string
	AdvertiseHost      string
	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	// LeaderWait bounds how long a call waits for a leader to be known (an
	// election on loopback takes 0.7-2 s) before it is refused NO_LEADER.
	LeaderWait time.Duration
	// TLS secures the Raft transport and proves a joining node's identity
	// (nil: plaintext).
	TLS *TLS
	// Route says how this replica serves each gRPC method (a full method
	// name): Unary and Stream route by it.
	Route func(method string) Route
	// PeerCreds dial the leader's gRPC port to forward admin calls (the
	// control plane's own TLS, when it serves TLS); nil: plaintext.
	PeerCreds credentials.TransportCredentials
	// PeerHTTPTLS, when set, reaches the other members' HTTP ports over
	// https, verified so (joins, membership changes a follower hands on):
	// the control plane serves its HTTP port over TLS. nil: http.
	PeerHTTPTLS *tlsutil.ClientOptions
}

// DefaultOptions returns the defaults: a new leader within about 1.5 s of
// the old one's loss on loopback. The lease is the heartbeat timeout (its
// maximum): a shorter one made a leader on a CPU-starved node step down on
// a 300 ms scheduling stall, with an election and a new watch epoch for
// nothing.
func DefaultOptions() Options {
	const timeout = 500 * time.Millisecond
	return Options{RaftAddr: "127.0.0.1:30003", HeartbeatTimeout: timeout, ElectionTimeout: timeout, LeaderLeaseTimeout: timeout,
		LeaderWait: 2 * time.Second}
}

// AddFlags registers the flags on fs.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.DataDir, "data-dir", o.DataDir, "directory of the durable registry (Raft log, stable store and snapshots); empty: registry in memory, lost at restart")
	fs.StringVar(&o.NodeID, "node-id", o.NodeID, "this control plane's Raft node id (default: the host name); with --data-dir")
	fs.StringVar(&o.RaftAddr, "raft-addr", o.RaftAddr, "HOST:PORT the Raft transport listens on; with --data-dir")
	fs.StringVar(&o.RaftAdvertise, "raft-advertise", o.RaftAdvertise, "HOST:PORT the other nodes reach this node's Raft transport at (default: --raft-addr)")
	fs.Var(&o.Peers, "raft-peers", "the first cluster: ID=HOST:PORT of every voter, this node included, space- or comma-separated; bootstraps an empty --data-dir once (none and no --join: a cluster of one)")
	fs.StringVar(&o.Join, "join", o.Join, "HTTP URL of a running member (e.g. http://cp-0:30001, https:// when the members serve TLS): join its cluster instead of bootstrapping")
	fs.StringVar(&o.AdvertiseHost, "advertise-host", o.AdvertiseHost, "host routers, agents and the other nodes reach this node's gRPC and HTTP ports at (default: the host of --raft-advertise)")
	fs.DurationVar(&o.HeartbeatTimeout, "raft-heartbeat-timeout", o.HeartbeatTimeout, "time without the leader after which a follower starts an election")
	fs.DurationVar(&o.ElectionTimeout, "raft-election-timeout", o.ElectionTimeout, "time a candidate waits for votes before a new election")
	fs.DurationVar(&o.LeaderLeaseTimeout, "raft-leader-lease-timeout", o.LeaderLeaseTimeout, "time a leader without contact to a quorum keeps leading (<= the heartbeat timeout)")
}

// Enabled reports whether the registry is replicated (a data dir is set).
func (o Options) Enabled() bool { return o.DataDir != "" }

// Validate reports the first invalid option.
func (o Options) Validate() error {
	if !o.Enabled() {
		if len(o.Peers) > 0 || o.Join != "" {
			return errors.New("--raft-peers and --join need --data-dir")
		}
		return nil
	}
	if _, _, err := net.SplitHostPort(o.RaftAddr); err != nil {
		return fmt.Errorf("--raft-addr %q: %v", o.RaftAddr, err)
	}
	if o.RaftAdvertise != "" {
		if host, _, err := net.SplitHostPort(o.RaftAdvertise); err != nil || host == "" || net.ParseIP(host).IsUnspecified() {
			return fmt.Errorf("--raft-advertise %q must be HOST:PORT that other nodes can dial", o.RaftAdvertise)
		}
	}
	if o.HeartbeatTimeout < 5*time.Millisecond || o.ElectionTimeout < 5*time.Millisecond {
		return errors.New("--raft-heartbeat-timeout and --raft-election-timeout must be at least 5ms")
	}
	if o.LeaderLeaseTimeout <= 0 || o.LeaderLeaseTimeout > o.HeartbeatTimeout {
		return fmt.Errorf("--raft-leader-lease-timeout must be positive and at most --raft-heartbeat-timeout (%s), got %s", o.HeartbeatTimeout, o.LeaderLeaseTimeout)
	}
	if len(o.Peers) > 0 && o.Join != "" {
		return errors.New("--raft-peers bootstraps a new cluster and --join joins a running one: give one of them")
	}
	peers, err := ParsePeers(o.Peers)
	if err != nil {
		return err
	}
	if len(peers) > 0 {
		id := o.nodeID()
		addr, ok := peers[id]
		if !ok {
			return fmt.Errorf("--raft-peers does not list this node (--node-id %s)", id)
		}
		if addr != o.advertise() {
			return fmt.Errorf("--raft-peers lists node %s at %s, but this node's Raft address is %s", id, addr, o.advertise())
		}
	}
	return nil
}

// ParsePeers reads ID=HOST:PORT entries; ids and addresses must be unique.
func ParsePeers(list []string) (map[string]string, error) {
	peers := map[string]string{}
	addrs := map[string]string{}
	for _, item := range list {
		for p := range strings.SplitSeq(item, ",") {
			id, addr, ok := strings.Cut(p, "=")
			if !ok || id == "" {
				return nil, fmt.Errorf("--raft-peers %q: want ID=HOST:PORT", p)
			}
			if host, _, err := net.SplitHostPort(addr); err != nil || host == "" {
				return nil, fmt.Errorf("--raft-peers %q: address must be HOST:PORT", p)
			}
			if _, dup := peers[id]; dup {
				return nil, fmt.Errorf("--raft-peers names node %s twice", id)
			}
			if other, dup := addrs[addr]; dup {
				return nil, fmt.Errorf("--raft-peers gives nodes %s and %s the same address %s", other, id, addr)
			}
			peers[id], addrs[addr] = addr, id
		}
	}
	return peers, nil
}

func (o Options) nodeID() string {
	h, _ := os.Hostname() // "" when unknown
	return cmp.Or(o.NodeID, h, "node")
}

func (o Options) advertise() string { return cmp.Or(o.RaftAdvertise, o.RaftAddr) }
