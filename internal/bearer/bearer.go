// Package bearer checks a shared token sent as gRPC metadata or an HTTP
// header "authorization: Bearer <token>", in constant time.
//
// It only compares tokens; what a token allows is its caller's.
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
	return Match(md.Get("authorization"), token)
}

// Match is Check over the values of an Authorization header.
func Match(vals []string, token string) (sent, ok bool) {
	for _, v := range vals {
		got, isBearer := strings.CutPrefix(v, "Bearer ")
		if isBearer && subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1 {
			return true, true
		}
	}
	return len(vals) > 0, false
}
