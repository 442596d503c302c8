package admin

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// A PATCH sets every field it carries on the stored spec and leaves the
// others, the overload block included, as they were.
func TestUpdateSetsEveryFieldItCarries(t *testing.T) {
	reg := registry.New("r", 0)
	old := &smgv1.WorkerSpec{Url: "http://e:1", ModelId: "m", Priority: proto.Int32(1), ApiKey: "k0", Labels: map[string]string{"a": "0"},
		Overload: &smgv1.OverloadBlock{TokenUsage: proto.Float64(0.5)}}
	if _, err := reg.Update(func(t *registry.Txn) error {
		t.Insert(&registry.Worker{Registered: registry.Registered{ID: "w", Spec: old}})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	u := &smgv1.WorkerUpdate{Priority: proto.Int32(7), Cost: proto.Float64(2.5), Labels: map[string]string{"b": "1"}, ApiKey: proto.String("k1"),
		LoadMonitorIntervalSecs: proto.Int32(3), MaxRunningRequests: proto.Int32(64), Node: proto.String("n1")}
	if got := u.ProtoReflect().Descriptor().Fields().Len(); got != 8 {
		t.Fatalf("WorkerUpdate has %d fields: set the new one here (and overload, which PATCH keeps)", got)
	}
	u.Overload = &smgv1.OverloadBlock{TokenUsage: proto.Float64(0.9)}
	b, _ := proto.Marshal(u)
	resolve := func(*smgv1.OverloadBlock) (judge.Thresholds, error) { return judge.Thresholds{}, nil }
	if _, err := ApplyChange(reg, resolve, &Change{Op: OpUpdate, WorkerID: "w", Update: b}); err != nil {
		t.Fatal(err)
	}
	want := &smgv1.WorkerSpec{Url: "http://e:1", ModelId: "m", Priority: proto.Int32(7), Cost: proto.Float64(2.5), Labels: map[string]string{"b": "1"},
		ApiKey: "k1", LoadMonitorIntervalSecs: proto.Int32(3), MaxRunningRequests: proto.Int32(64), Node: "n1", Overload: old.Overload}
	if got := reg.Get("w").Spec; !proto.Equal(got, want) {
		t.Fatalf("after PATCH the spec is %v, want %v", got, want)
	}
	if _, err := ApplyChange(reg, resolve, &Change{Op: OpUpdate, WorkerID: "w"}); err != nil || !proto.Equal(reg.Get("w").Spec, want) {
		t.Fatalf("an empty PATCH changed the spec to %v (%v)", reg.Get("w").Spec, err)
	}
}
