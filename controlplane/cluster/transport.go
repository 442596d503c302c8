package cluster

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/smg-project/smg/internal/tlsutil"
)

// TLS secures the Raft transport with mutual TLS: each side presents a
// certificate, verifies the other's against CA, and accepts only a
// certificate naming a control plane (smg:controlplane:ID or a SPIFFE ID
// ending in /controlplane/ID), so an agent or router certificate from the
// same CA cannot speak Raft. The pair and the bundle are the ones in use at
// each handshake (tlsutil reloads them).
type TLS struct {
	Cert *tlsutil.KeyPair
	CA   *tlsutil.Pool
	// ServerName is the name expected in every peer's certificate when
	// dialling it; "": the host of the peer's Raft address.
	ServerName string
}

// Role is the identity role a Raft peer's certificate must name.
const Role = "controlplane"

// handshakeTimeout bounds a TLS handshake on the Raft port, so a peer that
// connects and says nothing holds no goroutine for long.
const handshakeTimeout = 5 * time.Second

// maxHandshakes bounds the handshakes in progress on the Raft port; more
// connections wait in the listen backlog.
const maxHandshakes = 64

// checkPeer accepts a verified certificate naming a control plane; with
// want set, its name must be want (or AnyName, a certificate shared by all
// replicas of a StatefulSet).
func checkPeer(c *x509.Certificate, want string) error {
	id, err := tlsutil.IdentityOf(c)
	if err != nil {
		return err
	}
	if id.Role != Role {
		return fmt.Errorf("the certificate names %s %q, not a control plane (want smg:%s:ID)", id.Role, id.Name, Role)
	}
	if want != "" && id.Name != want && id.Name != tlsutil.AnyName {
		return fmt.Errorf("the certificate names control plane %q, not %q", id.Name, want)
	}
	return nil
}

// clientConfig dials address as node want ("": any control plane).
func (t *TLS) clientConfig(address, want string) *tls.Config {
	host, _, _ := net.SplitHostPort(address)
	return tlsutil.ClientConfig(tlsutil.ClientOptions{Roots: t.CA, ServerName: cmp.Or(t.ServerName, host), Cert: t.Cert,
		Check: func(c *x509.Certificate) error { return checkPeer(c, want) }})
}

// streamLayer is Raft's TCP transport with an advertised address that may
// be a DNS name (a StatefulSet pod's), not only an IP; with tls set, every
// connection either way is mutual TLS, and one that fails its handshake
// never reaches Raft.
type streamLayer struct {
	ln        net.Listener
	advertise addr
	tls       *TLS
	log       *slog.Logger

	// With TLS: handshaken connections, fed by serve.
	conns                 chan net.Conn
	acceptErr             chan error
	handshakeTimeout      time.Duration
	closed                chan struct{}
	closeOnce             sync.Once
	refusedIn, refusedOut atomic.Uint64
	// members gives the Raft configuration (id -> address) once Raft runs.
	members atomic.Pointer[func() map[string]string]
}

// newStreamLayer serves ln; with t, each accepted connection must finish
// its TLS handshake within handshake.
func newStreamLayer(ln net.Listener, advertise addr, t *TLS, handshake time.Duration, log *slog.Logger) *streamLayer {
	s := &streamLayer{ln: ln, advertise: advertise, tls: t, log: log, closed: make(chan struct{}), handshakeTimeout: handshake}
	if t != nil {
		s.conns, s.acceptErr = make(chan net.Conn), make(chan error)
		go s.serve()
	}
	return s
}

func (s *streamLayer) memberList() map[string]string {
	if f := s.members.Load(); f != nil {
		return (*f)()
	}
	return nil
}

