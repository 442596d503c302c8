package cluster

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/smg-project/smg/controlplane/admin"
	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

func resolve(b *smgv1.OverloadBlock) (judge.Thresholds, error) {
	return judge.DefaultGatewayThresholds().Resolve(nil), nil
}

func logOf(t *testing.T, i uint64, c *admin.Change) *raft.Log {
	t.Helper()
	b, err := json.Marshal(entry{Change: c})
	if err != nil {
		t.Fatal(err)
	}
	return &raft.Log{Index: i, Type: raft.LogCommand, Data: b}
}

// The changes of one registration and one deletion, as the leader proposes them.
func changes(t *testing.T) []*admin.Change {
	t.Helper()
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var out []*admin.Change
	for i, url := range []string{"http://e1:8000", "http://e2:8000", "http://e3:8000"} {
		spec, _ := proto.Marshal(&smgv1.WorkerSpec{Url: url})
		id := admin.WorkerID(url)
		tok := "tok" + string(rune('a'+i))
		out = append(out,
			&admin.Change{Op: admin.OpSubmit, WorkerID: id, Token: tok, Kind: "create", Spec: spec, At: at},
			&admin.Change{Op: admin.OpJob, WorkerID: id, Token: tok, State: "processing", At: at},
			&admin.Change{Op: admin.OpRegister, WorkerID: id, Token: tok, Model: "m", At: at})
	}
	out = append(out, &admin.Change{Op: admin.OpDelete, WorkerID: admin.WorkerID("http://e2:8000"), At: at})
	return out
}

func durable(t *testing.T, reg *registry.Registry) string {
	t.Helper()
	d, err := admin.DurableState(reg.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(d)
	return string(b)
}

// Two replicas applying the same log hold the same registry; a snapshot
// restored into a third gives it the same too.
func TestFSMReplicasAgreeAndSnapshotsRestore(t *testing.T) {
	a, b := newFSM(registry.New("a", 0), resolve), newFSM(registry.New("b", 0), resolve)
	for i, c := range changes(t) {
		for _, f := range []*fsm{a, b} {
			if r := f.Apply(logOf(t, uint64(i+1), c)).(result); r.err != nil {
				t.Fatalf("apply %d %s: %v", i, c.Op, r.err)
			}
		}
	}
	ws := a.reg.Snapshot().Workers()
	if len(ws) != 2 {
		t.Fatalf("%d workers, want 2 (3 registered, 1 deleted)", len(ws))
	}
	if j := a.reg.Snapshot().Job(ws[0].ID); j == nil || j.State != "done" {
		t.Fatalf("job of %s: %+v, want done", ws[0].ID, j)
	}
	if durable(t, a.reg) != durable(t, b.reg) {
		t.Fatal("two replicas applying the same log differ")
	}
	a.Apply(&raft.Log{Type: raft.LogCommand, Data: mustJSON(t, entry{Member: &Member{ID: "n1", GRPC: "h:2", HTTP: "h:1"}})})

	snap, err := a.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := snap.Persist(&sink{Buffer: &buf}); err != nil {
		t.Fatal(err)
	}
	c := newFSM(registry.New("c", 0), resolve)
	// c held a worker the snapshot does not: restoring drops it.
	c.Apply(logOf(t, 1, changes(t)[0]))
	if err := c.Restore(io.NopCloser(bytes.NewReader(buf.Bytes()))); err != nil {
		t.Fatal(err)
	}
	if durable(t, c.reg) != durable(t, a.reg) {
		t.Fatalf("restored replica differs:\n%s\n%s", durable(t, c.reg), durable(t, a.reg))
	}
	if m, ok := c.member("n1"); !ok || m.GRPC != "h:2" {
		t.Fatalf("restored member n1: %+v %v", m, ok)
	}
}

// A replay of an old change (a register whose job was superseded) and a
// log entry this version cannot read change nothing and never panic.
func TestFSMRefusesWithoutChange(t *testing.T) {
	f := newFSM(registry.New("a", 0), resolve)
	cs := changes(t)
	for i, c := range cs[:3] {
		f.Apply(logOf(t, uint64(i+1), c))
	}
	before := durable(t, f.reg)
	if r := f.Apply(logOf(t, 4, cs[2])).(result); r.err == nil {
		t.Error("a second register of a finished job was applied")
	}
	if r := f.Apply(&raft.Log{Index: 5, Type: raft.LogCommand, Data: []byte("{not json")}).(result); r.err == nil {
		t.Error("garbage applied without an error")
	}
	if err := f.Restore(io.NopCloser(strings.NewReader(`{"version":99}`))); err == nil {
		t.Error("a snapshot of an unknown version restored")
	}
	if durable(t, f.reg) != before {
		t.Error("a refused entry changed the registry")
	}
}

func TestPeersAndOptions(t *testing.T) {
	p, err := ParsePeers([]string{"a=h1:1,b=h2:1", "c=h3:1"})
	if err != nil || len(p) != 3 || p["b"] != "h2:1" {
		t.Fatalf("ParsePeers = %v, %v", p, err)
	}
	for _, bad := range [][]string{{"a=h1:1", "a=h2:1"}, {"a=h1:1", "b=h1:1"}, {"noequals"}, {"a=nohostport"}} {
		if _, err := ParsePeers(bad); err == nil {
			t.Errorf("ParsePeers(%v) accepted", bad)
		}
	}
	o := DefaultOptions()
	if err := o.Validate(); err != nil {
		t.Fatalf("in memory: %v", err)
	}
	o.Peers = []string{"a=h:1"}
	if err := o.Validate(); err == nil {
		t.Error("--raft-peers without --data-dir accepted")
	}
	o.DataDir, o.NodeID, o.RaftAddr = "/d", "a", "127.0.0.1:5"
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "this node's Raft address") {
		t.Errorf("a peer list naming this node at another address: %v", err)
	}
	o.Peers = []string{"b=h:1"}
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "does not list this node") {
		t.Errorf("a peer list without this node: %v", err)
	}
	o.Peers, o.Join = []string{"a=127.0.0.1:5"}, "http://x"
	if err := o.Validate(); err == nil {
		t.Error("--raft-peers with --join accepted")
	}
	o.Join, o.LeaderLeaseTimeout = "", time.Hour
	if err := o.Validate(); err == nil {
		t.Error("a leader lease above the heartbeat timeout accepted")
	}
}

type sink struct{ *bytes.Buffer }

func (sink) ID() string    { return "test" }
func (sink) Cancel() error { return nil }
func (sink) Close() error  { return nil }

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
