package agentsvc

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/smg-project/smg/internal/bearer"
)

// Identity is who an agent stream's credentials say it is.
type Identity struct {
	// Node is the node the credentials are bound to; "" when they name none
	// (the shared --agent-token, or no token at all): the hello's node is
	// then taken on trust.
	Node string
	// Hosts are the addresses (IPs, names, or CIDR prefixes such as the
	// node's pod CIDR) the node's engines may be at, beyond the address the
	// stream comes from.
	Hosts []string
}

// TokenAuth accepts per-node tokens (--agent-token-file) and, if set, one
// shared token (--agent-token) that names no node. With neither, every
// stream is accepted and names no node.
type TokenAuth struct {
	Shared string
	Nodes  map[string]Identity // token → identity
}

// Authenticate turns the stream's token into its identity.
func (a TokenAuth) Authenticate(ctx context.Context) (Identity, error) {
	if a.Shared == "" && len(a.Nodes) == 0 {
		return Identity{}, nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	// Every token is compared, in constant time, so timing tells nothing
	// about which tokens exist.
	var found *Identity
	for tok, id := range a.Nodes {
		if _, ok := bearer.Match(vals, tok); ok {
			found = &id
		}
	}
	if found != nil {
		return *found, nil
	}
	if _, ok := bearer.Match(vals, a.Shared); ok && a.Shared != "" {
		return Identity{}, nil
	}
	if len(vals) == 0 {
		return Identity{}, status.Error(codes.Unauthenticated,
			`agent: missing token: send metadata "authorization: Bearer <token>" (smg agent --token) with a token the control plane knows (--agent-token or --agent-token-file)`)
	}
	return Identity{}, status.Error(codes.Unauthenticated,
		"agent: invalid token: smg agent --token matches neither the control plane's --agent-token nor a line of its --agent-token-file")
}

// LoadTokenFile reads --agent-token-file: one agent per line,
// "<token> <node> [<address>...]", where the addresses are the hosts, IPs or
// CIDR prefixes (the node's pod CIDR, for the engine pods its agent
// discovers) the node's engines may be at; blank lines and lines starting
// with # are skipped.
func LoadTokenFile(path string) (map[string]Identity, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--agent-token-file: %w", err)
	}
	defer f.Close()
	return parseTokens(path, bufio.NewScanner(f))
}

// minTokenLen keeps guessable tokens out of the file.
const minTokenLen = 16

func parseTokens(name string, sc *bufio.Scanner) (map[string]Identity, error) {
	out := map[string]Identity{}
	nodes := map[string]bool{}
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		switch {
		case len(f) < 2:
			return nil, fmt.Errorf("%s:%d: want \"<token> <node> [<address>...]\"", name, n)
		case len(f[0]) < minTokenLen:
			return nil, fmt.Errorf("%s:%d: the token must be at least %d characters", name, n, minTokenLen)
		case out[f[0]].Node != "":
			return nil, fmt.Errorf("%s:%d: this token is already given to node %s", name, n, out[f[0]].Node)
		case nodes[f[1]]:
			return nil, fmt.Errorf("%s:%d: node %s has a token already", name, n, f[1])
		}
		hosts := make([]string, 0, len(f)-2)
		for _, h := range f[2:] {
			if strings.Contains(h, "/") {
				p, err := netip.ParsePrefix(h)
				if err != nil {
					return nil, fmt.Errorf("%s:%d: address %s: %v", name, n, h, err)
				}
				h = p.Masked().String()
			}
			hosts = append(hosts, strings.ToLower(strings.Trim(h, "[]")))
		}
		out[f[0]] = Identity{Node: f[1], Hosts: hosts}
		nodes[f[1]] = true
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no token", name)
	}
	return out, nil
}

// hostSet decides whether an engine's host is on the agent's node: one of
// its configured addresses, the stream's, or (an agent on the control
// plane's host) any loopback address. Names are resolved once per stream.
type hostSet struct {
	allowed  map[string]bool
	prefixes []netip.Prefix // the node's address ranges (its pod CIDR)
	loopback bool           // the agent runs on the control plane's host

	mu    sync.Mutex
	names map[string]bool
}

func newHostSet(id Identity, ctx context.Context) *hostSet {
	hs := &hostSet{allowed: map[string]bool{}, names: map[string]bool{}}
	for _, h := range id.Hosts {
		if p, err := netip.ParsePrefix(h); err == nil {
			hs.prefixes = append(hs.prefixes, p)
			continue
		}
		hs.allowed[h] = true
	}
	if host, _, err := net.SplitHostPort(peerOf(ctx)); err == nil {
		ip := net.ParseIP(host)
		hs.allowed[ip.String()] = true
		if ip.IsLoopback() {
			hs.loopback, hs.allowed["localhost"] = true, true
		}
	}
	return hs
}

// contains reports whether host is on the node.
func (hs *hostSet) contains(host string) bool {
	host = strings.ToLower(host)
	if hs.allowed[host] {
		return true
	}
	if ip := net.ParseIP(host); ip != nil {
		return hs.allowedIP(ip)
	}
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if ok, seen := hs.names[host]; seen {
		return ok
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	addrs, _ := net.DefaultResolver.LookupHost(ctx, host)
	ok := len(addrs) > 0
	for _, a := range addrs {
		if ip := net.ParseIP(a); ip == nil || !hs.allowedIP(ip) {
			ok = false // every address the name resolves to must be on the node
		}
	}
	hs.names[host] = ok
	return ok
}

func (hs *hostSet) allowedIP(ip net.IP) bool {
	if hs.allowed[ip.String()] || (hs.loopback && ip.IsLoopback()) {
		return true
	}
	a, _ := netip.AddrFromSlice(ip) // invalid: in no prefix
	a = a.Unmap()
	return slices.ContainsFunc(hs.prefixes, func(p netip.Prefix) bool { return p.Contains(a) })
}
