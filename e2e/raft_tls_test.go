package e2e

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/smg-project/smg/internal/tlsutil"
)

// joiner starts a control plane joining the cluster through base with the
// given extra flags.
func joiner(t *testing.T, id, base string, extra ...string) *haNode {
	t.Helper()
	return startReplica(t, id, admin{}, append([]string{"--join", base}, extra...)...)
}

// startReplica starts a control plane with its own ports and data dir; its
// admin API is reached with a (whose base is set here; https when a has a
// client).
func startReplica(t *testing.T, id string, a admin, extra ...string) *haNode {
	t.Helper()
	nd := &haNode{id: id, http: freePort(t), grpc: freePort(t), raft: freePort(t), dir: filepath.Join(t.TempDir(), id)}
	scheme := "http"
	if a.client != nil {
		scheme = "https"
	}
	nd.admin = a
	nd.admin.base = fmt.Sprintf("%s://127.0.0.1:%d", scheme, nd.http)
	nd.args = append([]string{"controlplane", "--port", strconv.Itoa(nd.http), "--grpc-port", strconv.Itoa(nd.grpc),
		"--data-dir", nd.dir, "--node-id", nd.id, "--raft-addr", fmt.Sprintf("127.0.0.1:%d", nd.raft)}, extra...)
	nd.proc = startSMG(t, id, nd.args...)
	return nd
}

// exitsWith waits for a process to exit and checks its log names want.
func exitsWith(t *testing.T, nd *haNode, want string) {
	t.Helper()
	select {
	case <-nd.proc.exited:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s kept running; want it to exit naming %q:\n%s", nd.id, want, tail(nd.proc.stderr.String(), 2000))
	}
	if out := nd.proc.stderr.String(); !strings.Contains(out, want) {
		t.Errorf("%s exited without naming %q:\n%s", nd.id, want, tail(out, 2000))
	}
}

// Three real control planes whose Raft runs over mutual TLS elect a leader
// and replicate a registration; a node with another CA's certificate, or
// none, cannot join (it exits with the reason, the leader logs and counts
// the refusal, the membership does not change); a node with the cluster
// CA's certificate joins and holds the registration.
func TestRaftTLSClusterReplicatesAndRefusesStrangers(t *testing.T) {
	p := newPKI(t, "raft-ca")
	// One certificate for every replica, as a StatefulSet mounts it.
	shared, sharedKey, _ := p.issue("replicas", "smg:controlplane:*")
	c := startHACluster(t, 3, "--raft-tls-cert-file", shared, "--raft-tls-key-file", sharedKey, "--raft-tls-ca-file", p.caFile)
	l := c.leader(20 * time.Second)
	var follower *haNode
	for _, nd := range c.nodes {
		if nd != l {
			follower = nd
		}
	}
	// Members announce their addresses through Raft: a follower forwards
	// admin writes once it knows the leader's.
	waitFor(t, 20*time.Second, "every replica to know every member's addresses", func() (bool, string) {
		for _, nd := range c.nodes {
			v, err := nd.view()
			if err != nil {
				return false, err.Error()
			}
			for _, m := range v.Members {
				if m.GRPC == "" {
					return false, fmt.Sprintf("%s does not know %s's addresses", nd.id, m.ID)
				}
			}
		}
		return true, ""
	})
	eng := fakeEngines(t)
	id := registerRetrying(t, follower.admin, eng.URL+"/tls")
	replicated := func(nodes ...*haNode) func() (bool, string) {
		return func() (bool, string) {
			for _, nd := range nodes {
				states, err := jobStates(nd.admin, true)
				if err != nil {
					return false, nd.id + ": " + err.Error()
				}
				if states[id] != "done" {
					return false, fmt.Sprintf("%s: worker %s is %q", nd.id, id, states[id])
				}
			}
			return true, ""
		}
	}
	waitFor(t, 20*time.Second, "the registration done on every replica", replicated(c.nodes...))
	for _, nd := range c.nodes {
		if strings.Contains(nd.proc.stderr.String(), "Raft traffic is plaintext") {
			t.Errorf("%s warns of plaintext Raft with --raft-tls-* set", nd.id)
		}
	}

	other := newPKI(t, "other-ca")
	oc, ok, _ := other.issue("stranger", "smg:controlplane:cp3")
	stranger := joiner(t, "cp3", l.admin.base, "--raft-tls-cert-file", oc, "--raft-tls-key-file", ok, "--raft-tls-ca-file", other.caFile)
	exitsWith(t, stranger, "did not present a certificate from the cluster's Raft CA")
	plain := joiner(t, "cp3", l.admin.base)
	exitsWith(t, plain, "did not present a certificate from the cluster's Raft CA")
	if !strings.Contains(plain.proc.stderr.String(), "Raft traffic is plaintext") {
		t.Errorf("a plaintext node with --join did not warn:\n%s", tail(plain.proc.stderr.String(), 1500))
	}
	// Whichever replica led when each join arrived (leadership may move on
	// a loaded box) refused it, logged it and counted its refused dial.
	logged, refused := 0, 0.0
	for _, nd := range c.nodes {
		logged += strings.Count(nd.proc.stderr.String(), "Join refused")
		code, metrics, err := nd.admin.do("GET", "/metrics", nil)
		if err != nil || code != 200 {
			t.Fatal(nd.id, code, err)
		}
		for _, line := range strings.Split(string(metrics), "\n") {
			if v, ok := strings.CutPrefix(line, `smg_controlplane_raft_tls_refused_total{direction="out"} `); ok {
				f, _ := strconv.ParseFloat(v, 64)
				refused += f
			}
		}
	}
	if logged != 2 || refused != 2 {
		t.Errorf("the replicas logged %d refused joins and counted %v refused dials, want 2 and 2", logged, refused)
	}
	if v, err := l.view(); err != nil || len(v.Members) != 3 {
		t.Fatalf("members after refused joins: %+v %v, want the 3", v, err)
	}

	gc, gk, _ := p.issue("cp3", "smg:controlplane:cp3")
	good := joiner(t, "cp3", follower.admin.base, "--raft-tls-cert-file", gc, "--raft-tls-key-file", gk, "--raft-tls-ca-file", p.caFile)
	waitHTTP200(t, good.proc, good.admin.base+"/health")
	waitFor(t, 20*time.Second, "the node with the cluster's certificate to join and hold the registration", func() (bool, string) {
		v, err := l.view()
		if err != nil || len(v.Members) != 4 {
			return false, fmt.Sprintf("%+v %v", v, err)
		}
		return replicated(good)()
	})
}

