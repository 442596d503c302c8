// Package netlab builds a small test network on one Linux machine: each host
// is a network namespace with one veth into a bridge that lives in a hub
// namespace of its own, addressed in 198.18.0.0/15 (RFC 2544's benchmarking
// range). Faults are iptables rules inside a host's namespace. Nothing touches
// the machine's own interfaces, addresses or rules: every link, bridge and rule
// lives in a namespace the lab made, and Close deletes those namespaces, which
// takes their links and rules with them.
//
// It needs root, ip (iproute2) and iptables; Check says what is missing.
package netlab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Prefix starts the name of every namespace a lab makes, so a lab left behind
// by a killed run can be found and removed (Sweep).
const Prefix = "smglab"

// Check reports why a lab cannot be built here, or nil.
func Check() error {
	if os.Geteuid() != 0 {
		return errors.New("network namespaces and iptables need root: run as root (CI does)")
	}
	for _, tool := range []string{"ip", "iptables"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s is not installed (Debian: apt-get install -y iproute2 iptables)", tool)
		}
	}
	return nil
}

// Lab is one bridge and the hosts on it.
type Lab struct {
	id     string // short, unique per lab: namespace and link names derive from it
	hub    string // namespace holding the bridge
	net    byte   // third octet: 198.18.<net>.0/24
	mu     sync.Mutex
	hosts  []*Host
	closed bool
}

// Host is one namespace on the lab's bridge.
type Host struct {
	lab  *Lab
	Name string // as given to AddHost
	NS   string // namespace name
	IP   string // 198.18.<net>.<n>
}

// New makes the hub namespace and its bridge. id must be short (at most 6
// characters, letters and digits) and unique among labs running at once.
func New(id string) (*Lab, error) {
	if err := Check(); err != nil {
		return nil, err
	}
	if len(id) == 0 || len(id) > 6 {
		return nil, fmt.Errorf("netlab: id %q must be 1-6 characters", id)
	}
	l := &Lab{id: id, hub: Prefix + "-" + id + "-hub", net: byte(os.Getpid()%200 + 20)}
	if err := run("ip", "netns", "add", l.hub); err != nil {
		return nil, err
	}
	for _, args := range [][]string{
		{"ip", "-n", l.hub, "link", "add", "br0", "type", "bridge"},
		{"ip", "-n", l.hub, "link", "set", "br0", "up"},
		{"ip", "-n", l.hub, "link", "set", "lo", "up"},
	} {
		if err := run(args...); err != nil {
			_ = l.Close()
			return nil, err
		}
	}
	return l, nil
}

// AddHost makes a namespace with loopback up and one interface, eth0, on the
// bridge.
func (l *Lab) AddHost(name string) (*Host, error) {
	l.mu.Lock()
	n := len(l.hosts) + 2
	h := &Host{lab: l, Name: name, NS: fmt.Sprintf("%s-%s-%s", Prefix, l.id, name), IP: fmt.Sprintf("198.18.%d.%d", l.net, n)}
	l.hosts = append(l.hosts, h)
	l.mu.Unlock()
	peer := fmt.Sprintf("v%s%d", l.id, n) // the bridge side, in the hub
	for _, args := range [][]string{
		{"ip", "netns", "add", h.NS},
		// Both ends are made inside namespaces: the host's link table is never touched.
		{"ip", "-n", l.hub, "link", "add", peer, "type", "veth", "peer", "name", "eth0", "netns", h.NS},
		{"ip", "-n", l.hub, "link", "set", peer, "master", "br0"},
		{"ip", "-n", l.hub, "link", "set", peer, "up"},
		{"ip", "-n", h.NS, "addr", "add", h.IP + "/24", "dev", "eth0"},
		{"ip", "-n", h.NS, "link", "set", "eth0", "up"},
		{"ip", "-n", h.NS, "link", "set", "lo", "up"},
	} {
		if err := run(args...); err != nil {
			return nil, fmt.Errorf("netlab: host %s: %w", name, err)
		}
	}
	return h, nil
}

// Close deletes every namespace of the lab (and with them their links and
// iptables rules). A second Close does nothing.
func (l *Lab) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	var errs []error
	for _, h := range l.hosts {
		if err := run("ip", "netns", "del", h.NS); err != nil {
			errs = append(errs, err)
		}
	}
	if err := run("ip", "netns", "del", l.hub); err != nil {
		errs = append(errs, err)
	}
	l.hosts = nil
	return errors.Join(errs...)
}

