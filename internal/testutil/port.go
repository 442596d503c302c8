package testutil

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sync"
)

// Ports handed out are below the kernel's ephemeral range, which outgoing
// connections and ":0" listeners draw from: a port a killed process freed
// then stays free for its restart on the same port (in the ephemeral range
// any new connection could take it: "address already in use" at restart).
const (
	portFloor    = 10000
	defaultFirst = 32768 // Linux's default first ephemeral port
)

var handed = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// FreePort returns a loopback port that was free a moment ago, never one
// this process handed out before. Another process may take it before the
// caller binds (a test package in parallel picking the same number): a
// small race tests accept.
func FreePort(t T) int {
	t.Helper()
	hi := ephemeralFirst()
	handed.Lock()
	defer handed.Unlock()
	for range 1000 {
		p := portFloor + rand.IntN(hi-portFloor)
		if handed.ports[p] {
			continue
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		ln.Close()
		handed.ports[p] = true
		return p
	}
	t.Fatalf("free port: none found below %d", hi)
	return 0
}

// ephemeralFirst is the first port of the kernel's ephemeral range.
func ephemeralFirst() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return defaultFirst
	}
	var lo, hi int
	if _, err := fmt.Sscan(string(b), &lo, &hi); err != nil || lo <= portFloor+1000 {
		return defaultFirst
	}
	return lo
}
