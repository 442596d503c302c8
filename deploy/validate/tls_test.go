package validate

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	certmanagerv1 "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	corev1 "k8s.io/api/core/v1"
)

// tlsFileFlags are smg's flags that name a certificate, key or CA file.
var tlsFileFlags = []string{
	"tls-cert-file", "tls-key-file", "tls-client-ca-file",
	"controlplane-ca-file", "controlplane-cert-file", "controlplane-key-file", "engine-ca-file",
	"raft-tls-cert-file", "raft-tls-key-file", "raft-tls-ca-file",
}

// secretKeys are the files cert-manager writes into a certificate's Secret.
var secretKeys = []string{"tls.crt", "tls.key", "ca.crt"}

// tlsFile is where a TLS flag's file comes from: a key of a Secret that a
// Certificate of the render issues.
type tlsFile struct {
	flag, path string
	secret     string
	key        string
	cert       *certmanagerv1.Certificate
}

// tlsFiles resolves every TLS file flag of a workload to its Secret and
// Certificate; what does not resolve is a test error.
func tlsFiles(t *testing.T, o *Objects, w Workload, flags map[string][]string) []tlsFile {
	t.Helper()
	where := w.Kind + "/" + w.Name
	c := w.Template.Spec.Containers[0]
	var out []tlsFile
	for _, f := range tlsFileFlags {
		path := last(flags[f])
		if path == "" {
			continue
		}
		var vol *corev1.Volume
		for _, m := range c.VolumeMounts {
			if strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/") {
				for i := range w.Template.Spec.Volumes {
					if w.Template.Spec.Volumes[i].Name == m.Name {
						vol = &w.Template.Spec.Volumes[i]
					}
				}
				if !m.ReadOnly {
					t.Errorf("%s: the mount of --%s must be readOnly", where, f)
				}
			}
		}
		if vol == nil || vol.Secret == nil {
			t.Errorf("%s: --%s %s is not in a mounted Secret", where, f, path)
			continue
		}
		key := filepath.Base(path)
		if !slices.Contains(secretKeys, key) {
			t.Errorf("%s: --%s %s: a cert-manager Secret holds %v, not %s", where, f, path, secretKeys, key)
		}
		var cert *certmanagerv1.Certificate
		for i := range o.Certificates {
			if o.Certificates[i].Spec.SecretName == vol.Secret.SecretName {
				cert = &o.Certificates[i]
			}
		}
		if cert == nil {
			t.Errorf("%s: --%s reads Secret %s, which no Certificate issues", where, f, vol.Secret.SecretName)
			continue
		}
		out = append(out, tlsFile{flag: f, path: path, secret: vol.Secret.SecretName, key: key, cert: cert})
	}
	return out
}

// checkTLS: files come from Certificates the render issues with the right
// usages and names, clients trust what servers serve, probes speak HTTPS.
func checkTLS(t *testing.T, o *Objects, byCmd map[string]Workload, cmdFlags map[string]map[string][]string) {
	t.Helper()
	for _, c := range o.Certificates {
		if !slices.ContainsFunc(o.Issuers, func(i certmanagerv1.Issuer) bool { return i.Name == c.Spec.IssuerRef.Name }) {
			t.Errorf("Certificate/%s: issuerRef %s names no Issuer of the render", c.Name, c.Spec.IssuerRef.Name)
		}
	}
	cpFlags := cmdFlags["controlplane"]
	cpServes := last(cpFlags["tls-cert-file"]) != ""
	mutual := last(cpFlags["tls-client-ca-file"]) != ""
	if mutual && !cpServes {
		t.Error("controlplane: --tls-client-ca-file without --tls-cert-file")
	}
	for cmd, w := range byCmd {
		flags := cmdFlags[cmd]
		files := tlsFiles(t, o, w, flags)
		for _, f := range files {
			usages := f.cert.Spec.Usages
			switch f.flag {
			case "tls-cert-file":
				if !slices.Contains(usages, certmanagerv1.UsageServerAuth) {
					t.Errorf("%s: --tls-cert-file from Certificate/%s without \"server auth\"", cmd, f.cert.Name)
				}
				// A follower presents it to the leader's gRPC port, which
				// asks for client certificates.
				if cmd == "controlplane" && mutual && last(flags["raft-peers"]) != "" && !slices.Contains(usages, certmanagerv1.UsageClientAuth) {
					t.Errorf("controlplane: replicated with --tls-client-ca-file, but Certificate/%s lacks \"client auth\": followers could not forward admin calls to the leader", f.cert.Name)
				}
			case "raft-tls-cert-file":
				checkRaftCert(t, f.cert, flags)
			case "controlplane-cert-file":
				if !slices.Contains(usages, certmanagerv1.UsageClientAuth) {
					t.Errorf("%s: --controlplane-cert-file from Certificate/%s without \"client auth\"", cmd, f.cert.Name)
				}
				if want := "smg:" + cmd + ":"; !strings.HasPrefix(f.cert.Spec.CommonName, want) {
					t.Errorf("%s: client Certificate/%s has common name %q, want %s<name or *> (docs/tls.md)", cmd, f.cert.Name, f.cert.Spec.CommonName, want)
				}
			}
		}
		if last(flags["tls-cert-file"]) != "" {
			c := w.Template.Spec.Containers[0]
			for kind, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
				if p != nil && p.HTTPGet != nil && p.HTTPGet.Scheme != corev1.URISchemeHTTPS {
					t.Errorf("%s: serves TLS but its %s probe asks plain HTTP", cmd, kind)
				}
				if p != nil && p.GRPC != nil {
					t.Errorf("%s: serves TLS but its %s probe is gRPC (Kubernetes' gRPC probes do not speak TLS)", cmd, kind)
				}
			}
		}
		if cmd == "controlplane" {
			continue
		}
		switch {
		case cpServes && last(flags["controlplane-ca-file"]) == "":
			t.Errorf("%s: the control plane serves TLS but --controlplane-ca-file is not set", cmd)
		case mutual && last(flags["controlplane-cert-file"]) == "":
			t.Errorf("%s: the control plane requires client certificates but --controlplane-cert-file is not set", cmd)
		}
		if cpServes && last(flags["controlplane-server-name"]) == "" {
			// Every replica it may dial, or be sent to as the leader.
			for _, addr := range strings.Split(last(flags["controlplane"]), ",") {
				host, _, _ := strings.Cut(addr, ":")
				for _, f := range tlsFiles(t, o, byCmd["controlplane"], cpFlags) {
					if f.flag == "tls-cert-file" && !slices.Contains(f.cert.Spec.DNSNames, host) {
						t.Errorf("%s dials %s, which Certificate/%s does not name (dnsNames %v)", cmd, host, f.cert.Name, f.cert.Spec.DNSNames)
					}
				}
			}
		}
	}
}

