package tlsutil

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/credentials"
)

// ServerConfig serves the pair in use at each handshake. With clientCAs,
// every client must present a certificate that the bundle in use verifies
// (mutual TLS). nextProtos are the ALPN protocols ("h2" for gRPC; "h2",
// "http/1.1" for HTTP).
func ServerConfig(kp *KeyPair, clientCAs *Pool, nextProtos ...string) *tls.Config {
	cfg := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		NextProtos:     nextProtos,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return kp.Certificate(), nil },
	}
	if clientCAs == nil {
		return cfg
	}
	cfg.ClientAuth = tls.RequireAndVerifyClientCert
	cfg.ClientCAs = clientCAs.CertPool()
	// The bundle may be rotated: each handshake takes the one in use (and
	// whatever the caller set on cfg since, such as VerifyConnection).
	cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		c := cfg.Clone()
		c.GetConfigForClient = nil
		c.ClientCAs = clientCAs.CertPool()
		return c, nil
	}
	return cfg
}

// ClientOptions say how a client verifies a server and who it is.
type ClientOptions struct {
	Roots      *Pool    // CA bundle for the server's certificate; nil: the system's
	ServerName string   // expected name in the server's certificate; "": the dialled host
	Cert       *KeyPair // client certificate for mutual TLS; nil: none
	// Check, when set, runs on the server's verified certificate (after
	// the chain and name checks): an identity rule beyond "signed by Roots".
	Check func(*x509.Certificate) error
	// InsecureSkipVerify accepts any server certificate (engines with
	// self-signed certificates only; never offered for the control plane).
	InsecureSkipVerify bool
}

// ClientConfig builds a client configuration that verifies the server against
// the bundle in use at each handshake.
func ClientConfig(o ClientOptions) *tls.Config {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: o.ServerName}
	if o.Cert != nil {
		cert := o.Cert
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert.Certificate(), nil }
	}
	switch {
	case o.InsecureSkipVerify:
		cfg.InsecureSkipVerify = true
	case o.Roots != nil:
		// Go verifies against a fixed RootCAs; to follow a rotated bundle the
		// check is done here, against the bundle in use, with the same rules.
		roots, check := o.Roots, o.Check
		cfg.InsecureSkipVerify = true
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("tls: the server presented no certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			// An IP address is not sent as SNI, so cs.ServerName is empty
			// for one: the configured name is checked then.
			name := cs.ServerName
			if name == "" {
				name = o.ServerName
			}
			if _, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
				Roots: roots.CertPool(), Intermediates: inter, DNSName: name,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			}); err != nil {
				return err
			}
			if check != nil {
				return check(cs.PeerCertificates[0])
			}
			return nil
		}
	}
	return cfg
}

// forHost defaults the name to verify to the dialled host. Go sends no IP
// address as SNI, so the check in ClientConfig sees no name for a server
// dialled by IP unless it is configured: without this, any certificate of
// the CA (an agent's, say) would pass for a server dialled by IP.
func (o ClientOptions) forHost(hostport string) ClientOptions {
	if o.ServerName == "" {
		host, _, err := net.SplitHostPort(hostport)
		if err != nil {
			host = hostport
		}
		o.ServerName = host
	}
	return o
}

// DialTLSContext dials over TLS as ClientConfig verifies, the name defaulted
// to each address's host (for http.Transport.DialTLSContext).
func DialTLSContext(o ClientOptions) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return o.DialTLS(nil)
}

// DialTLS is DialTLSContext over the given dialer (its timeout and keep-alive;
// nil: the zero dialer), or nil for nil options (an http.Transport's
// defaults). An http.Transport cannot do this with TLSClientConfig alone: the
// name it fills in for a server dialled by IP is not the one the bundle check
// sees, so only the chain would be verified.
func (o *ClientOptions) DialTLS(nd *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if o == nil {
		return nil
	}
	opts := *o
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		d := tls.Dialer{NetDialer: nd, Config: ClientConfig(opts.forHost(addr))}
		return d.DialContext(ctx, network, addr)
	}
}

// Credentials are gRPC client credentials that verify as ClientConfig does,
// the name defaulted to each dial's authority host.
func Credentials(o ClientOptions) credentials.TransportCredentials {
	return hostCreds{credentials.NewTLS(ClientConfig(o)), o}
}

type hostCreds struct {
	credentials.TransportCredentials
	o ClientOptions
}

func (c hostCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return credentials.NewTLS(ClientConfig(c.o.forHost(authority))).ClientHandshake(ctx, authority, raw)
}

func (c hostCreds) Clone() credentials.TransportCredentials {
	return hostCreds{c.TransportCredentials.Clone(), c.o}
}

// Fingerprint is the SHA-256 of a certificate's DER, in hex: how logs and
// tests name a certificate.
func Fingerprint(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return hex.EncodeToString(sum[:])
}

// Identity is who a certificate names.
type Identity struct {
	Role string // "agent", "router" or "controlplane"
	Name string // the agent's node, the router's id or the control plane's node id
}

