package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/tlsutil"
	"github.com/smg-project/smg/internal/tlsutil/testca"
)

// pki is a throwaway CA and the certificates one TLS fleet needs, as files.
type pki struct {
	*testca.Dir
	caFile string
	pool   *x509.CertPool
}

func newPKI(t *testing.T, name string) *pki {
	t.Helper()
	d := testca.NewDir(t, name)
	pool := x509.NewCertPool()
	pool.AddCert(d.CA.Cert)
	return &pki{Dir: d, caFile: d.CAFile, pool: pool}
}

// issue writes a certificate for loopback (server use) that may also serve
// as a client certificate with the given common name.
func (p *pki) issue(name, commonName string, mod ...func(*testca.Leaf)) (certFile, keyFile string, cert *x509.Certificate) {
	return p.Issue(name, commonName, mod...)
}

func (p *pki) httpClient() *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: p.pool}}}
}

func httpsGet(c *http.Client, url string) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// serverFingerprint dials addr and returns the fingerprint of the
// certificate the server presents (alpn "": no ALPN, as Raft's port).
func serverFingerprint(t *testing.T, addr string, pool *x509.CertPool, clientCert *tls.Certificate, alpn string) string {
	t.Helper()
	cfg := &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}
	if alpn != "" {
		cfg.NextProtos = []string{alpn}
	}
	if clientCert != nil {
		cfg.Certificates = []tls.Certificate{*clientCert}
	}
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 3 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	defer c.Close()
	return tlsutil.Fingerprint(c.ConnectionState().PeerCertificates[0])
}

// grpcList calls WorkerService.ListWorkers over TLS with the given client
// config: how a client with a bad certificate is shown the door.
func grpcList(addr string, cfg *tls.Config) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err = smgv1.NewWorkerServiceClient(conn).ListWorkers(ctx, &smgv1.ListWorkersRequest{})
	return err
}

