package cluster

import (
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
)

// RegisterMetrics registers the node's gauges on m, read at scrape time.
func (n *Node) RegisterMetrics(m prometheus.Registerer) error {
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
	}
	cs := []prometheus.Collector{
		gauge("smg_controlplane_is_leader", "1 while this control plane leads (runs the monitor, health checks, verdicts and the watch stream).", func() float64 {
			if _, ok := n.Leading(); ok {
				return 1
			}
			return 0
		}),
		gauge("smg_controlplane_raft_term", "Current Raft term.", func() float64 { return float64(n.raft.CurrentTerm()) }),
		gauge("smg_controlplane_raft_commit_index", "Raft commit index known to this node.", func() float64 { return float64(n.raft.CommitIndex()) }),
		gauge("smg_controlplane_raft_applied_index", "Raft index applied to this node's registry.", func() float64 { return float64(n.raft.AppliedIndex()) }),
		gauge("smg_controlplane_raft_last_contact_seconds", "Seconds since this follower last heard from the leader (0 on the leader).", func() float64 {
			if n.raft.State() == raft.Leader {
				return 0
			}
			lc := n.raft.LastContact()
			if lc.IsZero() {
				return -1
			}
			return time.Since(lc).Seconds()
		}),
		gauge("smg_controlplane_raft_peers", "Voters in the Raft configuration, this node included.", func() float64 {
			f := n.raft.GetConfiguration()
			if f.Error() != nil {
				return 0
			}
			v := 0
			for _, s := range f.Configuration().Servers {
				if s.Suffrage == raft.Voter {
					v++
				}
			}
			return float64(v)
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "smg_controlplane_raft_leader_changes_total", Help: "Leader changes this node observed (no leader counts as one)."}, func() float64 { return float64(n.changes.Load()) }),
	}
	for dir, count := range map[string]*atomic.Uint64{"in": &n.layer.refusedIn, "out": &n.layer.refusedOut} {
		cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "smg_controlplane_raft_tls_refused_total",
			Help:        "Raft connections whose TLS handshake failed (no certificate, another CA, not a control plane, plaintext), by direction: in (accepted on the Raft port) or out (dialled peers and joining nodes).",
			ConstLabels: prometheus.Labels{"direction": dir}}, func() float64 { return float64(count.Load()) }))
	}
	for _, c := range cs {
		if err := m.Register(c); err != nil {
			return err
		}
	}
	return nil
}
