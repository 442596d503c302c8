package cluster

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"sync"

	"github.com/hashicorp/raft"

	"github.com/smg-project/smg/controlplane/admin"
	"github.com/smg-project/smg/controlplane/registry"
)

// Member is how routers, agents and the other nodes reach a node.
type Member struct {
	ID   string `json:"id"`
	GRPC string `json:"grpc"` // HOST:PORT
	HTTP string `json:"http"` // HOST:PORT
}

// entry is one log entry: an admin change or a member's addresses.
type entry struct {
	Change *admin.Change `json:"change,omitempty"`
	Member *Member       `json:"member,omitempty"`
}

// result is what applying an entry returns to the leader that proposed it.
type result struct {
	old *registry.Worker
	err error
}

// snapshotState is a snapshot's content.
type snapshotState struct {
	Version  int               `json:"version"`
	Registry *admin.Durable    `json:"registry"`
	Members  map[string]Member `json:"members"`
}

const snapshotVersion = 1

// fsm applies entries to the registry (durable fields only) and keeps the
// members' addresses.
type fsm struct {
	reg     *registry.Registry
	resolve admin.ThresholdResolver

	mu      sync.Mutex
	members map[string]Member
}

func newFSM(reg *registry.Registry, resolve admin.ThresholdResolver) *fsm {
	return &fsm{reg: reg, resolve: resolve, members: map[string]Member{}}
}

// Apply applies one committed command (raft hands it no other entry). An
// entry this version cannot read is a refusal, never a panic: it changes
// nothing.
func (f *fsm) Apply(l *raft.Log) any {
	var e entry
	if err := json.Unmarshal(l.Data, &e); err != nil {
		return result{err: fmt.Errorf("log entry %d: %w", l.Index, err)}
	}
	switch {
	case e.Change != nil:
		old, err := admin.ApplyChange(f.reg, f.resolve, e.Change)
		return result{old: old, err: err}
	case e.Member != nil:
		f.mu.Lock()
		f.members[e.Member.ID] = *e.Member
		f.mu.Unlock()
	}
	return result{}
}

func (f *fsm) member(id string) (Member, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, ok := f.members[id]
	return m, ok
}

// Snapshot captures the durable state. Raft calls it between Applies, so
// the registry read is consistent with the applied index.
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	d, err := admin.DurableState(f.reg.Snapshot())
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	members := maps.Clone(f.members)
	f.mu.Unlock()
	b, err := json.Marshal(snapshotState{Version: snapshotVersion, Registry: d, Members: members})
	if err != nil {
		return nil, err
	}
	return fsmSnapshot(b), nil
}

// Restore replaces the state with a snapshot's.
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	var s snapshotState
	if err := json.NewDecoder(rc).Decode(&s); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	if s.Version != snapshotVersion || s.Registry == nil {
		return fmt.Errorf("snapshot: version %d is not one this control plane reads (%d)", s.Version, snapshotVersion)
	}
	if err := admin.RestoreDurable(f.reg, f.resolve, s.Registry); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	f.mu.Lock()
	f.members = map[string]Member{}
	maps.Copy(f.members, s.Members)
	f.mu.Unlock()
	return nil
}

type fsmSnapshot []byte

func (s fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(s); err != nil {
		_ = sink.Cancel()
		return err
	}
	return sink.Close()
}

func (fsmSnapshot) Release() {}
