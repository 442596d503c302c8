package admin

import (
	"context"
	"net/http"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/bearer"
)

// Route is an admin REST route.
type Route struct{ Method, Path string }

// Public lists the admin RPCs that need no key, with their REST route.
// Everything else needs the key, over gRPC and REST alike: a new RPC or
// route is closed unless it is added here.
var Public = map[string]Route{
	smgv1.WorkerService_GetLoads_FullMethodName: {http.MethodGet, "/loads"},
}

// allowed reports whether a caller presenting the Authorization values
// vals may call; the key check is in constant time.
func (s *Service) allowed(vals []string) bool {
	if s.opts.APIKey == "" {
		return true
	}
	_, ok := bearer.Match(vals, s.opts.APIKey)
	return ok
}

// RegisterGRPC serves the admin service on gs with the key checked for
// every method of WorkerService's descriptor but the public ones, before
// the request is decoded.
func (s *Service) RegisterGRPC(gs grpc.ServiceRegistrar) { s.RegisterGRPCWith(gs, s) }

// RegisterGRPCWith registers impl (a front of s, such as a replica's
// forwarder to its leader) behind s's key check.
func (s *Service) RegisterGRPCWith(gs grpc.ServiceRegistrar, impl smgv1.WorkerServiceServer) {
	desc := smgv1.WorkerService_ServiceDesc
	desc.Methods = make([]grpc.MethodDesc, len(smgv1.WorkerService_ServiceDesc.Methods))
	for i, m := range smgv1.WorkerService_ServiceDesc.Methods {
		if _, open := Public["/"+desc.ServiceName+"/"+m.MethodName]; !open {
			next := m.Handler
			m.Handler = func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
				if _, ok := bearer.Check(ctx, s.opts.APIKey); s.opts.APIKey != "" && !ok {
					return nil, errUnauthorized()
				}
				return next(srv, ctx, dec, ic)
			}
		}
		desc.Methods[i] = m
	}
	if len(desc.Streams) > 0 {
		panic("admin: WorkerService has streams; guard them in RegisterGRPC")
	}
	gs.RegisterService(&desc, impl)
}

// requireKey guards the REST routes: the key is checked before the body is
// read, so an unauthenticated caller gets 401 whatever it sent.
func (s *Service) requireKey(next http.Handler) http.Handler {
	public := make(map[Route]bool, len(Public))
	for _, r := range Public {
		public[r] = true
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !public[Route{r.Method, r.URL.Path}] && !s.allowed(r.Header.Values("Authorization")) {
			st := status.Convert(errUnauthorized())
			WriteJSONError(w, http.StatusUnauthorized, "authentication_error", CodeUnauthorized, st.Message(), nil)
			return
		}
		next.ServeHTTP(w, r)
	})
}
