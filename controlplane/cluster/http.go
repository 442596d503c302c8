package cluster

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"time"

	"github.com/hashicorp/raft"

	"github.com/smg-project/smg/controlplane/admin"
	"github.com/smg-project/smg/internal/backoff"
)

// JoinRequest asks the leader to add a node (or to record its addresses).
type JoinRequest struct {
	Member
	RaftAddr string `json:"raft_addr"`
}

// MemberView is one member in GET /cluster.
type MemberView struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	Suffrage string `json:"suffrage"`
	GRPC     string `json:"grpc,omitempty"`
	HTTP     string `json:"http,omitempty"`
	Leader   bool   `json:"leader"`
}

// View is GET /cluster: this node's view of the cluster.
type View struct {
	Node         string       `json:"node"`
	State        string       `json:"state"`
	Serving      bool         `json:"serving"` // leads and has taken up its duties
	Term         uint64       `json:"term"`
	Leader       string       `json:"leader"` // id; empty: no leader
	CommitIndex  uint64       `json:"commit_index"`
	AppliedIndex uint64       `json:"applied_index"`
	LastContact  string       `json:"last_contact,omitempty"`
	Members      []MemberView `json:"members"`
}

// Routes mounts GET /cluster, POST /cluster/join and DELETE
// /cluster/members/{id} on mux, each behind guard (the admin key's check).
func (n *Node) Routes(mux *http.ServeMux, guard func(http.Handler) http.Handler) {
	for route, h := range map[string]http.HandlerFunc{"GET /cluster": n.serveView, "POST /cluster/join": n.serveJoin,
		"DELETE /cluster/members/{id}": n.serveRemove} {
		mux.Handle(route, guard(h))
	}
}

// writeJSON answers 200 with v.
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// serveRemove removes a member from the configuration (a replica lost for
// good), on the leader; a follower hands the request to the leader.
func (n *Node) serveRemove(w http.ResponseWriter, r *http.Request) {
	if n.raft.State() != raft.Leader {
		n.toLeader(w, r)
		return
	}
	id := r.PathValue("id")
	members, err := n.configuration()
	if err != nil {
		noLeader(w, noLeaderMsg)
		return
	}
	if _, ok := members[id]; !ok {
		admin.WriteJSONError(w, http.StatusNotFound, "invalid_request_error", "MEMBER_NOT_FOUND", "no member "+id+" in the cluster configuration", nil)
		return
	}
	if err := n.raft.RemoveServer(raft.ServerID(id), 0, applyTimeout).Error(); err != nil {
		noLeader(w, "removing member "+id+": "+err.Error())
		return
	}
	n.log.Info("Member removed from the cluster", "node_id", id)
	writeJSON(w, map[string]string{"status": "ok", "message": "member " + id + " removed"})
}

// toLeader hands a request to the leader's HTTP port, or answers 503
// without one.
func (n *Node) toLeader(w http.ResponseWriter, r *http.Request) {
	lm, ok := n.LeaderMember()
	if !ok || lm.ID == n.id || r.Header.Get(forwardedHeader) != "" {
		noLeader(w, noLeaderMsg)
		return
	}
	r.Header.Set(forwardedHeader, n.id)
	target := &url.URL{Scheme: n.peerScheme, Host: lm.HTTP}
	(&httputil.ReverseProxy{Rewrite: func(p *httputil.ProxyRequest) { p.SetURL(target) }, Transport: n.peerHTTP.Transport}).ServeHTTP(w, r)
}

func (n *Node) serveView(w http.ResponseWriter, _ *http.Request) {
	_, leader := n.raft.LeaderWithID()
	v := View{Node: n.id, State: n.raft.State().String(), Term: n.raft.CurrentTerm(), Leader: string(leader),
		CommitIndex: n.raft.CommitIndex(), AppliedIndex: n.raft.AppliedIndex(), Members: []MemberView{}}
	_, v.Serving = n.Leading()
	if n.raft.State() != raft.Leader {
		if lc := n.raft.LastContact(); !lc.IsZero() {
			v.LastContact = time.Since(lc).Round(time.Millisecond).String()
		}
	}
	if f := n.raft.GetConfiguration(); f.Error() == nil {
		for _, s := range f.Configuration().Servers {
			m := MemberView{ID: string(s.ID), RaftAddr: string(s.Address), Suffrage: s.Suffrage.String(), Leader: s.ID == leader}
			if a, ok := n.fsm.member(string(s.ID)); ok {
				m.GRPC, m.HTTP = a.GRPC, a.HTTP
			}
			v.Members = append(v.Members, m)
		}
	}
	writeJSON(w, v)
}

// serveJoin adds a voter, or records a member's addresses. A follower hands
// the request to the leader.
func (n *Node) serveJoin(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<16))
	var req JoinRequest
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	if err == nil && (req.ID == "" || req.RaftAddr == "") {
		err = errors.New("id and raft_addr are required")
	}
	if err != nil {
		admin.WriteJSONError(w, http.StatusBadRequest, "invalid_request_error", admin.CodeBadRequest, "join: "+err.Error(), nil)
		return
	}
	if n.raft.State() != raft.Leader {
		r.Body = io.NopCloser(bytes.NewReader(body)) // read already
		n.toLeader(w, r)
		return
	}
	code, msg := n.join(req)
	if code != http.StatusOK {
		admin.WriteJSONError(w, code, "invalid_request_error", cmp.Or(joinReasons[code], "JOIN_FAILED"), msg, nil)
		return
	}
	writeJSON(w, map[string]string{"status": "ok", "message": msg})
}