// Every port of the control planes over TLS, the HTTP port included: a node
// joins through the leader and another through a follower (which hands the
// join to the leader) over https, presenting the one certificate each node
// uses for everything; a registration made through a follower is on all
// three.
func TestRaftTLSJoinOverHTTPS(t *testing.T) {
	p := newPKI(t, "cluster-ca")
	a := admin{client: p.httpClient()}
	files := map[string][2]string{}
	flags := func(id string) []string {
		c, k, _ := p.issue(id, "smg:controlplane:"+id)
		files[id] = [2]string{c, k}
		return []string{"--tls-cert-file", c, "--tls-key-file", k, "--tls-client-ca-file", p.caFile,
			"--raft-tls-cert-file", c, "--raft-tls-key-file", k, "--raft-tls-ca-file", p.caFile}
	}
	healthy := func(nd *haNode) {
		t.Helper()
		waitFor(t, 20*time.Second, nd.id+" serving https", func() (bool, string) {
			if nd.proc.exitedEarly() {
				t.Fatalf("%s exited: %s", nd.id, tail(nd.proc.stderr.String(), 3000))
			}
			code, _, err := nd.admin.do("GET", "/health", nil)
			return err == nil && code == 200, fmt.Sprint(code, err)
		})
	}
	first := startReplica(t, "cp0", a, flags("cp0")...)
	healthy(first)
	second := startReplica(t, "cp1", a, append(flags("cp1"), "--join", first.admin.base)...)
	healthy(second)
	waitFor(t, 20*time.Second, "cp1 to be a member with its addresses", func() (bool, string) {
		v, err := first.view()
		return err == nil && len(v.Members) == 2 && v.Members[0].GRPC != "" && v.Members[1].GRPC != "", fmt.Sprintf("%+v %v", v, err)
	})
	third := startReplica(t, "cp2", a, append(flags("cp2"), "--join", second.admin.base)...)
	healthy(third)
	nodes := []*haNode{first, second, third}
	waitFor(t, 20*time.Second, "three members, every one known with its addresses on every node", func() (bool, string) {
		for _, nd := range nodes {
			v, err := nd.view()
			if err != nil || len(v.Members) != 3 {
				return false, fmt.Sprintf("%s: %+v %v", nd.id, v, err)
			}
			for _, m := range v.Members {
				if m.GRPC == "" {
					return false, nd.id + " lacks " + m.ID + "'s addresses"
				}
			}
		}
		return true, ""
	})
	eng := fakeEngines(t)
	id := registerRetrying(t, third.admin, eng.URL+"/https")
	everywhere := func(id string) {
		t.Helper()
		waitFor(t, 20*time.Second, "registration "+id+" done in every node's own replica", func() (bool, string) {
			for _, nd := range nodes {
				states, err := jobStates(nd.admin, true)
				if err != nil || states[id] != "done" {
					return false, fmt.Sprintf("%s: %q %v", nd.id, states[id], err)
				}
			}
			return true, ""
		})
	}
	everywhere(id)

	// Rotation: cp0's files get a new certificate; its Raft port serves it
	// within a reload (the process watches the --raft-tls-* files), and
	// the cluster keeps replicating.
	pair, err := tls.LoadX509KeyPair(files["cp1"][0], files["cp1"][1])
	if err != nil {
		t.Fatal(err)
	}
	raftAddr := fmt.Sprintf("127.0.0.1:%d", first.raft)
	old := serverFingerprint(t, raftAddr, p.pool, &pair, "")
	_, _, rotated := p.issue("cp0", "smg:controlplane:cp0")
	waitFor(t, 10*time.Second, "cp0's Raft port to serve the rotated certificate", func() (bool, string) {
		now := serverFingerprint(t, raftAddr, p.pool, &pair, "")
		return now == tlsutil.Fingerprint(rotated), fmt.Sprintf("serves %.12s (old %.12s)", now, old)
	})
	id2 := registerRetrying(t, first.admin, eng.URL+"/rotated")
	everywhere(id2)
}

// registerRetrying registers a worker, retrying while the cluster answers
// 503 NO_LEADER (the write was not made): a leader on a loaded box may step
// down for a moment, and a client is told to retry.
func registerRetrying(t *testing.T, a admin, url string) string {
	t.Helper()
	var id string
	waitFor(t, 20*time.Second, "registering "+url, func() (bool, string) {
		code, got, err := register(a, url)
		if err != nil && code == http.StatusServiceUnavailable && strings.Contains(err.Error(), "NO_LEADER") {
			return false, err.Error()
		}
		if err != nil {
			t.Fatal(err)
		}
		id = got
		return true, ""
	})
	return id
}
