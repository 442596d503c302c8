package agentsvc

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/smg-project/smg/internal/tlsutil/testca"
)

// A verified client certificate binds the stream to its node, on top of the
// tokens: a per-node token for another node is refused.
func TestCertAuthBindsTheStreamToTheCertificatesNode(t *testing.T) {
	ca, err := testca.New("ca")
	if err != nil {
		t.Fatal(err)
	}
	ctxWith := func(cn, token string) context.Context {
		ctx := context.Background()
		if cn != "" {
			c, err := ca.Issue(testca.Leaf{CommonName: cn, Client: true})
			if err != nil {
				t.Fatal(err)
			}
			info := credentials.TLSInfo{State: tls.ConnectionState{PeerCertificates: []*x509.Certificate{c.Cert}, VerifiedChains: [][]*x509.Certificate{{c.Cert}}}}
			ctx = peer.NewContext(ctx, &peer.Peer{AuthInfo: info})
		}
		if token != "" {
			ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "Bearer "+token))
		}
		return ctx
	}
	tokens := TokenAuth{Nodes: map[string]Identity{"token-for-gpu-7-xxxxxx": {Node: "gpu-7"}}}
	auth := CertAuth{Next: tokens}
	for _, tc := range []struct {
		name, cn, token, node string
		code                  codes.Code
	}{
		{"certificate and token agree", "smg:agent:gpu-7", "token-for-gpu-7-xxxxxx", "gpu-7", codes.OK},
		{"token for another node", "smg:agent:gpu-8", "token-for-gpu-7-xxxxxx", "", codes.PermissionDenied},
		{"role-only certificate leaves the token's node", "smg:agent:*", "token-for-gpu-7-xxxxxx", "gpu-7", codes.OK},
		{"a router's certificate", "smg:router:r1", "token-for-gpu-7-xxxxxx", "", codes.PermissionDenied},
		{"tokens still required on top", "smg:agent:gpu-7", "", "", codes.Unauthenticated},
	} {
		id, err := auth.Authenticate(ctxWith(tc.cn, tc.token))
		if status.Code(err) != tc.code || id.Node != tc.node {
			t.Errorf("%s: node %q, %v; want %q, %v", tc.name, id.Node, err, tc.node, tc.code)
		}
	}
	// Without tokens configured, the certificate alone names the node.
	id, err := CertAuth{Next: TokenAuth{}}.Authenticate(ctxWith("smg:agent:gpu-9", ""))
	if err != nil || id.Node != "gpu-9" {
		t.Fatalf("certificate alone: %q, %v", id.Node, err)
	}
}