var joinReasons = map[int]string{http.StatusConflict: "NODE_ID_IN_USE", http.StatusForbidden: "MEMBER_NOT_AUTHENTICATED",
	http.StatusServiceUnavailable: "NO_LEADER"}

// forwardedHeader marks a request a follower handed on, so it is not
// handed on twice.
const forwardedHeader = "X-Smg-Forwarded-By"

const noLeaderMsg = "the control plane cluster has no leader yet; retry"

func noLeader(w http.ResponseWriter, msg string) {
	w.Header().Set("Retry-After", "1")
	admin.WriteJSONError(w, http.StatusServiceUnavailable, "server_error", "NO_LEADER", msg, nil)
}

// join runs on the leader.
func (n *Node) join(req JoinRequest) (int, string) {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return http.StatusServiceUnavailable, err.Error()
	}
	if err := n.verifyMember(req.ID, req.RaftAddr); err != nil {
		n.log.Warn("Join refused: the node did not prove it is a control plane of this cluster", "node_id", req.ID, "raft_addr", req.RaftAddr, "err", err)
		if errors.Is(err, errUntrusted) {
			return http.StatusForbidden, fmt.Sprintf("node %s at %s did not present a certificate from the cluster's Raft CA naming smg:%s:%s: %v", req.ID, req.RaftAddr, Role, req.ID, err)
		}
		return http.StatusServiceUnavailable, fmt.Sprintf("the leader cannot reach node %s's Raft address %s to check its certificate: %v", req.ID, req.RaftAddr, err)
	}
	known := false
	for _, s := range f.Configuration().Servers {
		switch {
		case string(s.ID) == req.ID && string(s.Address) != req.RaftAddr:
			return http.StatusConflict, fmt.Sprintf("node id %s is already a member at %s (asked for %s): pick another --node-id, or remove the old member first", req.ID, s.Address, req.RaftAddr)
		case string(s.ID) != req.ID && string(s.Address) == req.RaftAddr:
			return http.StatusConflict, fmt.Sprintf("raft address %s is already member %s's", req.RaftAddr, s.ID)
		case string(s.ID) == req.ID:
			known = true
		}
	}
	if !known {
		if err := n.raft.AddVoter(raft.ServerID(req.ID), raft.ServerAddress(req.RaftAddr), 0, applyTimeout).Error(); err != nil {
			return http.StatusServiceUnavailable, "adding the voter failed: " + err.Error()
		}
		n.log.Info("Node joined the cluster", "node_id", req.ID, "raft_addr", req.RaftAddr)
	}
	if cur, ok := n.fsm.member(req.ID); req.GRPC != "" && (!ok || cur != req.Member) {
		if err := n.apply(entry{Member: &req.Member}); err != nil {
			return http.StatusServiceUnavailable, err.Error()
		}
	}
	return http.StatusOK, "member " + req.ID + " known"
}

// announce keeps this node's addresses in the replicated member list,
// through the leader (joining the cluster first with --join). A join the
// leader refuses for a node id in use is fatal.
func (n *Node) announce(ctx context.Context) error {
	bo := backoff.New(backoff.Policy{Initial: 200 * time.Millisecond, Max: 2 * time.Second}, nil)
	for {
		n.mu.Lock()
		self := n.self
		n.mu.Unlock()
		wait := time.Second
		if cur, ok := n.fsm.member(n.id); self.GRPC != "" && (!ok || cur != self) {
			code, msg := n.sendJoin(ctx, self)
			switch code {
			case http.StatusOK:
				bo.Reset()
			case http.StatusConflict, http.StatusUnauthorized, http.StatusForbidden:
				return fmt.Errorf("joining the cluster: %s", msg)
			default:
				wait = bo.Next()
				n.log.Debug("Announcing this node to the leader failed; retrying", "reason", msg, "retry_in", wait)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

func (n *Node) sendJoin(ctx context.Context, self Member) (int, string) {
	req := JoinRequest{Member: self, RaftAddr: string(n.trans.LocalAddr())}
	if n.raft.State() == raft.Leader {
		return n.join(req)
	}
	target := ""
	if lm, ok := n.LeaderMember(); ok {
		target = n.peerScheme + "://" + lm.HTTP
	} else if n.opts.Join != "" {
		target = strings.TrimRight(n.opts.Join, "/")
	} else {
		return http.StatusServiceUnavailable, "no leader known yet"
	}
	b, _ := json.Marshal(req)
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, target+"/cluster/join", bytes.NewReader(b))
	if err != nil {
		return http.StatusBadRequest, err.Error()
	}
	hr.Header.Set("Content-Type", "application/json")
	if n.adminKey != "" {
		hr.Header.Set("Authorization", "Bearer "+n.adminKey)
	}
	resp, err := n.peerHTTP.Do(hr)
	if err != nil {
		return http.StatusServiceUnavailable, err.Error()
	}
	defer resp.Body.Close()
	rb, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	var eb admin.ErrorBody
	if json.Unmarshal(rb, &eb) == nil && eb.Error.Message != "" {
		return resp.StatusCode, eb.Error.Message
	}
	return resp.StatusCode, strings.TrimSpace(string(rb))
}