// checkRaftCert: the Raft certificate is a server's and a client's, names a
// control plane (docs/ha.md#raft-security), and names every replica's host as
// --raft-peers gives it (the dialling replica checks the name it dialled). It
// comes from a CA other than the one the agents' and routers' certificates
// come from.
func checkRaftCert(t *testing.T, c *certmanagerv1.Certificate, flags map[string][]string) {
	t.Helper()
	for _, u := range []certmanagerv1.KeyUsage{certmanagerv1.UsageServerAuth, certmanagerv1.UsageClientAuth} {
		if !slices.Contains(c.Spec.Usages, u) {
			t.Errorf("--raft-tls-cert-file from Certificate/%s without %q", c.Name, u)
		}
	}
	if !strings.HasPrefix(c.Spec.CommonName, "smg:controlplane:") {
		t.Errorf("--raft-tls-cert-file from Certificate/%s with common name %q, want smg:controlplane:<id or *>", c.Name, c.Spec.CommonName)
	}
	if last(flags["raft-tls-server-name"]) == "" {
		for _, p := range strings.Split(last(flags["raft-peers"]), ",") {
			_, addr, _ := strings.Cut(p, "=")
			if host, _, _ := strings.Cut(addr, ":"); host != "" && !slices.Contains(c.Spec.DNSNames, host) {
				t.Errorf("replicas dial %s for Raft, which Certificate/%s does not name (dnsNames %v)", host, c.Name, c.Spec.DNSNames)
			}
		}
	}
	if c.Spec.IssuerRef.Name == "smg-ca" {
		t.Errorf("Certificate/%s: the Raft certificate comes from smg-ca, which signs agents and routers too; use a Raft-only CA", c.Name)
	}
}

// testPKI plays cert-manager for the live test: one CA, and for each Secret a
// certificate with its Certificate's common name, valid for loopback.
type testPKI struct {
	dir   string
	ca    *x509.Certificate
	caKey *ecdsa.PrivateKey
	caPEM []byte
	made  map[string]bool
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "smg-test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	return &testPKI{dir: t.TempDir(), ca: ca, caKey: key, caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), made: map[string]bool{}}
}

// files writes the Secret of each of the workload's TLS files and returns
// flag -> local path, for rewriteArgs.
func (p *testPKI) files(t *testing.T, o *Objects, w Workload, flags map[string][]string) map[string]string {
	t.Helper()
	set := map[string]string{}
	for _, f := range tlsFiles(t, o, w, flags) {
		dir := filepath.Join(p.dir, f.secret)
		if !p.made[f.secret] {
			p.issue(t, dir, f.cert)
			p.made[f.secret] = true
		}
		set[f.flag] = filepath.Join(dir, f.key)
	}
	return set
}

func (p *testPKI) issue(t *testing.T, dir string, c *certmanagerv1.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var usages []x509.ExtKeyUsage
	for _, u := range c.Spec.Usages {
		switch u {
		case certmanagerv1.UsageServerAuth:
			usages = append(usages, x509.ExtKeyUsageServerAuth)
		case certmanagerv1.UsageClientAuth:
			usages = append(usages, x509.ExtKeyUsageClientAuth)
		}
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: c.Spec.CommonName},
		DNSNames: append(slices.Clone(c.Spec.DNSNames), "localhost"), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: usages}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{
		"tls.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		"tls.key": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}),
		"ca.crt":  p.caPEM,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}
