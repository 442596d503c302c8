package controlplane

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/smg-project/smg/controlplane/cluster"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
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

// rawCodec sends a message's bytes as they are, so a test can send what no
// generated client would.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// Without the admin key a gRPC admin call is refused UNAUTHENTICATED before
// its message is read, whatever it sent, as REST refuses before reading the
// body: a malformed message gets the same answer as a well-formed one.
func TestAdminKeyCheckedBeforeTheMessageIsRead(t *testing.T) {
	opts := DefaultOptions()
	opts.AdminAPIKey = "admin-key-0123456789"
	cp, err := New(opts, slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := cp.GRPCServer()
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	malformed := []byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f} // a length past the end
	var out []byte
	for name, body := range map[string][]byte{"malformed": malformed, "empty": {}} {
		err := conn.Invoke(ctx, smgv1.WorkerService_CreateWorker_FullMethodName, &body, &out, grpc.ForceCodec(rawCodec{}))
		if status.Code(err) != codes.Unauthenticated {
			t.Errorf("%s message without the key: %v, want Unauthenticated", name, err)
		}
	}
	withKey := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+opts.AdminAPIKey)
	err = conn.Invoke(withKey, smgv1.WorkerService_CreateWorker_FullMethodName, &malformed, &out, grpc.ForceCodec(rawCodec{}))
	if code := status.Code(err); code == codes.Unauthenticated || code == codes.OK {
		t.Errorf("malformed message with the key: %v, want the decode error", err)
	}
}
