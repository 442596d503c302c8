package watch

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// notHandEncoded are the fields of WatchResponse's tree that the hand
// encoder (appendResponse) never writes, and who does.
var notHandEncoded = map[protoreflect.FullName]string{
	"smg.v1.WatchResponse.goodbye":    "sent once at shutdown as a message, through gRPC's codec (Server.goodbye)",
	"smg.v1.WatchResponse.tenants":    "relayed per router as a message, through gRPC's codec (watcher.pass)",
	"smg.v1.WatchResponse.report_ack": "encoded per router by appendAck (watcher.sendAck; ack_test decodes it)",
}

// The hand encoder writes every field of WatchResponse and of every message
// under it: snapshots and deltas of random fleets, encoded by
// appendResponse and decoded by proto.Unmarshal, set each field of the
// descriptors at least once. A field added to watch.proto that the encoder
// does not write fails here (TestDirectEncodingEqualsMarshal cannot see it
// when RoutingWorker does not set it either).
func TestHandEncoderWritesEveryField(t *testing.T) {
	seen := map[protoreflect.FullName]bool{}
	routers := []string{"", "r1", "r2"}
	for seed := range uint64(20) {
		r := rand.New(rand.NewPCG(seed, 26))
		reg := registry.New(fmt.Sprint("epoch-", seed), 0)
		var ws []*registry.Worker
		for i := range 40 {
			ws = append(ws, randWorker(r, fmt.Sprintf("w%03d", i), routers))
		}
		put(t, reg, ws...)
		from := reg.Revision()
		remove(t, reg, ws[0].ID)
		put(t, reg, randWorker(r, ws[1].ID, routers))
		s := NewServer(reg, Options{Settings: &smgv1.FleetSettings{LoadMonitorIntervalSecs: 1 + r.Int32N(9), WorkerStaleSecs: 1 + r.Int32N(9)}}, nil, nil)
		snap := reg.Snapshot()
		for _, k := range []baseKey{
			{reg.Epoch(), kindSnapshot, 0, snap.Revision},
			{reg.Epoch(), kindHeartbeat, 0, snap.Revision},
			{reg.Epoch(), kindDelta, from, snap.Revision},
		} {
			var b *base
			if k.kind == kindSnapshot {
				b = s.snapshotBase(k, snap)
			} else if k.kind == kindDelta {
				b = s.deltaBase(k, snap)
			}
			for _, router := range routers {
				var m smgv1.WatchResponse
				if err := proto.Unmarshal(s.appendResponse(nil, k, b, router, 1+r.Int32N(5)), &m); err != nil {
					t.Fatal(err)
				}
				markSet(m.ProtoReflect(), seen)
			}
		}
	}
	checkWritten(t, (&smgv1.WatchResponse{}).ProtoReflect().Descriptor(), seen, map[protoreflect.FullName]bool{})
}

// markSet records the fields set in m and in the messages under it.
func markSet(m protoreflect.Message, seen map[protoreflect.FullName]bool) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		seen[fd.FullName()] = true
		switch {
		case fd.IsList() && fd.Message() != nil:
			for i := range v.List().Len() {
				markSet(v.List().Get(i).Message(), seen)
			}
		case fd.Message() != nil && !fd.IsList() && !fd.IsMap():
			markSet(v.Message(), seen)
		}
		return true
	})
}

// checkWritten fails for every field under md that was never set and is
// not listed in notHandEncoded.
func checkWritten(t *testing.T, md protoreflect.MessageDescriptor, seen, visited map[protoreflect.FullName]bool) {
	if visited[md.FullName()] {
		return
	}
	visited[md.FullName()] = true
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if _, exempt := notHandEncoded[fd.FullName()]; exempt {
			continue
		}
		if !seen[fd.FullName()] {
			t.Errorf("%s is never written by the hand encoder (encode.go)", fd.FullName())
		}
		if fd.Message() != nil {
			checkWritten(t, fd.Message(), seen, visited)
		}
	}
}
