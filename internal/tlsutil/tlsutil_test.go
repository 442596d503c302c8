package tlsutil_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/smg-project/smg/internal/tlsutil"
	"github.com/smg-project/smg/internal/tlsutil/testca"
)

type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) { l.mu.Lock(); defer l.mu.Unlock(); return l.b.Write(p) }
func (l *logBuf) String() string              { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

func newCA(t *testing.T, name string) *testca.CA {
	t.Helper()
	ca, err := testca.New(name)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func issue(t *testing.T, ca *testca.CA, l testca.Leaf) *testca.Issued {
	t.Helper()
	c, err := ca.Issue(l)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func write(t *testing.T, c *testca.Issued, dir, name string) (string, string) {
	t.Helper()
	cf, kf, err := c.Write(dir, name)
	if err != nil {
		t.Fatal(err)
	}
	return cf, kf
}

var localhost = testca.Leaf{CommonName: "localhost", DNSNames: []string{"localhost"}, IPs: []net.IP{net.ParseIP("127.0.0.1")}}

func TestKeyPairReloadsOnChangeAndKeepsTheLastGoodPair(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, "ca")
	first := issue(t, ca, localhost)
	cf, kf := write(t, first, dir, "srv")
	var logs logBuf
	kp, err := tlsutil.LoadKeyPair(cf, kf, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	fp := func() string { return tlsutil.Fingerprint(kp.Leaf()) }
	if fp() != tlsutil.Fingerprint(first.Cert) {
		t.Fatal("the first pair is not in use")
	}
	if err := kp.Reload(); err != nil {
		t.Fatalf("reload with no change: %v", err)
	}

	second := issue(t, ca, localhost)
	write(t, second, dir, "srv")
	if err := kp.Reload(); err != nil {
		t.Fatal(err)
	}
	if fp() != tlsutil.Fingerprint(second.Cert) {
		t.Fatal("a rotated pair was not picked up")
	}

	// Unreadable: the last good pair stays, the failure is logged once.
	if err := os.WriteFile(cf, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := kp.Reload(); err == nil {
		t.Fatal("a garbage certificate reloaded without error")
	}
	_ = kp.Reload()
	if fp() != tlsutil.Fingerprint(second.Cert) {
		t.Fatal("a garbage file replaced the pair in use")
	}
	if n := strings.Count(logs.String(), "TLS certificate reload failed"); n != 1 {
		t.Fatalf("failure logged %d times, want once per change:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "level=ERROR") {
		t.Fatalf("a failed reload must be logged at ERROR:\n%s", logs.String())
	}

	// Expired: refused, the last good pair stays.
	expired := issue(t, ca, testca.Leaf{CommonName: "localhost", NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	write(t, expired, dir, "srv")
	if err := kp.Reload(); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("an expired certificate: err %v, want expired", err)
	}
	if fp() != tlsutil.Fingerprint(second.Cert) {
		t.Fatal("an expired certificate replaced the pair in use")
	}

	// At start an expired or missing pair is an error: the process does not start.
	if _, err := tlsutil.LoadKeyPair(cf, kf, slog.New(slog.DiscardHandler)); err == nil {
		t.Fatal("an expired pair loaded at start")
	}
	if _, err := tlsutil.LoadKeyPair(dir+"/none.crt", kf, slog.New(slog.DiscardHandler)); err == nil {
		t.Fatal("a missing file loaded at start")
	}
}

// serve accepts TLS connections and answers each with one byte; the
// handshake errors it saw are returned by errs.
func serve(t *testing.T, cfg *tls.Config) (addr string, errs func() []error) {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var mu sync.Mutex
	var seen []error
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if err := c.(*tls.Conn).Handshake(); err != nil {
					mu.Lock()
					seen = append(seen, err)
					mu.Unlock()
					return
				}
				_, _ = c.Write([]byte{1})
			}()
		}
	}()
	return ln.Addr().String(), func() []error { mu.Lock(); defer mu.Unlock(); return append([]error(nil), seen...) }
}

func dial(addr string, cfg *tls.Config) error {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	// TLS 1.3 reports a refused client certificate on the first read.
	_, err = io.ReadFull(c, make([]byte, 1))
	return err
}

func TestMutualTLSAcceptsTheRightClientAndRefusesTheRest(t *testing.T) {
	dir := t.TempDir()
	ca, other := newCA(t, "fleet"), newCA(t, "other")
	srvCF, srvKF := write(t, issue(t, ca, localhost), dir, "srv")
	caFile, err := ca.WriteCA(dir, "ca")
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	kp, err := tlsutil.LoadKeyPair(srvCF, srvKF, log)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := tlsutil.LoadPool(caFile, log)
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := serve(t, tlsutil.ServerConfig(kp, pool))

	client := func(name string, c *testca.Issued, serverName string) error {
		o := tlsutil.ClientOptions{Roots: pool, ServerName: serverName}
		if c != nil {
			cf, kf := write(t, c, dir, name)
			ck, err := tlsutil.LoadKeyPair(cf, kf, log)
			if err != nil {
				return err
			}
			o.Cert = ck
		}
		return dial(addr, tlsutil.ClientConfig(o))
	}
	agent := testca.Leaf{CommonName: "smg:agent:gpu-7", Client: true}
	if err := client("good", issue(t, ca, agent), "localhost"); err != nil {
		t.Fatalf("a client certificate from the fleet CA was refused: %v", err)
	}
	if err := client("other", issue(t, other, agent), "localhost"); err == nil {
		t.Fatal("a client certificate from another CA was accepted")
	}
	if err := client("none", nil, "localhost"); err == nil {
		t.Fatal("a client without a certificate was accepted")
	}
	expired := agent
	expired.NotBefore, expired.NotAfter = time.Now().Add(-48*time.Hour), time.Now().Add(-time.Hour)
	exp := issue(t, ca, expired)
	cf, kf := write(t, exp, dir, "expired")
	ck, _ := tls.LoadX509KeyPair(cf, kf)
	cfg := tlsutil.ClientConfig(tlsutil.ClientOptions{Roots: pool, ServerName: "localhost"})
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &ck, nil }
	if err := dial(addr, cfg); err == nil {
		t.Fatal("an expired client certificate was accepted")
	}
	// The client side refuses a server whose certificate does not name it.
	if err := client("good2", issue(t, ca, agent), "controlplane.example"); err == nil {
		t.Fatal("a server certificate without the expected name was accepted")
	}
}

func TestClientFollowsARotatedCABundle(t *testing.T) {
	dir := t.TempDir()
	oldCA, newCAuth := newCA(t, "old"), newCA(t, "new")
	log := slog.New(slog.DiscardHandler)
	caFile, _ := oldCA.WriteCA(dir, "ca")
	pool, err := tlsutil.LoadPool(caFile, log)
	if err != nil {
		t.Fatal(err)
	}
	cf, kf := write(t, issue(t, newCAuth, localhost), dir, "srv")
	kp, _ := tlsutil.LoadKeyPair(cf, kf, log)
	addr, _ := serve(t, tlsutil.ServerConfig(kp, nil))
	cfg := tlsutil.ClientConfig(tlsutil.ClientOptions{Roots: pool, ServerName: "localhost"})
	if err := dial(addr, cfg); err == nil {
		t.Fatal("a server signed by a CA the bundle lacks was accepted")
	}
	if _, err := newCAuth.WriteCA(dir, "ca"); err != nil {
		t.Fatal(err)
	}
	if err := pool.Reload(); err != nil {
		t.Fatal(err)
	}
	if err := dial(addr, cfg); err != nil {
		t.Fatalf("after the bundle rotated, the same config still refuses: %v", err)
	}
}

func TestIdentityOf(t *testing.T) {
	ca := newCA(t, "ca")
	for _, tc := range []struct {
		leaf testca.Leaf
		want tlsutil.Identity
		ok   bool
	}{
		{testca.Leaf{URIs: []string{"spiffe://example.org/ns/smg/agent/gpu-7"}}, tlsutil.Identity{Role: "agent", Name: "gpu-7"}, true},
		{testca.Leaf{URIs: []string{"spiffe://example.org/router/r-1"}}, tlsutil.Identity{Role: "router", Name: "r-1"}, true},
		{testca.Leaf{CommonName: "smg:agent:gpu-9"}, tlsutil.Identity{Role: "agent", Name: "gpu-9"}, true},
		{testca.Leaf{CommonName: "smg:router:edge-2"}, tlsutil.Identity{Role: "router", Name: "edge-2"}, true},
		{testca.Leaf{CommonName: "smg:controlplane:cp0"}, tlsutil.Identity{Role: "controlplane", Name: "cp0"}, true},
		{testca.Leaf{URIs: []string{"spiffe://example.org/ns/smg/controlplane/cp-1"}}, tlsutil.Identity{Role: "controlplane", Name: "cp-1"}, true},
		// The URI SAN wins over the common name.
		{testca.Leaf{CommonName: "smg:agent:cn", URIs: []string{"spiffe://d/agent/uri"}}, tlsutil.Identity{Role: "agent", Name: "uri"}, true},
		{testca.Leaf{CommonName: "smg:router:*"}, tlsutil.Identity{Role: "router", Name: tlsutil.AnyName}, true},
		{testca.Leaf{CommonName: "gpu-7"}, tlsutil.Identity{}, false},
		{testca.Leaf{CommonName: "smg:admin:x"}, tlsutil.Identity{}, false},
		{testca.Leaf{CommonName: "smg:agent:"}, tlsutil.Identity{}, false},
		{testca.Leaf{URIs: []string{"https://example.org/agent/gpu-7"}}, tlsutil.Identity{}, false},
		{testca.Leaf{URIs: []string{"spiffe://example.org/agent"}}, tlsutil.Identity{}, false},
	} {
		got, err := tlsutil.IdentityOf(issue(t, ca, tc.leaf).Cert)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("%+v: got %+v, %v; want %+v ok=%v", tc.leaf, got, err, tc.want, tc.ok)
		}
	}
}

func TestExpiryMetricReadsTheCertificateInUse(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, "ca")
	notAfter := time.Now().Add(10 * 24 * time.Hour).Truncate(time.Second)
	leaf := localhost
	leaf.NotAfter = notAfter
	cf, kf := write(t, issue(t, ca, leaf), dir, "srv")
	kp, err := tlsutil.LoadKeyPair(cf, kf, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	now := notAfter.Add(-3 * 24 * time.Hour)
	if err := tlsutil.RegisterExpiry(reg, "grpc", kp, func() time.Time { return now }); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP smg_tls_certificate_expiry_seconds Seconds until the TLS certificate in use expires (negative once expired), by listener or client link.
# TYPE smg_tls_certificate_expiry_seconds gauge
smg_tls_certificate_expiry_seconds{listener="grpc"} 259200
`
	if err := promtest.GatherAndCompare(reg, strings.NewReader(want), "smg_tls_certificate_expiry_seconds"); err != nil {
		t.Fatal(err)
	}
	// A second listener registers beside the first.
	if err := tlsutil.RegisterExpiry(reg, "http", kp, time.Now); err != nil {
		t.Fatal(err)
	}
	if n := promtest.CollectAndCount(reg, "smg_tls_certificate_expiry_seconds"); n != 2 {
		t.Fatalf("%d series, want 2", n)
	}
}

func TestPeerNameBindsAgentsToTheirCertificate(t *testing.T) {
	ca := newCA(t, "ca")
	ctxWith := func(cn string) context.Context {
		c := issue(t, ca, testca.Leaf{CommonName: cn, Client: true}).Cert
		info := credentials.TLSInfo{State: tls.ConnectionState{PeerCertificates: []*x509.Certificate{c}, VerifiedChains: [][]*x509.Certificate{{c}}}}
		return peer.NewContext(context.Background(), &peer.Peer{AuthInfo: info})
	}
	for _, tc := range []struct {
		cn, role, claimed, want string
		code                    codes.Code
	}{
		{"smg:agent:gpu-7", "agent", "gpu-7", "gpu-7", codes.OK},
		{"smg:agent:gpu-7", "agent", "", "gpu-7", codes.OK},
		{"smg:agent:gpu-7", "agent", "gpu-8", "", codes.PermissionDenied},
		{"smg:agent:*", "agent", "gpu-8", "gpu-8", codes.OK},
		{"smg:router:r-1", "router", "host-123", "r-1", codes.OK}, // a router's claim yields
		{"smg:router:r-1", "agent", "gpu-7", "", codes.PermissionDenied},
		{"gpu-7", "agent", "gpu-7", "", codes.Unauthenticated},
	} {
		got, err := tlsutil.PeerName(ctxWith(tc.cn), tc.role, tc.claimed)
		if status.Code(err) != tc.code || got != tc.want {
			t.Errorf("cert %q as %s claiming %q: got %q, %v; want %q, %v", tc.cn, tc.role, tc.claimed, got, err, tc.want, tc.code)
		}
	}
	// No TLS (plaintext or no client certificate): the claim stands.
	if got, err := tlsutil.PeerName(context.Background(), "agent", "gpu-7"); err != nil || got != "gpu-7" {
		t.Errorf("no peer: %q, %v", got, err)
	}
}

// A server dialled by IP must be named in the certificate too: Go sends no
// IP as SNI, and a certificate of the same CA for another host (an agent's,
// say) must not pass for the control plane at 127.0.0.1.
func TestClientsCheckTheHostOfAServerDialledByIP(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, "fleet")
	caFile, err := ca.WriteCA(dir, "ca")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := tlsutil.LoadPool(caFile, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		leaf testca.Leaf
		ok   bool
	}{
		{"named by IP", localhost, true},
		{"another host's", testca.Leaf{CommonName: "gpu-7", DNSNames: []string{"gpu-7"}}, false},
	} {
		cf, kf := write(t, issue(t, ca, tc.leaf), dir, "srv")
		kp, err := tlsutil.LoadKeyPair(cf, kf, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		addr, _ := serve(t, tlsutil.ServerConfig(kp, nil, "h2"))
		o := tlsutil.ClientOptions{Roots: pool}
		c, err := tlsutil.DialTLSContext(o)(context.Background(), "tcp", addr)
		if err == nil {
			c.Close()
		}
		if (err == nil) != tc.ok {
			t.Errorf("%s: https dial by IP: %v, want ok=%v", tc.name, err, tc.ok)
		}
		raw, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conn, _, err := tlsutil.Credentials(o).ClientHandshake(context.Background(), addr, raw)
		if err == nil {
			conn.Close()
		} else {
			raw.Close()
		}
		if (err == nil) != tc.ok {
			t.Errorf("%s: gRPC handshake by IP: %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}
