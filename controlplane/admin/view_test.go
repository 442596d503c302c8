package admin

import (
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// Admin answers carry no proto enum: protojson would show its UPPER_SNAKE
// names (VETO_UNSPECIFIED) to users. Enums shown to users are words, set by
// the service (VetoWord). Walks every response of WorkerService's descriptor.
func TestAdminAnswersCarryNoEnums(t *testing.T) {
	seen := map[protoreflect.FullName]bool{}
	var walk func(path string, md protoreflect.MessageDescriptor)
	walk = func(path string, md protoreflect.MessageDescriptor) {
		if seen[md.FullName()] || md.ParentFile().Package() != "smg.v1" {
			return
		}
		seen[md.FullName()] = true
		fields := md.Fields()
		for i := range fields.Len() {
			f := fields.Get(i)
			switch {
			case f.Enum() != nil:
				t.Errorf("%s.%s is the enum %s: show a word instead", path, f.Name(), f.Enum().FullName())
			case f.Message() != nil:
				walk(path+"."+string(f.Name()), f.Message())
			}
		}
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(smgv1.WorkerService_ServiceDesc.ServiceName))
	if err != nil {
		t.Fatal(err)
	}
	methods := d.(protoreflect.ServiceDescriptor).Methods()
	for i := range methods.Len() {
		walk(string(methods.Get(i).Name()), methods.Get(i).Output())
	}
	if len(seen) < 10 {
		t.Fatalf("walked %d messages: the walk is broken", len(seen))
	}
}

func TestVetoWord(t *testing.T) {
	for v, want := range map[smgv1.Veto]string{
		smgv1.Veto_VETO_UNSPECIFIED: "none", smgv1.Veto_VETO_OVERLOAD: "overload",
		smgv1.Veto_VETO_UNREACHABLE: "unreachable", smgv1.Veto_VETO_WEDGED: "wedged",
	} {
		if got := VetoWord(v); got != want {
			t.Errorf("VetoWord(%v) = %q, want %q", v, got, want)
		}
	}
}
