package workerurl

import (
	"context"
	"encoding/binary"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// fakeDNS answers every A query with ip and every other query with no
// answer, on a loopback UDP port; the resolver it returns asks only it.
func fakeDNS(t *testing.T, ip net.IP) *net.Resolver {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			q := buf[:n]
			end := 12
			for end < n && q[end] != 0 {
				end += int(q[end]) + 1
			}
			end += 5 // the root label, QTYPE, QCLASS
			if end > n {
				continue
			}
			resp := append([]byte{}, q[:end]...)
			resp[2], resp[3] = 0x81, 0x80 // a response, recursion available, no error
			binary.BigEndian.PutUint16(resp[6:], 0)
			binary.BigEndian.PutUint16(resp[8:], 0)
			binary.BigEndian.PutUint16(resp[10:], 0)
			if binary.BigEndian.Uint16(q[end-4:]) == 1 { // A
				binary.BigEndian.PutUint16(resp[6:], 1)
				resp = append(resp, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4)
				resp = append(resp, ip.To4()...)
			}
			_, _ = pc.WriteTo(resp, from)
		}
	}()
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", pc.LocalAddr().String())
	}}
}

// The hook sees the address actually dialled, after resolution: a name that
// resolves to the metadata address, and every spelling of a forbidden
// address, is refused before a packet is sent; with link-local workers
// allowed it refuses nothing.
func TestDialControlChecksTheAddressDialled(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	d := Dialer(&net.Dialer{Timeout: time.Second, Resolver: fakeDNS(t, net.IPv4(169, 254, 169, 254))}, Options{})
	for _, addr := range []string{
		"innocent.example:80", // resolves to 169.254.169.254
		"169.254.169.254:80", "[fe80::1]:80", "[::ffff:169.254.169.254]:80",
		"100.100.100.200:80", "[fd00:ec2::254]:80", "0.0.0.0:80",
	} {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			c.Close()
			t.Errorf("dialled %s", addr)
			continue
		}
		if !strings.Contains(err.Error(), "refusing to dial") || !strings.Contains(err.Error(), "--allow-link-local-workers") {
			t.Errorf("dial %s: %v, want a refusal naming --allow-link-local-workers", addr, err)
		}
	}

	// An engine at a permitted address is reached through the same hook,
	// and the control plane's engine client refuses as the dialer does.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{DialContext: Dialer(nil, Options{}).DialContext}}
	resp, err := client.Get(srv.URL)
	if err != nil {
		t.Fatalf("loopback engine: %v", err)
	}
	resp.Body.Close()
	if _, err := client.Get("http://169.254.169.254/latest/meta-data/"); err == nil || !strings.Contains(err.Error(), "refusing to dial") {
		t.Errorf("metadata endpoint: %v, want refused", err)
	}

	allow := Dialer(&net.Dialer{Timeout: 100 * time.Millisecond}, Options{AllowLinkLocal: true})
	if err := allow.Control("tcp", "169.254.169.254:80", nil); err != nil {
		t.Errorf("with link-local workers allowed: %v", err)
	}
}
