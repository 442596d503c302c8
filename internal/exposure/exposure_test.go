package exposure

import (
	"bytes"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestCheck(t *testing.T) {
	lo := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}
	any4 := &net.TCPAddr{IP: net.IPv4zero, Port: 2}
	any6 := &net.TCPAddr{IP: net.IPv6unspecified, Port: 3}
	unset := []Guard{{Flag: "--admin-api-key", What: "the admin API"}, {Flag: "--watch-token", What: "the watch stream", Set: true}}
	set := []Guard{{Flag: "--admin-api-key", What: "the admin API", Set: true}}
	for name, tc := range map[string]struct {
		ls   []Listener
		want float64
	}{
		"loopback without key":    {[]Listener{{Name: "http", Addr: lo, Guards: unset}}, 0},
		"0.0.0.0 with every key":  {[]Listener{{Name: "http", Addr: any4, Guards: set}}, 0},
		"0.0.0.0 without the key": {[]Listener{{Name: "http", Addr: any4, Guards: unset}}, 1},
		"[::] without the key":    {[]Listener{{Name: "grpc", Addr: any6, Guards: unset}, {Name: "http", Addr: lo, Guards: unset}}, 1},
	} {
		var buf bytes.Buffer
		reg := prometheus.NewRegistry()
		Check(slog.New(slog.NewTextHandler(&buf, nil)), reg, tc.ls...)
		got, err := testutil.GatherAndCount(reg, "smg_insecure_listener")
		if err != nil || got != 1 {
			t.Fatalf("%s: %d series, %v", name, got, err)
		}
		mfs, _ := reg.Gather()
		if v := mfs[0].GetMetric()[0].GetGauge().GetValue(); v != tc.want {
			t.Errorf("%s: smg_insecure_listener = %v, want %v", name, v, tc.want)
		}
		warned := strings.Contains(buf.String(), "INSECURE LISTENER")
		if warned != (tc.want == 1) {
			t.Errorf("%s: warned %v: %s", name, warned, buf.String())
		}
		if warned && (!strings.Contains(buf.String(), "--admin-api-key") || strings.Contains(buf.String(), "--watch-token")) {
			t.Errorf("%s: the warning must name the unset flag only: %s", name, buf.String())
		}
	}
}
