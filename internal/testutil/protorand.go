package testutil

import (
	"math"
	"math/rand/v2"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// FillRandom sets every field of m, nested messages included, to random
// values (lists get 0-3 elements, oneofs one member), and sometimes adds
// unknown fields: a message built from the descriptor, so a test that
// compares a hand-written codec against protobuf's on such messages fails
// when the schema gains a field the codec does not handle.
func FillRandom(m proto.Message, rng *rand.Rand) { fill(m.ProtoReflect(), rng, 4) }

func fill(m protoreflect.Message, rng *rand.Rand, depth int) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if o := fd.ContainingOneof(); o != nil && !o.IsSynthetic() && o.Fields().Get(rng.IntN(o.Fields().Len())) != fd {
			continue
		}
		switch {
		case fd.IsList():
			l := m.Mutable(fd).List()
			for range rng.IntN(4) {
				if fd.Kind() == protoreflect.MessageKind {
					if depth > 0 {
						e := l.NewElement()
						fill(e.Message(), rng, depth-1)
						l.Append(e)
					}
					continue
				}
				l.Append(scalar(fd, rng))
			}
		case fd.IsMap():
			// none in the messages this serves
		case fd.Kind() == protoreflect.MessageKind:
			if depth > 0 {
				fill(m.Mutable(fd).Message(), rng, depth-1)
			}
		default:
			m.Set(fd, scalar(fd, rng))
		}
	}
	if rng.IntN(4) == 0 {
		var u []byte
		u = protowire.AppendTag(u, protowire.Number(100+rng.IntN(100)), protowire.VarintType)
		u = protowire.AppendVarint(u, rng.Uint64())
		m.SetUnknown(append(m.GetUnknown(), u...))
	}
}

// scalar is a random value of fd's kind, extremes included.
func scalar(fd protoreflect.FieldDescriptor, rng *rand.Rand) protoreflect.Value {
	big := rng.IntN(4) == 0
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(rng.IntN(2) == 0)
	case protoreflect.EnumKind:
		return protoreflect.ValueOfEnum(protoreflect.EnumNumber(rng.IntN(5)))
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		if big {
			return protoreflect.ValueOfInt32(int32(rng.Uint32()))
		}
		return protoreflect.ValueOfInt32(int32(rng.IntN(200) - 20))
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		if big {
			return protoreflect.ValueOfInt64(int64(rng.Uint64()))
		}
		return protoreflect.ValueOfInt64(int64(rng.IntN(2000) - 200))
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(rng.Uint32())
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(rng.Uint64())
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(rng.Float32())
	case protoreflect.DoubleKind:
		if big {
			return protoreflect.ValueOfFloat64(math.Float64frombits(rng.Uint64()))
		}
		return protoreflect.ValueOfFloat64(rng.Float64())
	case protoreflect.StringKind:
		words := []string{"", "vllm", "sglang_loads", "http://10.0.0.1:8000", "é∂ƒ", "x"}
		return protoreflect.ValueOfString(words[rng.IntN(len(words))])
	case protoreflect.BytesKind:
		b := make([]byte, rng.IntN(8))
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return protoreflect.ValueOfBytes(b)
	}
	panic("testutil.FillRandom: unhandled kind " + fd.Kind().String())
}
