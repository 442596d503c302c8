package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/smg-project/smg/controlplane/cluster"
	"github.com/smg-project/smg/internal/tlsutil"
)

// tlsFlags are the TLS flags of one subcommand; each add* method declares
// the group a subcommand offers.
type tlsFlags struct {
	certFile, keyFile string // this process's certificate, served on its listeners
	clientCAFile      string // control plane: mutual TLS on the gRPC port

	cpCAFile, cpServerName, cpCertFile, cpKeyFile string // router, agent -> control plane

	engineCAFile, engineServerName string // -> https:// engines
	engineInsecure                 bool

	raftCertFile, raftKeyFile, raftCAFile, raftServerName string // control plane <-> control plane (Raft, joins)
}

func (t *tlsFlags) addServer(fs *flag.FlagSet) {
	fs.StringVar(&t.certFile, "tls-cert-file", "", "PEM certificate served on every listener of this process (with --tls-key-file; reloaded when the file changes; empty: plaintext)")
	fs.StringVar(&t.keyFile, "tls-key-file", "", "PEM private key of --tls-cert-file")
}

func (t *tlsFlags) addClientCA(fs *flag.FlagSet) {
	fs.StringVar(&t.clientCAFile, "tls-client-ca-file", "", "PEM CA bundle: agents and routers must present a client certificate it verifies on the gRPC port (mutual TLS; needs --tls-cert-file)")
}

func (t *tlsFlags) addControlPlaneClient(fs *flag.FlagSet) {
	fs.StringVar(&t.cpCAFile, "controlplane-ca-file", "", "PEM CA bundle that verifies the control plane's certificate; setting it dials the control plane over TLS")
	fs.StringVar(&t.cpServerName, "controlplane-server-name", "", "name expected in the control plane's certificate (empty: the host of --controlplane)")
	fs.StringVar(&t.cpCertFile, "controlplane-cert-file", "", "PEM client certificate presented to the control plane (mutual TLS; names this agent's node or this router's id)")
	fs.StringVar(&t.cpKeyFile, "controlplane-key-file", "", "PEM private key of --controlplane-cert-file")
}

// addRaft declares the Raft transport's own TLS: its certificate is both a
// server's and a client's, names a control plane, and is verified against a
// CA that should sign control planes only (not the agents' and routers').
func (t *tlsFlags) addRaft(fs *flag.FlagSet) {
	fs.StringVar(&t.raftCertFile, "raft-tls-cert-file", "", "PEM certificate of this control plane on the Raft transport, served and presented to peers (mutual TLS; names smg:controlplane:NODE-ID; with --raft-tls-key-file and --raft-tls-ca-file; reloaded when the file changes; empty: Raft in plaintext)")
	fs.StringVar(&t.raftKeyFile, "raft-tls-key-file", "", "PEM private key of --raft-tls-cert-file")
	fs.StringVar(&t.raftCAFile, "raft-tls-ca-file", "", "PEM CA bundle that every Raft peer's certificate, and every joining node's, must verify against (a CA that signs control planes only)")
	fs.StringVar(&t.raftServerName, "raft-tls-server-name", "", "name expected in every Raft peer's certificate when dialling it (empty: the host of the peer's Raft address)")
}

func (t *tlsFlags) addEngineClient(fs *flag.FlagSet) {
	fs.StringVar(&t.engineCAFile, "engine-ca-file", "", "PEM CA bundle that verifies https:// engines (empty: the system's roots)")
	fs.StringVar(&t.engineServerName, "engine-server-name", "", "name expected in every https:// engine's certificate (empty: each engine URL's host)")
	fs.BoolVar(&t.engineInsecure, "engine-tls-insecure-skip-verify", false, "accept any certificate from https:// engines (self-signed engines; the link is encrypted but not authenticated)")
}

// tlsSetup is the TLS material of one process, loaded at start (a bad file
// refuses the start) and reloaded while it runs.
type tlsSetup struct {
	log                      *slog.Logger
	server                   *tlsutil.KeyPair
	clientCAs, cpCAs, engCAs *tlsutil.Pool
	cpCert                   *tlsutil.KeyPair
	raftCert                 *tlsutil.KeyPair
	raftCAs                  *tlsutil.Pool
	f                        tlsFlags
}

