// Package tlsutil loads TLS certificates, keys and CA bundles from files and
// reloads them when the files change (cert-manager and SPIFFE helpers rotate
// them in place), so new handshakes use the new material while established
// connections continue. A reload that fails (unreadable, unparsable, a key
// that does not match, a certificate already expired) is logged at ERROR and
// the last good material stays in use.
//
// It loads and reloads material; what a peer's identity allows is its
// caller's.
package tlsutil

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"time"
)

// ReloadInterval is how often the files are checked for a change (a stat of
// each file; they are read only when one changed).
const ReloadInterval = time.Second

// stamp identifies a file's content cheaply: a rotation replaces the file (or
// the symlink Kubernetes swaps), which changes at least one of these.
type stamp struct {
	mod   time.Time
	size  int64
	inode uint64
}

func statStamp(path string) (stamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return stamp{}, err
	}
	s := stamp{mod: fi.ModTime(), size: fi.Size()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.inode = st.Ino
	}
	return s, nil
}

// watched is the part every reloadable file set shares: the paths, their
// stamps at the last load, and the logger.
type watched struct {
	paths  []string
	stamps []stamp
	log    *slog.Logger
	now    func() time.Time
}

// changed reports whether any file's stamp moved since the last load.
func (w *watched) changed() (bool, []stamp) {
	cur := make([]stamp, len(w.paths))
	moved := false
	for i, p := range w.paths {
		s, err := statStamp(p)
		if err != nil {
			// A missing file mid-rotation: try again next tick; loading would fail.
			return true, nil
		}
		cur[i] = s
		if i >= len(w.stamps) || s != w.stamps[i] {
			moved = true
		}
	}
	return moved, cur
}

// KeyPair is a certificate and key loaded from files.
type KeyPair struct {
	watched
	certFile, keyFile string
	mu                sync.RWMutex
	cert              *tls.Certificate
	leaf              *x509.Certificate
	lastErr           string // the last reload error logged, so a bad file is logged once per change
}

// LoadKeyPair loads the pair; at start a bad pair is an error (the process
// refuses to start), later ones are logged and skipped.
func LoadKeyPair(certFile, keyFile string, log *slog.Logger) (*KeyPair, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("a certificate needs both a cert file and a key file")
	}
	k := &KeyPair{watched: watched{paths: []string{certFile, keyFile}, log: log, now: time.Now}, certFile: certFile, keyFile: keyFile}
	_, stamps := k.changed()
	cert, leaf, err := loadPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	if now := k.now(); now.After(leaf.NotAfter) {
		return nil, fmt.Errorf("certificate %s expired at %s", certFile, leaf.NotAfter.Format(time.RFC3339))
	}
	k.cert, k.leaf, k.stamps = cert, leaf, stamps
	return k, nil
}

func loadPair(certFile, keyFile string) (*tls.Certificate, *x509.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("load %s / %s: %w", certFile, keyFile, err)
	}
	leaf := cert.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, nil, fmt.Errorf("parse %s: %w", certFile, err)
		}
	}
	return &cert, leaf, nil
}

// Reload loads the files again if they changed. It returns the error of a
// failed reload (also logged); the previous pair stays in use.
func (k *KeyPair) Reload() error {
	moved, stamps := k.changed()
	if !moved {
		return nil
	}
	cert, leaf, err := loadPair(k.certFile, k.keyFile)
	if err == nil && k.now().After(leaf.NotAfter) {
		err = fmt.Errorf("certificate %s expired at %s", k.certFile, leaf.NotAfter.Format(time.RFC3339))
	}
	if err != nil {
		k.mu.Lock()
		first := err.Error() != k.lastErr
		k.lastErr = err.Error()
		if stamps != nil {
			k.stamps = stamps // log a bad file once, not every tick; a new change is tried again
		}
		k.mu.Unlock()
		if first {
			k.log.Error("TLS certificate reload failed: the last good certificate stays in use",
				"cert_file", k.certFile, "key_file", k.keyFile, "err", err, "in_use_not_after", k.NotAfter())
		}
		return err
	}
	k.mu.Lock()
	k.cert, k.leaf, k.stamps, k.lastErr = cert, leaf, stamps, ""
	k.mu.Unlock()
	k.log.Info("TLS certificate reloaded", "cert_file", k.certFile, "subject", leaf.Subject.String(),
		"not_after", leaf.NotAfter.Format(time.RFC3339), "fingerprint", Fingerprint(leaf))
	return nil
}

// Certificate is the pair in use.
func (k *KeyPair) Certificate() *tls.Certificate {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.cert
}

// NotAfter is the expiry of the certificate in use.
func (k *KeyPair) NotAfter() time.Time {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.leaf.NotAfter
}

// Leaf is the certificate in use, parsed.
func (k *KeyPair) Leaf() *x509.Certificate {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.leaf
}

// Pool is a CA bundle loaded from a file.
type Pool struct {
	watched
	file    string
	mu      sync.RWMutex
	pool    *x509.CertPool
	lastErr string
}

// LoadPool loads a PEM bundle of CA certificates.
func LoadPool(file string, log *slog.Logger) (*Pool, error) {
	p := &Pool{watched: watched{paths: []string{file}, log: log, now: time.Now}, file: file}
	_, stamps := p.changed()
	pool, err := loadPool(file)
	if err != nil {
		return nil, err
	}
	p.pool, p.stamps = pool, stamps
	return p, nil
}

func loadPool(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("CA file %s holds no PEM certificate", file)
	}
	return pool, nil
}

// Reload loads the bundle again if the file changed; on failure the previous
// bundle stays in use.
func (p *Pool) Reload() error {
	moved, stamps := p.changed()
	if !moved {
		return nil
	}
	pool, err := loadPool(p.file)
	if err != nil {
		p.mu.Lock()
		first := err.Error() != p.lastErr
		p.lastErr = err.Error()
		if stamps != nil {
			p.stamps = stamps
		}
		p.mu.Unlock()
		if first {
			p.log.Error("TLS CA bundle reload failed: the last good bundle stays in use", "ca_file", p.file, "err", err)
		}
		return err
	}
	p.mu.Lock()
	p.pool, p.stamps, p.lastErr = pool, stamps, ""
	p.mu.Unlock()
	p.log.Info("TLS CA bundle reloaded", "ca_file", p.file)
	return nil
}

// CertPool is the bundle in use.
func (p *Pool) CertPool() *x509.CertPool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.pool
}

// Reloader is anything Watch keeps fresh (a KeyPair or a Pool).
type Reloader interface{ Reload() error }

// Watch reloads each item every ReloadInterval until ctx ends.
func Watch(ctx context.Context, items ...Reloader) {
	if len(items) == 0 {
		return
	}
	t := time.NewTicker(ReloadInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			for _, it := range items {
				_ = it.Reload() // logged inside
			}
		}
	}
}
