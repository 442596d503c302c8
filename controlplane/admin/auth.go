package admin

import (
	"context"
	"net/http"

	"google.golang.org/grpc/status"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/bearer"
)

// Route is an admin REST route.
type Route struct{ Method, Path string }

// public lists the admin RPCs that need no key, with their REST route.
// Everything else needs the key, over gRPC and REST alike: a new RPC or
// route is closed unless it is added here.
var public = map[string]Route{
	smgv1.WorkerService_GetLoads_FullMethodName: {http.MethodGet, "/loads"},
}

// PublicRoute reports whether the admin RPC method (a full method name)
// needs no key, and its REST route.
func PublicRoute(method string) (Route, bool) {
	r, ok := public[method]
	return r, ok
}

// Authorize checks a call of the admin RPC method (a full method name):
// nil for a public RPC or the right key, else Unauthenticated.
func (s *Service) Authorize(ctx context.Context, method string) error {
	if _, open := public[method]; open || s.opts.APIKey == "" {
		return nil
	}
	if _, ok := bearer.Check(ctx, s.opts.APIKey); !ok {
		return errUnauthorized()
	}
	return nil
}

// RequireKey guards REST routes (the admin API's and the cluster's): the key
// is checked before the body is read, so an unauthenticated caller gets 401
// whatever it sent.
func (s *Service) RequireKey(next http.Handler) http.Handler {
	open := make(map[Route]bool, len(public))
	for _, r := range public {
		open[r] = true
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, ok := bearer.Match(r.Header.Values("Authorization"), s.opts.APIKey) // in constant time
		if !open[Route{r.Method, r.URL.Path}] && s.opts.APIKey != "" && !ok {
			st := status.Convert(errUnauthorized())
			WriteJSONError(w, http.StatusUnauthorized, "authentication_error", CodeUnauthorized, st.Message(), nil)
			return
		}
		next.ServeHTTP(w, r)
	})
}
