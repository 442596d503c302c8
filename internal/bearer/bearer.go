// Package bearer checks a shared token sent as gRPC metadata
// "authorization: Bearer <token>" (grpc-gateway forwards the REST header the
// same way), in constant time.
package bearer

import (
	"context"
	"crypto/subtle"
	"strings"

	"google.golang.org/grpc/metadata"
)

// Check reports whether ctx carries an authorization value (sent) and
// whether one of them is "Bearer <token>" (ok).
func Check(ctx context.Context, token string) (sent, ok bool) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	for _, v := range vals {
		got, isBearer := strings.CutPrefix(v, "Bearer ")
		if isBearer && subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1 {
			return true, true
		}
	}
	return len(vals) > 0, false
}