// IdentityOf reads the identity a certificate carries:
//   - a SPIFFE ID URI SAN whose path ends in /agent/NODE, /router/ID or
//     /controlplane/ID (spiffe://example.org/ns/smg/agent/gpu-7), or else
//   - a Subject common name smg:agent:NODE, smg:router:ID or
//     smg:controlplane:ID (the form Kubernetes uses for kubelets,
//     system:node:NAME).
func IdentityOf(c *x509.Certificate) (Identity, error) {
	for _, u := range c.URIs {
		if id, ok := spiffeIdentity(u); ok {
			return id, nil
		}
	}
	if role, name, ok := strings.Cut(strings.TrimPrefix(c.Subject.CommonName, "smg:"), ":"); ok &&
		strings.HasPrefix(c.Subject.CommonName, "smg:") && validRole(role) && name != "" {
		return Identity{Role: role, Name: name}, nil
	}
	return Identity{}, fmt.Errorf("the certificate (subject %q) names no smg identity: want a URI SAN spiffe://DOMAIN/.../agent/NODE, .../router/ID or .../controlplane/ID, or the common name smg:agent:NODE, smg:router:ID or smg:controlplane:ID", c.Subject.CommonName)
}

func spiffeIdentity(u *url.URL) (Identity, bool) {
	if u.Scheme != "spiffe" || u.Host == "" {
		return Identity{}, false
	}
	parts := strings.Split(strings.Trim(u.Path, "/"), "/")
	if len(parts) < 2 {
		return Identity{}, false
	}
	role, name := parts[len(parts)-2], parts[len(parts)-1]
	if !validRole(role) || name == "" {
		return Identity{}, false
	}
	return Identity{Role: role, Name: name}, true
}

func validRole(r string) bool { return r == "agent" || r == "router" || r == "controlplane" }

// PeerIdentity reads the identity of a gRPC peer authenticated with mutual
// TLS; ok is false when the connection carried no verified client certificate.
func PeerIdentity(info credentials.AuthInfo) (id Identity, ok bool, err error) {
	ti, isTLS := info.(credentials.TLSInfo)
	if !isTLS || len(ti.State.VerifiedChains) == 0 || len(ti.State.PeerCertificates) == 0 {
		return Identity{}, false, nil
	}
	id, err = IdentityOf(ti.State.PeerCertificates[0])
	return id, err == nil, err
}

// loggingCreds logs every failed server handshake: gRPC drops them silently.
type loggingCreds struct {
	credentials.TransportCredentials
	log      *slog.Logger
	listener string
}

// ServerCredentials are gRPC server credentials over cfg that log each
// refused handshake (who, and why) at WARN.
func ServerCredentials(cfg *tls.Config, listener string, log *slog.Logger) credentials.TransportCredentials {
	return loggingCreds{credentials.NewTLS(cfg), log, listener}
}

func (c loggingCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	out, info, err := c.TransportCredentials.ServerHandshake(conn)
	if err != nil {
		c.log.Warn("TLS handshake refused", "listener", c.listener, "peer", conn.RemoteAddr().String(), "err", err)
	}
	return out, info, err
}

func (c loggingCreds) Clone() credentials.TransportCredentials {
	return loggingCreds{c.TransportCredentials.Clone(), c.log, c.listener}
}

// RegisterExpiry exports smg_tls_certificate_expiry_seconds{listener}: the
// seconds until the certificate in use expires (negative once expired).
func RegisterExpiry(reg prometheus.Registerer, listener string, kp *KeyPair, now func() time.Time) error {
	return reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "smg_tls_certificate_expiry_seconds",
		Help:        "Seconds until the TLS certificate in use expires (negative once expired), by listener or client link.",
		ConstLabels: prometheus.Labels{"listener": listener},
	}, func() float64 { return kp.NotAfter().Sub(now()).Seconds() }))
}

// ErrorLogWriter adapts slog for http.Server.ErrorLog, where the standard
// library reports refused TLS handshakes ("http: TLS handshake error from ...").
type ErrorLogWriter struct {
	Log      *slog.Logger
	Listener string
}

func (w ErrorLogWriter) Write(p []byte) (int, error) {
	w.Log.Warn(strings.TrimSpace(string(p)), "listener", w.Listener)
	return len(p), nil
}

// Ensure the interface is met.
var _ credentials.TransportCredentials = loggingCreds{}

// AnyName in a certificate (smg:agent:* or spiffe://.../router/*) vouches for
// the role only: the peer's own claim names it. For a Deployment or
// DaemonSet sharing one certificate; node scoping then rests on the token.
const AnyName = "*"

// PeerName is the name a gRPC peer goes by: the one its verified client
// certificate gives for role when it presented one (mutual TLS), else the
// name it claimed. A certificate naming no smg identity, or another role, is
// refused; so is an agent whose hello claims a node other than its
// certificate's (an agent certificate for node A cannot report for node B).
// A router's claim yields to its certificate.
func PeerName(ctx context.Context, role, claimed string) (string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.AuthInfo == nil {
		return claimed, nil
	}
	id, hasCert, err := PeerIdentity(p.AuthInfo)
	switch {
	case err != nil:
		return "", status.Errorf(codes.Unauthenticated, "%s: %v", role, err)
	case !hasCert:
		return claimed, nil
	case id.Role != role:
		return "", status.Errorf(codes.PermissionDenied, "%s: the client certificate names %s %q; this stream is for %ss", role, id.Role, id.Name, role)
	case id.Name == AnyName:
		return claimed, nil // the certificate vouches for the role only
	case role == "agent" && claimed != "" && claimed != id.Name:
		return "", status.Errorf(codes.PermissionDenied, "agent: the client certificate names node %q but the hello claims node %q", id.Name, claimed)
	}
	return id.Name, nil
}
