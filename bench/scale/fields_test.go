package scale

import (
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// The synthetic agents' encoder and the synthetic routers' scanner write
// and read a chosen few fields by number; each number is checked here
// against the descriptors, by field name and wire type, so a field that is
// renumbered, retyped or renamed in the .proto fails here instead of
// silently feeding the harness something else. (Which fields they use is
// their choice: the agents send a load, not every field of a record; the
// routers read the revision and the vetoes.)
func TestFieldNumbersMatchTheProto(t *testing.T) {
	for _, c := range []struct {
		num   protowire.Number
		field protoreflect.FullName
		typ   protowire.Type
	}{
		{fieldReportRecord, "smg.v1.ReportRequest.record", protowire.BytesType},
		{fieldReportRecords, "smg.v1.ReportRequest.records", protowire.BytesType},
		{fieldReportSentAt, "smg.v1.ReportRequest.sent_at", protowire.BytesType},
		{fieldRecordsRecords, "smg.v1.LoadRecords.records", protowire.BytesType},
		{fieldRecordURL, "smg.v1.LoadRecord.worker_url", protowire.BytesType},
		{fieldRecordLoad, "smg.v1.LoadRecord.load", protowire.BytesType},
		{fieldRecordObservedAt, "smg.v1.LoadRecord.observed_at", protowire.BytesType},
		{fieldLoadSource, "smg.v1.EngineLoad.source", protowire.BytesType},
		{fieldLoadRanks, "smg.v1.EngineLoad.ranks", protowire.BytesType},
		{fieldRankWaiting, "smg.v1.RankLoad.waiting_requests", protowire.VarintType},
		{fieldRankRunning, "smg.v1.RankLoad.running_requests", protowire.VarintType},
		{fieldRankTokenUsage, "smg.v1.RankLoad.token_usage", protowire.Fixed64Type},
		{fieldTimestampSeconds, "google.protobuf.Timestamp.seconds", protowire.VarintType},
		{fieldTimestampNanos, "google.protobuf.Timestamp.nanos", protowire.VarintType},
		{fieldRevision, "smg.v1.WatchResponse.revision", protowire.VarintType},
		{fieldSnapshot, "smg.v1.WatchResponse.snapshot", protowire.BytesType},
		{fieldDelta, "smg.v1.WatchResponse.delta", protowire.BytesType},
		{fieldWorkers, "smg.v1.WatchSnapshot.workers", protowire.BytesType},
		{fieldWorkers, "smg.v1.WatchDelta.upserts", protowire.BytesType},
		{fieldWorkerID, "smg.v1.RoutingWorker.worker_id", protowire.BytesType},
		{fieldWorkerVeto, "smg.v1.RoutingWorker.veto", protowire.VarintType},
	} {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(c.field)
		if err != nil {
			t.Errorf("%s: %v", c.field, err)
			continue
		}
		fd := d.(protoreflect.FieldDescriptor)
		if fd.Number() != c.num {
			t.Errorf("%s is field %d in the .proto, the harness uses %d", c.field, fd.Number(), c.num)
		}
		if got := wireType(fd); got != c.typ {
			t.Errorf("%s has wire type %d in the .proto, the harness uses %d", c.field, got, c.typ)
		}
	}
}

// wireType is the wire type of fd (unpacked).
func wireType(fd protoreflect.FieldDescriptor) protowire.Type {
	switch fd.Kind() {
	case protoreflect.StringKind, protoreflect.BytesKind, protoreflect.MessageKind:
		return protowire.BytesType
	case protoreflect.DoubleKind, protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind:
		return protowire.Fixed64Type
	case protoreflect.FloatKind, protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind:
		return protowire.Fixed32Type
	}
	return protowire.VarintType
}
