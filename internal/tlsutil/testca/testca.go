// Package testca issues throwaway certificates for tests: a CA, and server or
// client certificates it signs, written as PEM files.
//
// It is for tests only; nothing in the smg binary imports it.
package testca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// CA is a self-signed certificate authority.
type CA struct {
	Cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	CertPEM []byte
}

// New makes a CA valid from an hour ago for a day.
func New(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// Leaf describes a certificate to issue.
type Leaf struct {
	CommonName string
	DNSNames   []string
	IPs        []net.IP
	URIs       []string
	NotBefore  time.Time // zero: an hour ago
	NotAfter   time.Time // zero: a day from now
	Client     bool      // client auth usage (server auth is always set)
}

// Issued is a certificate and its key, as PEM.
type Issued struct {
	Cert            *x509.Certificate
	CertPEM, KeyPEM []byte
}

// Issue signs a leaf certificate.
func (ca *CA) Issue(l Leaf) (*Issued, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	if l.NotBefore.IsZero() {
		l.NotBefore = time.Now().Add(-time.Hour)
	}
	if l.NotAfter.IsZero() {
		l.NotAfter = time.Now().Add(24 * time.Hour)
	}
	usages := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	if l.Client {
		usages = append(usages, x509.ExtKeyUsageClientAuth)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: l.CommonName},
		DNSNames:     l.DNSNames,
		IPAddresses:  l.IPs,
		NotBefore:    l.NotBefore,
		NotAfter:     l.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usages,
	}
	for _, s := range l.URIs {
		u, err := url.Parse(s)
		if err != nil {
			return nil, err
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return &Issued{
		Cert:    cert,
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}),
	}, nil
}

// Write writes the certificate and key as NAME.crt and NAME.key in dir and
// returns their paths. Files are replaced atomically (rename), as a rotation
// by cert-manager or a SPIFFE helper would.
func (i *Issued) Write(dir, name string) (certFile, keyFile string, err error) {
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := writeAtomic(keyFile, i.KeyPEM); err != nil {
		return "", "", err
	}
	if err := writeAtomic(certFile, i.CertPEM); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

// WriteCA writes the CA certificate as NAME.crt in dir.
func (ca *CA) WriteCA(dir, name string) (string, error) {
	f := filepath.Join(dir, name+".crt")
	return f, writeAtomic(f, ca.CertPEM)
}

func writeAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}

// T is the part of testing.T that Dir uses.
type T interface {
	Helper()
	Fatal(args ...any)
	TempDir() string
}

// Dir is a CA whose certificates are written as files in a test's temporary
// directory: what a test starting processes with --*-file flags needs.
type Dir struct {
	t      T
	CA     *CA
	Dir    string
	CAFile string // the CA certificate, ca.crt
}

// NewDir makes a CA and writes it as ca.crt in a fresh temporary directory.
func NewDir(t T, name string) *Dir {
	t.Helper()
	ca, err := New(name)
	if err != nil {
		t.Fatal(err)
	}
	d := &Dir{t: t, CA: ca, Dir: t.TempDir()}
	if d.CAFile, err = ca.WriteCA(d.Dir, "ca"); err != nil {
		t.Fatal(err)
	}
	return d
}

// Issue writes a certificate for loopback (127.0.0.1 and localhost; server
// and client use) with the common name, as NAME.crt and NAME.key; mod
// adjusts the leaf first. Issuing a name again replaces its files (a
// rotation).
func (d *Dir) Issue(name, commonName string, mod ...func(*Leaf)) (certFile, keyFile string, cert *x509.Certificate) {
	d.t.Helper()
	leaf := Leaf{CommonName: commonName, DNSNames: []string{"localhost"}, IPs: []net.IP{net.ParseIP("127.0.0.1")}, Client: true}
	for _, m := range mod {
		m(&leaf)
	}
	c, err := d.CA.Issue(leaf)
	if err != nil {
		d.t.Fatal(err)
	}
	cf, kf, err := c.Write(d.Dir, name)
	if err != nil {
		d.t.Fatal(err)
	}
	return cf, kf, c.Cert
}