// TLS on every link: an engine over https, an agent and a router on mutual
// TLS to the control plane, the router serving https to its clients; a
// request streams through; bad client certificates are refused with a log
// line on both sides; certificates rotate under running processes without
// cutting the watch stream.
func TestTLSEveryLinkMutualTLSAndRotation(t *testing.T) {
	p := newPKI(t, "fleet-ca")
	engCert, engKey, _ := p.issue("engine", "engine")
	cpCert, cpKey, cpLeaf := p.issue("cp", "controlplane")
	rCert, rKey, _ := p.issue("router-server", "router")
	agentCert, agentKey, _ := p.issue("agent", "smg:agent:node-a")
	routerClientCert, routerClientKey, _ := p.issue("router-client", "", func(l *testca.Leaf) {
		l.URIs = []string{"spiffe://example.org/ns/smg/router/r-tls"}
	})

	sim := startSMG(t, "sim", "sim", "--port", "0", "--log-level", "warn", "--tls-cert-file", engCert, "--tls-key-file", engKey)
	engineURL := sim.lines(1, 20*time.Second)[0]
	if !strings.HasPrefix(engineURL, "https://") {
		t.Fatalf("a TLS simulator printed %q, want an https URL", engineURL)
	}

	cpHTTP, cpGRPC := freePort(t), freePort(t)
	cp := startSMG(t, "controlplane", "controlplane", "--port", strconv.Itoa(cpHTTP), "--grpc-port", strconv.Itoa(cpGRPC),
		"--tls-cert-file", cpCert, "--tls-key-file", cpKey, "--tls-client-ca-file", p.caFile, "--engine-ca-file", p.caFile,
		"--worker-urls", engineURL)
	cpGRPCAddr := "127.0.0.1:" + strconv.Itoa(cpGRPC)
	agent := startSMG(t, "agent", "agent", "--port", strconv.Itoa(freePort(t)), "--node", "node-a",
		"--controlplane", cpGRPCAddr, "--controlplane-ca-file", p.caFile, "--controlplane-server-name", "127.0.0.1",
		"--controlplane-cert-file", agentCert, "--controlplane-key-file", agentKey,
		"--engine-ca-file", p.caFile, "--engine-urls", engineURL, "--poll-interval", "200ms")
	rPort := freePort(t)
	startSMG(t, "router", "router", "--port", strconv.Itoa(rPort), "--router-id", "claimed-id",
		"--controlplane", cpGRPCAddr, "--controlplane-ca-file", p.caFile,
		"--controlplane-cert-file", routerClientCert, "--controlplane-key-file", routerClientKey,
		"--tls-cert-file", rCert, "--tls-key-file", rKey, "--engine-ca-file", p.caFile)

	hc := p.httpClient()
	cpBase := "https://127.0.0.1:" + strconv.Itoa(cpHTTP)
	routerBase := "https://127.0.0.1:" + strconv.Itoa(rPort)

	// The worker is Ready (health probes over https) and fed by the agent,
	// which the control plane knows by its certificate's node.
	waitFor(t, 20*time.Second, "the https engine Ready and fed by agent node-a", func() (bool, string) {
		code, b, err := httpsGet(hc, cpBase+"/workers")
		if err != nil || code != http.StatusOK {
			return false, fmt.Sprint(code, err)
		}
		var body struct {
			Workers []struct {
				Ready     bool   `json:"ready"`
				AgentNode string `json:"agent_node"`
			} `json:"workers"`
		}
		if err := json.Unmarshal(b, &body); err != nil || len(body.Workers) != 1 {
			return false, string(b)
		}
		return body.Workers[0].Ready && body.Workers[0].AgentNode == "node-a", string(b)
	})
	// The router is named by its certificate, not by the id it claimed.
	waitFor(t, 10*time.Second, "router r-tls on the control plane", func() (bool, string) {
		_, b, err := httpsGet(hc, cpBase+"/routers")
		return err == nil && strings.Contains(string(b), `"router_id":"r-tls"`), string(b)
	})

	// A request streams through: client -https-> router -https-> engine.
	streamThrough := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, routerBase+"/v1/chat/completions", bytes.NewReader(chatBody(8, true)))
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		a := answer{status: resp.StatusCode, header: resp.Header, body: b}
		return a.completeStream()
	}
	waitFor(t, 15*time.Second, "a stream through the TLS router", func() (bool, string) {
		err := streamThrough()
		return err == nil, fmt.Sprint(err)
	})
	// The plaintext port answers nothing useful to a plaintext client.
	if _, _, err := httpsGet(http.DefaultClient, strings.Replace(routerBase, "https", "http", 1)+"/health"); err == nil {
		code, _, _ := httpsGet(http.DefaultClient, strings.Replace(routerBase, "https", "http", 1)+"/health")
		if code == http.StatusOK {
			t.Error("the TLS router answered plaintext HTTP")
		}
	}

	// Refused clients, with a log line on the control plane.
	other := newPKI(t, "other-ca")
	otherCert, otherKey, _ := other.issue("stranger", "smg:agent:node-a")
	load := func(cf, kf string) tls.Certificate {
		c, err := tls.LoadX509KeyPair(cf, kf)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	expCert, expKey, _ := p.issue("expired", "smg:agent:node-a", func(l *testca.Leaf) {
		l.NotBefore, l.NotAfter = time.Now().Add(-48*time.Hour), time.Now().Add(-time.Hour)
	})
	good := load(agentCert, agentKey)
	for _, tc := range []struct {
		name string
		cfg  *tls.Config
	}{
		{"a certificate from another CA", &tls.Config{RootCAs: p.pool, ServerName: "127.0.0.1", Certificates: []tls.Certificate{load(otherCert, otherKey)}}},
		{"no certificate", &tls.Config{RootCAs: p.pool, ServerName: "127.0.0.1"}},
		{"an expired certificate", &tls.Config{RootCAs: p.pool, ServerName: "127.0.0.1", Certificates: []tls.Certificate{load(expCert, expKey)}}},
		{"the wrong server name", &tls.Config{RootCAs: p.pool, ServerName: "controlplane.example", Certificates: []tls.Certificate{good}}},
	} {
		before := strings.Count(cp.stderr.String(), "TLS handshake refused")
		err := grpcList(cpGRPCAddr, tc.cfg)
		if err == nil {
			t.Errorf("%s: the control plane answered", tc.name)
			continue
		}
		waitFor(t, 5*time.Second, tc.name+": a log line on the control plane", func() (bool, string) {
			return strings.Count(cp.stderr.String(), "TLS handshake refused") > before, tail(cp.stderr.String(), 500)
		})
		t.Logf("%s: client saw %v", tc.name, err)
	}
	if err := grpcList(cpGRPCAddr, &tls.Config{RootCAs: p.pool, ServerName: "127.0.0.1", Certificates: []tls.Certificate{good}}); err != nil {
		t.Fatalf("a client with a good certificate was refused: %v", err)
	}

	// An agent whose certificate names node-a cannot report as node-b; both sides say so.
	liar := startSMG(t, "agent-liar", "agent", "--port", strconv.Itoa(freePort(t)), "--node", "node-b",
		"--controlplane", cpGRPCAddr, "--controlplane-ca-file", p.caFile, "--controlplane-server-name", "127.0.0.1",
		"--controlplane-cert-file", agentCert, "--controlplane-key-file", agentKey, "--engine-urls", engineURL)
	waitFor(t, 10*time.Second, "the lying agent refused on both sides", func() (bool, string) {
		return strings.Contains(cp.stderr.String(), "credentials_node=node-a hello_node=node-b") &&
				strings.Contains(liar.stderr.String(), "node-b"),
			tail(cp.stderr.String(), 400) + " | " + tail(liar.stderr.String(), 400)
	})
	liar.kill()

	// The expiry metric reads the served certificate's NotAfter.
	_, page, err := httpsGet(hc, cpBase+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	got := metricSum(string(page), "smg_tls_certificate_expiry_seconds", `listener="server"`)
	if want := time.Until(cpLeaf.NotAfter).Seconds(); got < want-60 || got > want+1 {
		t.Errorf("smg_tls_certificate_expiry_seconds{listener=server} = %v, want about %v", got, want)
	}

	// Rotation: new files under the running control plane and router. New
	// handshakes present the new certificates; the open watch stream and
	// the agent stream are not cut.
	clientPair := load(agentCert, agentKey)
	oldCP := serverFingerprint(t, cpGRPCAddr, p.pool, &clientPair, "h2")
	oldRouter := serverFingerprint(t, "127.0.0.1:"+strconv.Itoa(rPort), p.pool, nil, "http/1.1")
	if oldCP != tlsutil.Fingerprint(cpLeaf) {
		t.Fatal("the control plane does not present its certificate")
	}
	_, _, newCPLeaf := p.issue("cp", "controlplane")
	_, _, newRouterLeaf := p.issue("router-server", "router")
	waitFor(t, 10*time.Second, "the rotated certificates served", func() (bool, string) {
		cpNow := serverFingerprint(t, cpGRPCAddr, p.pool, &clientPair, "h2")
		rNow := serverFingerprint(t, "127.0.0.1:"+strconv.Itoa(rPort), p.pool, nil, "http/1.1")
		return cpNow == tlsutil.Fingerprint(newCPLeaf) && rNow == tlsutil.Fingerprint(newRouterLeaf),
			fmt.Sprintf("control plane %.12s (old %.12s), router %.12s (old %.12s)", cpNow, oldCP, rNow, oldRouter)
	})
	if n := strings.Count(cp.stderr.String(), "router stream ended"); n != 0 {
		t.Errorf("the watch stream was cut by the rotation (%d ends):\n%s", n, tail(cp.stderr.String(), 1500))
	}
	if strings.Contains(agent.stderr.String(), "Control plane stream lost") || strings.Count(cp.stderr.String(), "Agent disconnected") > 0 {
		t.Errorf("the agent stream was cut by the rotation:\n%s", tail(agent.stderr.String(), 1000))
	}
	if err := streamThrough(); err != nil {
		t.Fatalf("after the rotation, a stream through the router: %v", err)
	}
}
