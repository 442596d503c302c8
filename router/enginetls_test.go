package router

import (
	"crypto/tls"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/smg-project/smg/internal/tlsutil"
	"github.com/smg-project/smg/internal/tlsutil/testca"
)

// An https engine dialled by IP (the URL discovery and most registrations
// give) must be named by IP in its certificate: a certificate of the same CA
// issued for another host does not pass for it (Go sends no IP as SNI, so a
// bundle check on the transport's TLSClientConfig saw no name at all).
func TestHTTPSEngineDialledByIPMustBeNamedInItsCertificate(t *testing.T) {
	ca := testca.NewDir(t, "engines")
	pool, err := tlsutil.LoadPool(ca.CAFile, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		leaf testca.Leaf
		want int
	}{
		{"named by its IP", testca.Leaf{CommonName: "engine", IPs: []net.IP{net.ParseIP("127.0.0.1")}}, http.StatusOK},
		{"another host's", testca.Leaf{CommonName: "gpu-7", DNSNames: []string{"gpu-7"}}, http.StatusBadGateway},
	} {
		t.Run(tc.name, func(t *testing.T) {
			issued, err := ca.CA.Issue(tc.leaf)
			if err != nil {
				t.Fatal(err)
			}
			e := newEngine(t, "https-engine", nil)
			e.srv.Close()
			e.srv = httptest.NewUnstartedServer(e.srv.Config.Handler)
			cert, err := tls.X509KeyPair(issued.CertPEM, issued.KeyPEM)
			if err != nil {
				t.Fatal(err)
			}
			e.srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
			e.srv.StartTLS()
			t.Cleanup(e.srv.Close)

			h := newHarness(t, func(o *Options) {
				o.EngineTLS = &tlsutil.ClientOptions{Roots: pool}
				o.RetryMaxRetries = 0
			})
			h.apply(e.worker())
			got := h.post(testModel, "", "hello")
			if got.status != tc.want {
				t.Fatalf("status %d (%s), want %d", got.status, got.body, tc.want)
			}
		})
	}
}
