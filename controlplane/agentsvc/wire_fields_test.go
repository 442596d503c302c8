package agentsvc

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// fill sets every field of m, recursively, to a value other than its zero,
// from the message's descriptor: a field added to the .proto is filled
// without this test knowing its name. Repeated fields get two elements.
func fill(m protoreflect.Message, seed *int) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		switch {
		case fd.IsMap():
			m.Mutable(fd).Map().Set(scalar(fd.MapKey(), seed).MapKey(), mapValue(m, fd, seed))
		case fd.IsList():
			l := m.Mutable(fd).List()
			for range 2 {
				if fd.Message() != nil {
					e := l.NewElement()
					fill(e.Message(), seed)
					l.Append(e)
				} else {
					l.Append(scalar(fd, seed))
				}
			}
		case fd.Message() != nil:
			fill(m.Mutable(fd).Message(), seed)
		default:
			m.Set(fd, scalar(fd, seed))
		}
	}
}

func mapValue(m protoreflect.Message, fd protoreflect.FieldDescriptor, seed *int) protoreflect.Value {
	if fd.MapValue().Message() != nil {
		v := m.Mutable(fd).Map().NewValue()
		fill(v.Message(), seed)
		return v
	}
	return scalar(fd.MapValue(), seed)
}

// scalar is a value of fd's kind that is not zero and differs from the
// previous one (seed counts up), small enough to be a valid nanos.
func scalar(fd protoreflect.FieldDescriptor, seed *int) protoreflect.Value {
	*seed++
	n := *seed
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.EnumKind:
		vals := fd.Enum().Values()
		return protoreflect.ValueOfEnum(vals.Get(vals.Len() - 1).Number())
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(int32(n))
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(int64(n) << 33)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(uint32(n))
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(uint64(n) << 33)
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(float32(n) + 0.5)
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(float64(n) + 0.25)
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(fmt.Sprintf("%s-%d-é", fd.Name(), n))
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte{byte(n), 0xff})
	}
	panic("unknown kind " + fd.Kind().String())
}

// The hand-written decoder (recordsDecoder) yields every field of a load
// record: each record is filled field by field from the descriptors, sent
// in both shapes the decoder takes (a LoadRecords batch, one LoadRecord),
// decoded, and compared with what was sent. A field added to LoadRecords,
// LoadRecord, EngineLoad, RankLoad or a timestamp that the decoder does not
// read fails here.
func TestDecodeRecordsReadsEveryField(t *testing.T) {
	seed := 0
	batch := &smgv1.LoadRecords{}
	fill(batch.ProtoReflect(), &seed)
	recs := batch.Records
	sent := &smgv1.ReportRequest{}
	fill(sent.ProtoReflect(), &seed) // sets sent_at, and one of the oneof's members
	for name, msg := range map[string]*smgv1.ReportRequest{
		"batch":  {Msg: &smgv1.ReportRequest_Records{Records: batch}, SentAt: sent.SentAt},
		"single": {Msg: &smgv1.ReportRequest_Record{Record: recs[0]}, SentAt: sent.SentAt},
	} {
		b, err := proto.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		var d recordsDecoder
		got, sentAt, ok := d.decode(b)
		if !ok {
			t.Fatalf("%s: not decoded", name)
		}
		if !sentAt.Equal(msg.SentAt.AsTime()) {
			t.Fatalf("%s: sent_at %v, want %v", name, sentAt, msg.SentAt.AsTime())
		}
		want := recs
		if name == "single" {
			want = recs[:1]
		}
		if len(got) != len(want) {
			t.Fatalf("%s: %d records, want %d", name, len(got), len(want))
		}
		for i, r := range got {
			if !proto.Equal(r.own(), want[i]) {
				t.Errorf("%s: record %d decoded by hand differs from the one sent (a field the decoder does not read?):\n got %v\nwant %v",
					name, i, r.own(), want[i])
			}
		}
		if name == "batch" {
			decoded := &smgv1.LoadRecords{}
			for _, r := range got {
				decoded.Records = append(decoded.Records, r.own())
			}
			if !proto.Equal(decoded, batch) {
				t.Errorf("batch: the records decoded by hand make another LoadRecords than the one sent (a field the decoder does not read?)")
			}
		}
	}
	// Any other field of ReportRequest, beside a batch of records, makes
	// the decoder leave the whole message to proto.Unmarshal: nothing of a
	// field it does not know is lost.
	fields := sent.ProtoReflect().Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		switch fd.Name() {
		case "record", "records", "sent_at":
			continue
		}
		m := (&smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Records{Records: &smgv1.LoadRecords{Records: recs}}}).ProtoReflect()
		other := (&smgv1.ReportRequest{}).ProtoReflect()
		switch v := other.NewField(fd); {
		case fd.IsList() || fd.IsMap():
			t.Fatalf("ReportRequest.%s: a repeated field here needs a case in this test", fd.Name())
		case fd.Message() != nil:
			fill(v.Message(), &seed)
			other.Set(fd, v)
		default:
			other.Set(fd, scalar(fd, &seed))
		}
		b, err := proto.Marshal(m.Interface())
		if err != nil {
			t.Fatal(err)
		}
		extra, err := proto.Marshal(other.Interface())
		if err != nil {
			t.Fatal(err)
		}
		var d recordsDecoder
		if _, _, ok := d.decode(append(b, extra...)); ok {
			t.Errorf("records beside ReportRequest.%s were decoded by hand, the other field dropped", fd.Name())
		}
	}
}
