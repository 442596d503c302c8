package agentsvc

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/smg-project/smg/internal/tlsutil"
)

// CertAuth puts a verified client certificate (mutual TLS) on top of the
// tokens: when the stream's certificate names a node, that
// node is the stream's identity, and a token bound to another node is
// refused. A certificate for another role (a router's) or naming no smg
// identity is refused; one naming any node ("smg:agent:*") or no certificate
// at all leaves the identity to the tokens.
type CertAuth struct{ Next TokenAuth }

// Authenticate turns the stream's certificate and token into its identity.
func (a CertAuth) Authenticate(ctx context.Context) (Identity, error) {
	id, err := a.Next.Authenticate(ctx)
	if err != nil {
		return Identity{}, err
	}
	node, err := tlsutil.PeerName(ctx, "agent", "")
	if err != nil {
		return Identity{}, err
	}
	if node == "" {
		return id, nil
	}
	if id.Node != "" && id.Node != node {
		return Identity{}, status.Errorf(codes.PermissionDenied,
			"agent: the token is for node %q but the client certificate names node %q", id.Node, node)
	}
	id.Node = node
	return id, nil
}