func (t tlsFlags) load(log *slog.Logger, metrics prometheus.Registerer) (*tlsSetup, error) {
	s := &tlsSetup{log: log, f: t}
	var err error
	pair := func(cert, key, certFlag, keyFlag string) (*tlsutil.KeyPair, error) {
		switch {
		case cert == "" && key == "":
			return nil, nil
		case cert == "" || key == "":
			return nil, fmt.Errorf("--%s and --%s go together", certFlag, keyFlag)
		}
		kp, err := tlsutil.LoadKeyPair(cert, key, log)
		if err != nil {
			return nil, fmt.Errorf("--%s: %w", certFlag, err)
		}
		return kp, nil
	}
	pool := func(file, flagName string) (*tlsutil.Pool, error) {
		if file == "" {
			return nil, nil
		}
		p, err := tlsutil.LoadPool(file, log)
		if err != nil {
			return nil, fmt.Errorf("--%s: %w", flagName, err)
		}
		return p, nil
	}
	if s.server, err = pair(t.certFile, t.keyFile, "tls-cert-file", "tls-key-file"); err != nil {
		return nil, err
	}
	if s.cpCert, err = pair(t.cpCertFile, t.cpKeyFile, "controlplane-cert-file", "controlplane-key-file"); err != nil {
		return nil, err
	}
	if s.clientCAs, err = pool(t.clientCAFile, "tls-client-ca-file"); err != nil {
		return nil, err
	}
	if s.clientCAs != nil && s.server == nil {
		return nil, errors.New("--tls-client-ca-file needs --tls-cert-file and --tls-key-file (mutual TLS runs over TLS)")
	}
	if s.cpCAs, err = pool(t.cpCAFile, "controlplane-ca-file"); err != nil {
		return nil, err
	}
	if s.cpCert != nil && s.cpCAs == nil {
		return nil, errors.New("--controlplane-cert-file needs --controlplane-ca-file (a client certificate is sent over TLS only)")
	}
	if s.engCAs, err = pool(t.engineCAFile, "engine-ca-file"); err != nil {
		return nil, err
	}
	if t.engineInsecure && s.engCAs != nil {
		return nil, errors.New("--engine-tls-insecure-skip-verify and --engine-ca-file contradict each other: pick one")
	}
	if s.raftCert, err = pair(t.raftCertFile, t.raftKeyFile, "raft-tls-cert-file", "raft-tls-key-file"); err != nil {
		return nil, err
	}
	if s.raftCAs, err = pool(t.raftCAFile, "raft-tls-ca-file"); err != nil {
		return nil, err
	}
	if (s.raftCert == nil) != (s.raftCAs == nil) {
		return nil, errors.New("--raft-tls-cert-file, --raft-tls-key-file and --raft-tls-ca-file go together: Raft runs over mutual TLS, both sides verifying the other")
	}
	if t.raftServerName != "" && s.raftCert == nil {
		return nil, errors.New("--raft-tls-server-name needs --raft-tls-cert-file, --raft-tls-key-file and --raft-tls-ca-file")
	}
	now := time.Now
	if s.server != nil {
		if err := tlsutil.RegisterExpiry(metrics, "server", s.server, now); err != nil {
			return nil, err
		}
	}
	if s.cpCert != nil {
		if err := tlsutil.RegisterExpiry(metrics, "controlplane_client", s.cpCert, now); err != nil {
			return nil, err
		}
	}
	if s.raftCert != nil {
		if err := tlsutil.RegisterExpiry(metrics, "raft", s.raftCert, now); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// watch reloads every file until ctx ends.
func (s *tlsSetup) watch(ctx context.Context) {
	var items []tlsutil.Reloader
	for _, kp := range []*tlsutil.KeyPair{s.server, s.cpCert, s.raftCert} {
		if kp != nil {
			items = append(items, kp)
		}
	}
	for _, p := range []*tlsutil.Pool{s.clientCAs, s.cpCAs, s.engCAs, s.raftCAs} {
		if p != nil {
			items = append(items, p)
		}
	}
	tlsutil.Watch(ctx, items...)
}

// raftTLS is the Raft transport's TLS (nil: plaintext).
func (s *tlsSetup) raftTLS() *cluster.TLS {
	if s.raftCert == nil {
		return nil
	}
	return &cluster.TLS{Cert: s.raftCert, CA: s.raftCAs, ServerName: s.f.raftServerName}
}

// enabled reports whether this process serves TLS.
func (s *tlsSetup) enabled() bool { return s.server != nil }

// httpListener wraps ln in TLS when a certificate is configured.
func (s *tlsSetup) httpListener(ln net.Listener) net.Listener {
	if s.server == nil {
		return ln
	}
	return tls.NewListener(ln, tlsutil.ServerConfig(s.server, nil, "http/1.1"))
}

// httpErrorLog sends the standard library's refused-handshake lines to slog.
func (s *tlsSetup) httpErrorLog(listener string) *log.Logger {
	return log.New(tlsutil.ErrorLogWriter{Log: s.log, Listener: listener}, "", 0)
}

// grpcServerOptions secure the gRPC port (with mutual TLS when a client CA
// is set).
func (s *tlsSetup) grpcServerOptions() []grpc.ServerOption {
	if s.server == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.Creds(tlsutil.ServerCredentials(tlsutil.ServerConfig(s.server, s.clientCAs, "h2"), "grpc", s.log))}
}

// controlPlaneCreds are the credentials routers and agents dial the control
// plane with.
func (s *tlsSetup) controlPlaneCreds() credentials.TransportCredentials {
	if s.cpCAs == nil {
		return insecure.NewCredentials()
	}
	return tlsutil.Credentials(tlsutil.ClientOptions{Roots: s.cpCAs, ServerName: s.f.cpServerName, Cert: s.cpCert})
}

// peerCreds dial another replica of this control plane (a follower hands
// admin calls to the leader): TLS against --tls-client-ca-file (or the
// system's roots) with this process's certificate as the client's, when
// this process serves TLS.
func (s *tlsSetup) peerCreds() credentials.TransportCredentials {
	if o := s.peerTLS(); o != nil {
		return tlsutil.Credentials(*o)
	}
	return nil
}

// peerTLS is how peerCreds verify, also used for the other replicas' HTTP
// ports (joins); nil when this process serves no TLS.
func (s *tlsSetup) peerTLS() *tlsutil.ClientOptions {
	if s.server == nil {
		return nil
	}
	return &tlsutil.ClientOptions{Roots: s.clientCAs, Cert: s.server}
}

// selfCreds dial this process's own gRPC port (smg launch's in-process
// router): TLS pinned to the certificate this process serves, so no CA is
// needed and nothing else is trusted.
func (s *tlsSetup) selfCreds() credentials.TransportCredentials {
	if s.server == nil {
		return insecure.NewCredentials()
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: true}
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 || tlsutil.Fingerprint(cs.PeerCertificates[0]) != tlsutil.Fingerprint(s.server.Leaf()) {
			return errors.New("tls: the in-process control plane presented a certificate other than this process's")
		}
		return nil
	}
	return credentials.NewTLS(cfg)
}

// engineTLS says how https:// engines are verified (nil: Go's defaults, the
// system's roots).
func (s *tlsSetup) engineTLS() *tlsutil.ClientOptions {
	if s.engCAs == nil && !s.f.engineInsecure && s.f.engineServerName == "" {
		return nil
	}
	return &tlsutil.ClientOptions{Roots: s.engCAs, ServerName: s.f.engineServerName, InsecureSkipVerify: s.f.engineInsecure}
}

// warnPlaintext says loudly when a listener off loopback runs without TLS.
func (s *tlsSetup) warnPlaintext(what string, ln net.Listener) {
	if s.server != nil {
		return
	}
	if ta, ok := ln.Addr().(*net.TCPAddr); ok && !ta.IP.IsLoopback() {
		s.log.Warn("Listener off loopback without TLS: traffic, tokens and keys cross the network in the clear (set --tls-cert-file and --tls-key-file)",
			"listener", what, "addr", ln.Addr().String())
	}
}
