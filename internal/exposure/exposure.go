// Package exposure warns when a listener that serves something worth
// protecting is reachable beyond this host without the credential that
// protects it, and exports smg_insecure_listener for alerting.
//
// It only warns and exports a gauge; it never refuses to listen.
package exposure

import (
	"log/slog"
	"net"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// Guard is one credential a listener's services need: the flag that sets it
// and whether it is set. TLS can add its own guards (a certificate) here.
type Guard struct {
	Flag string // e.g. "--admin-api-key"
	What string // what it protects, e.g. "the admin API"
	Set  bool
}

// Listener is one bound port and the guards its services need.
type Listener struct {
	Name   string // e.g. "http", "grpc"
	Addr   net.Addr
	Guards []Guard
}

// Loopback reports whether addr accepts only connections from this host.
func Loopback(addr net.Addr) bool {
	if tcp, ok := addr.(*net.TCPAddr); ok {
		return tcp.IP.IsLoopback()
	}
	host, _, err := net.SplitHostPort(addr.String())
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Check warns loudly about every listener beyond loopback with an unset
// guard, and sets smg_insecure_listener (1: at least one) on reg. It
// returns the number of exposed listeners.
func Check(log *slog.Logger, reg prometheus.Registerer, listeners ...Listener) int {
	exposed := 0
	for _, l := range listeners {
		if Loopback(l.Addr) {
			continue
		}
		var missing []string
		for _, g := range l.Guards {
			if !g.Set {
				missing = append(missing, g.Flag+" ("+g.What+")")
			}
		}
		if len(missing) == 0 {
			continue
		}
		exposed++
		log.Warn("INSECURE LISTENER: reachable beyond this host with no credential: anyone who can reach it can use what it serves. "+
			"Set the flags named, bind to 127.0.0.1, or restrict it with a network policy (docs/security.md)",
			"listener", l.Name, "addr", l.Addr.String(), "unprotected", strings.Join(missing, ", "))
	}
	if reg != nil {
		g := prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "smg_insecure_listener",
			Help: "1 when a listener is bound beyond loopback without the key or token that protects it (the start-up log names it), else 0.",
		})
		if exposed > 0 {
			g.Set(1)
		}
		if err := reg.Register(g); err != nil {
			log.Warn("smg_insecure_listener not registered", "error", err)
		}
	}
	return exposed
}
