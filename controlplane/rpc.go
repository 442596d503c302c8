package controlplane

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/smg-project/smg/controlplane/cluster"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// access says who may call a method: anyone (health, reflection); the
// holder of the admin key (admin.Authorize, which lets its public reads
// through); or whom the service itself admits, from the credentials that
// also name the caller to it (the watch token, an agent's token or
// certificate).
type access int

const (
	open access = iota + 1
	adminKey
	ownCredentials
)

type rpc struct {
	access access
	route  cluster.Route // how a replica serves it (replicated only)
}

// rpcs is every method the control plane's gRPC server serves, by full
// method name: who may call it and how a replica serves it. The server's
// interceptors refuse a method missing here, and TestEveryRPCHasRules
// checks the table against the registered services' descriptors.
var rpcs = map[string]rpc{
	smgv1.WorkerService_CreateWorker_FullMethodName:  {adminKey, cluster.RouteWrite},
	smgv1.WorkerService_ReplaceWorker_FullMethodName: {adminKey, cluster.RouteWrite},
	smgv1.WorkerService_UpdateWorker_FullMethodName:  {adminKey, cluster.RouteWrite},
	smgv1.WorkerService_DeleteWorker_FullMethodName:  {adminKey, cluster.RouteWrite},
	smgv1.WorkerService_GetWorker_FullMethodName:     {adminKey, cluster.RouteRead},
	smgv1.WorkerService_ListWorkers_FullMethodName:   {adminKey, cluster.RouteRead},
	smgv1.WorkerService_GetLoads_FullMethodName:      {adminKey, cluster.RouteRead},
	smgv1.WorkerService_ListJobs_FullMethodName:      {adminKey, cluster.RouteRead},
	smgv1.WorkerService_ListRouters_FullMethodName:   {adminKey, cluster.RouteRead},

	smgv1.WatchService_Watch_FullMethodName:  {ownCredentials, cluster.RouteLeader},
	smgv1.AgentService_Report_FullMethodName: {ownCredentials, cluster.RouteLeader},

	healthpb.Health_Check_FullMethodName:                                   {open, cluster.RouteLocal},
	healthpb.Health_List_FullMethodName:                                    {open, cluster.RouteLocal},
	healthpb.Health_Watch_FullMethodName:                                   {open, cluster.RouteLocal},
	reflectionv1.ServerReflection_ServerReflectionInfo_FullMethodName:      {open, cluster.RouteLocal},
	reflectionv1alpha.ServerReflection_ServerReflectionInfo_FullMethodName: {open, cluster.RouteLocal},
}

// authorize applies method's access rule; a method without one is refused.
func (cp *ControlPlane) authorize(ctx context.Context, method string) error {
	switch rpcs[method].access {
	case open, ownCredentials:
		return nil
	case adminKey:
		return cp.Admin.Authorize(ctx, method)
	}
	return status.Errorf(codes.PermissionDenied, "%s has no authorization rule", method)
}

// tap refuses an admin call without the key when its stream opens, before
// its message is read: an unauthenticated caller gets UNAUTHENTICATED
// whatever it sent, as on REST, and learns nothing from how it decodes.
// The interceptors check again (the REST gateway reaches them in process).
func (cp *ControlPlane) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	if rpcs[info.FullMethodName].access != adminKey {
		return ctx, nil
	}
	return ctx, cp.Admin.Authorize(metadata.NewIncomingContext(ctx, info.Header), info.FullMethodName)
}

// unary authorizes a call, then, replicated, routes it (cluster.Node.Unary);
// the REST gateway calls through it too.
func (cp *ControlPlane) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := cp.authorize(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	if cp.Cluster != nil {
		return cp.Cluster.Unary(ctx, req, info, handler)
	}
	return handler(ctx, req)
}

// stream authorizes a stream, then, replicated, routes it.
func (cp *ControlPlane) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := cp.authorize(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	if cp.Cluster != nil {
		return cp.Cluster.Stream(srv, ss, info, handler)
	}
	return handler(srv, ss)
}

// GRPCServer returns a gRPC server for the control plane's services, with
// the standard health service and server reflection so stock tools
// (grpcurl, grpc-health-probe, buf curl) work against it: TransportOptions,
// then the interceptors of rpcs, then extra.
func (cp *ControlPlane) GRPCServer(extra ...grpc.ServerOption) *grpc.Server {
	opts := append(TransportOptions(), grpc.InTapHandle(cp.tap), grpc.ChainUnaryInterceptor(cp.unary), grpc.ChainStreamInterceptor(cp.stream))
	s := grpc.NewServer(append(opts, extra...)...)
	smgv1.RegisterWorkerServiceServer(s, cp.Admin)
	smgv1.RegisterWatchServiceServer(s, cp.Watch)
	smgv1.RegisterAgentServiceServer(s, cp.Agents)
	cp.grpcHealth = grpchealth.NewServer()
	if cp.Cluster != nil {
		// Not serving until writes are taken (Run's readiness loop).
		cp.grpcHealth.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	}
	healthpb.RegisterHealthServer(s, cp.grpcHealth)
	reflection.Register(s)
	return s
}

// reportReadiness keeps the gRPC health service's overall status at Ready's
// answer until ctx ends.
func (cp *ControlPlane) reportReadiness(ctx context.Context) {
	if cp.grpcHealth == nil {
		return
	}
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		st := healthpb.HealthCheckResponse_NOT_SERVING
		if cp.Ready() {
			st = healthpb.HealthCheckResponse_SERVING
		}
		cp.grpcHealth.SetServingStatus("", st) // its watchers hear of changes only
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
