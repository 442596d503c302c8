package workerurl

import (
	"fmt"
	"net"
	"net/netip"
	"syscall"
)

// DialControl is a net.Dialer Control hook that refuses to connect to an
// address a worker has no business at (link-local, cloud metadata,
// multicast, unspecified) unless o allows link-local workers. It sees the
// address actually dialled, after name resolution, so a name or spelling
// that passed Normalize cannot lead there.
func DialControl(o Options) func(network, address string, c syscall.RawConn) error {
	return func(_, address string, _ syscall.RawConn) error {
		if o.AllowLinkLocal {
			return nil
		}
		host, _, err := net.SplitHostPort(address)
		if err != nil {
			host = address
		}
		ip, err := netip.ParseAddr(host)
		if err != nil {
			return fmt.Errorf("refusing to dial %s: not an IP address", address)
		}
		if why := forbiddenIP(ip.WithZone("")); why != "" {
			return fmt.Errorf("refusing to dial %s: %s; engines there are reached only when the control plane runs with --allow-link-local-workers", address, why)
		}
		return nil
	}
}

// Dialer returns d (nil: a zero dialer) with DialControl(o) as its Control.
func Dialer(d *net.Dialer, o Options) *net.Dialer {
	var nd net.Dialer
	if d != nil {
		nd = *d
	}
	nd.Control = DialControl(o)
	return &nd
}