// checkMember accepts a certificate naming a control plane that is a member
// of the configuration (or AnyName): a member removed with DELETE
// /cluster/members/{id} is cut off even while its certificate is valid. A
// node that knows no configuration yet (waiting to be added) accepts any
// control plane: the leader that adds it dials it first.
func (s *streamLayer) checkMember(c *x509.Certificate) error {
	if err := checkPeer(c, ""); err != nil {
		return err
	}
	members := s.memberList()
	id, _ := tlsutil.IdentityOf(c)
	if _, ok := members[id.Name]; len(members) > 0 && !ok && id.Name != tlsutil.AnyName {
		return fmt.Errorf("control plane %q is not a member of this cluster (members: %s)", id.Name, formatPeers(members))
	}
	return nil
}

// serve accepts TCP connections and hands each to Accept once its TLS
// handshake succeeded (a client certificate the bundle in use verifies,
// passing checkMember); a refused one is logged and counted.
func (s *streamLayer) serve() {
	cfg := tlsutil.ServerConfig(s.tls.Cert, s.tls.CA)
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("tls: the Raft peer presented no certificate")
		}
		return s.checkMember(cs.PeerCertificates[0])
	}
	sem := make(chan struct{}, maxHandshakes)
	for {
		c, err := s.ln.Accept()
		if err != nil {
			select {
			case s.acceptErr <- err:
				continue // Raft backs off on errors it is given
			case <-s.closed:
				return
			}
		}
		select {
		case sem <- struct{}{}:
		case <-s.closed:
			_ = c.Close()
			return
		}
		go func() {
			defer func() { <-sem }()
			tc := tls.Server(c, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), s.handshakeTimeout)
			err := tc.HandshakeContext(ctx)
			cancel()
			if err != nil {
				s.refusedIn.Add(1)
				s.log.Warn("Raft TLS handshake refused: the peer is not a control plane of this cluster", "peer", c.RemoteAddr().String(), "err", err)
				_ = c.Close()
				return
			}
			select {
			case s.conns <- tc:
			case <-s.closed:
				_ = tc.Close()
			}
		}()
	}
}

func (s *streamLayer) Accept() (net.Conn, error) {
	if s.tls == nil {
		return s.ln.Accept()
	}
	select {
	case c := <-s.conns:
		return c, nil
	case err := <-s.acceptErr:
		return nil, err
	case <-s.closed:
		return nil, net.ErrClosed
	}
}

func (s *streamLayer) Close() error {
	s.closeOnce.Do(func() { close(s.closed) })
	return s.ln.Close()
}

func (s *streamLayer) Addr() net.Addr { return s.advertise }

// Dial reaches a member: its certificate must name the member the
// configuration lists at that address.
func (s *streamLayer) Dial(a raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	want := ""
	for id, addr := range s.memberList() {
		if addr == string(a) {
			want = id
		}
	}
	return s.dial(string(a), want, timeout)
}

// dial connects to a Raft address; with TLS, the peer must prove it is
// control plane want ("": any of this cluster's).
func (s *streamLayer) dial(address, want string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", address, timeout)
	if err != nil || s.tls == nil {
		return c, err
	}
	tc := tls.Client(c, s.tls.clientConfig(address, want))
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		s.refusedOut.Add(1)
		_ = c.Close()
		return nil, fmt.Errorf("%w: Raft TLS handshake with %s: %w", errUntrusted, address, err)
	}
	return tc, nil
}

// errUntrusted marks a dial whose TCP connection opened but whose peer
// failed the TLS checks (as opposed to a peer that could not be reached).
var errUntrusted = errors.New("not a trusted control plane")

// verifyMember proves that the node asking to join holds a certificate from
// the cluster's CA naming its id, by dialling its Raft address: a join
// request alone cannot add a member that could not speak Raft itself.
func (n *Node) verifyMember(id, raftAddr string) error {
	if n.opts.TLS == nil || id == n.id {
		return nil
	}
	c, err := n.layer.dial(raftAddr, id, 3*time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

type addr string

func (addr) Network() string  { return "tcp" }
func (a addr) String() string { return string(a) }