// Sweep deletes namespaces that a lab with this id left behind (a run killed
// before its cleanup).
func Sweep(id string) {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		if strings.HasPrefix(name, Prefix+"-"+id+"-") {
			_ = run("ip", "netns", "del", name)
		}
	}
}

// Command returns cmd prepared to run inside the host's namespace.
func (h *Host) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", h.NS, name}, args...)...)
}

// Addr is HOST:PORT of the host.
func (h *Host) Addr(port int) string { return fmt.Sprintf("%s:%d", h.IP, port) }

// inNS runs fn on a thread moved into the host's namespace. The thread is
// never moved back: its goroutine ends locked, so Go retires the thread.
func (h *Host) inNS(fn func() error) error {
	ch := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // no Unlock: the thread dies with this goroutine
		f, err := os.Open("/var/run/netns/" + h.NS)
		if err != nil {
			ch <- err
			return
		}
		err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
		f.Close()
		if err != nil {
			ch <- fmt.Errorf("setns %s: %w", h.NS, err)
			return
		}
		ch <- fn()
	}()
	return <-ch
}

// Listen opens a TCP listener inside the host's namespace.
func (h *Host) Listen(addr string) (ln net.Listener, err error) {
	err = h.inNS(func() error {
		ln, err = net.Listen("tcp", addr)
		return err
	})
	return ln, err
}

// DialContext dials from inside the host's namespace: a socket belongs to the
// namespace it was made in, so the dial runs on a thread moved there, and the
// connection is used from anywhere afterwards.
func (h *Host) DialContext(ctx context.Context, network, addr string) (c net.Conn, err error) {
	err = h.inNS(func() error {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// Direction names which packets a fault drops.
type Direction int

const (
	Both     Direction = iota // every packet between the two hosts
	Outbound                  // packets from this host to the peer only
	Inbound                   // packets from the peer to this host only
)

// Action is what a fault does with a packet.
type Action string

const (
	Drop   Action = "DROP"   // silence: the sender waits for its timeouts
	Reject Action = "REJECT" // an ICMP port-unreachable / TCP reset: fails fast
)

// Fault is one set of iptables rules in a host's namespace; Heal removes it.
type Fault struct {
	h     *Host
	rules [][]string
}

// Cut blocks traffic between h and peer (optionally one TCP port of the peer
// for outbound, or of h for inbound; 0 for every port) with the action, in
// the given direction. The rules live in h's namespace.
func (h *Host) Cut(peer *Host, port int, action Action, dir Direction) (*Fault, error) {
	f := &Fault{h: h}
	target := []string{"-j", string(action)}
	if action == Reject {
		target = append(target, "--reject-with", "tcp-reset")
	}
	var specs [][]string
	out := []string{"OUTPUT", "-d", peer.IP}
	in := []string{"INPUT", "-s", peer.IP}
	if action == Reject || port > 0 { // a TCP reset, or a port, needs the protocol named
		out = append(out, "-p", "tcp")
		in = append(in, "-p", "tcp")
	}
	if port > 0 {
		out = append(out, "--dport", fmt.Sprint(port))
		in = append(in, "--sport", fmt.Sprint(port))
	}
	switch dir {
	case Both:
		specs = [][]string{out, in}
	case Outbound:
		specs = [][]string{out}
	case Inbound:
		specs = [][]string{in}
	}
	for _, s := range specs {
		rule := append(s, target...)
		if err := run(append([]string{"ip", "netns", "exec", h.NS, "iptables", "-I"}, rule...)...); err != nil {
			_ = f.Heal()
			return nil, err
		}
		f.rules = append(f.rules, rule)
	}
	return f, nil
}

// Heal removes the fault's rules.
func (f *Fault) Heal() error {
	var errs []error
	for _, rule := range f.rules {
		if err := run(append([]string{"ip", "netns", "exec", f.h.NS, "iptables", "-D"}, rule...)...); err != nil {
			errs = append(errs, err)
		}
	}
	f.rules = nil
	return errors.Join(errs...)
}

func run(args ...string) error {
	var stderr bytes.Buffer
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return nil
}
