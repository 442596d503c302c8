package controlplane

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/smg-project/smg/controlplane/cluster"
)

// Every method the control plane's gRPC server serves, read from the
// registered services' descriptors, and every method of smg's own services
// in the protobuf registry, has an authorization rule and a route, of the
// kind its interceptor can apply; a method without one is refused. So no RPC
// can be added unprotected or unforwarded.
func TestEveryRPCHasRules(t *testing.T) {
	cp, err := New(DefaultOptions(), slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	served := map[string]bool{}
	for svc, info := range cp.GRPCServer().GetServiceInfo() {
		for _, m := range info.Methods {
			full := "/" + svc + "/" + m.Name
			served[full] = true
			r, ok := rpcs[full]
			if !ok || r.access == 0 {
				t.Errorf("%s has no authorization rule", full)
				continue
			}
			stream := m.IsClientStream || m.IsServerStream
			switch {
			case r.route == cluster.RouteLocal:
			case stream && r.route != cluster.RouteLeader:
				t.Errorf("stream %s routed %d: a stream is served locally or by the leader only", full, r.route)
			case !stream && r.route != cluster.RouteRead && r.route != cluster.RouteWrite:
				t.Errorf("unary %s routed %d: a unary call is served locally, read or written", full, r.route)
			}
		}
	}
	protoregistry.GlobalFiles.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		if fd.Package() != "smg.v1" {
			return true
		}
		for i := range fd.Services().Len() {
			sd := fd.Services().Get(i)
			for j := range sd.Methods().Len() {
				if full := "/" + string(sd.FullName()) + "/" + string(sd.Methods().Get(j).Name()); !served[full] {
					t.Errorf("%s is not served by the control plane", full)
				}
			}
		}
		return true
	})
	for full := range rpcs {
		if !served[full] {
			t.Errorf("rpcs lists %s, which the server does not serve", full)
		}
	}
	if err := cp.authorize(context.Background(), "/smg.v1.WorkerService/NotInTheTable"); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a method without a rule: %v, want PermissionDenied", err)
	}
}
