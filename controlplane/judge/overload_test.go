package judge

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/smg-project/smg/internal/cli"
)

func ptr[T any](v T) *T { return &v }

func TestCheck(t *testing.T) {
	gw := Thresholds{WaitingRequests: 8, TokenUsage: 0.8}
	cases := []struct {
		name       string
		waiting    int64
		usage      float64
		th         Thresholds
		overloaded bool
		reason     string
	}{
		{"under both", 7, 0.79, gw, false, "waiting_requests 7 < 8, token_usage 0.79 < 0.8"},
		{"waiting at threshold trips (>=)", 8, 0.1, gw, true, "waiting_requests 8 >= 8"},
		{"waiting above", 9, 0, gw, true, "waiting_requests 9 >= 8"},
		{"token usage at threshold trips (>=)", 0, 0.8, gw, true, "token_usage 0.8 >= 0.8"},
		{"either signal trips: both", 12, 0.95, gw, true, "waiting_requests 12 >= 8, token_usage 0.95 >= 0.8"},
		{"mean at threshold while a rank is below: ranks 0.6 and 1.0", 0, (0.6 + 1.0) / 2, gw, true, "token_usage 0.8 >= 0.8"},
		{"field left out reads 0 and never trips", 0, 0, gw, false, "waiting_requests 0 < 8, token_usage 0 < 0.8"},
		{"removed series -1 never trips", -1, -1, gw, false, "waiting_requests -1 < 8, token_usage -1 < 0.8"},
		{"NaN usage never trips", 0, math.NaN(), gw, false, "waiting_requests 0 < 8, token_usage NaN < 0.8"},
		{"no waiting threshold", 1000, 0.5, Thresholds{TokenUsage: 0.8}, false, "token_usage 0.5 < 0.8"},
		{"no token threshold", 0, 1, Thresholds{WaitingRequests: 4}, false, "waiting_requests 0 < 4"},
		{"no thresholds at all", 1 << 40, 1, Thresholds{}, false, "no thresholds"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, reason := Check(c.waiting, c.usage, c.th)
			if got != c.overloaded || reason.String() != c.reason {
				t.Fatalf("Check(%d, %v, %+v) = %v %q, want %v %q", c.waiting, c.usage, c.th, got, reason, c.overloaded, c.reason)
			}
		})
	}
}

func TestResolve(t *testing.T) {
	on := DefaultGatewayThresholds()
	off := on
	off.Disabled = true
	cases := []struct {
		name  string
		gw    GatewayThresholds
		block *Block
		want  Thresholds
	}{
		{"no block uses gateway", on, nil, Thresholds{8, 0.8}},
		{"no block, switch off: no thresholds", off, nil, Thresholds{}},
		{"block fields win", on, &Block{ptr[int64](4), ptr(0.7)}, Thresholds{4, 0.7}},
		{"omitted waiting falls back to gateway", on, &Block{TokenUsage: ptr(0.7)}, Thresholds{8, 0.7}},
		{"omitted token usage falls back to gateway", on, &Block{WaitingRequests: ptr[int64](4)}, Thresholds{4, 0.8}},
		{"empty block is the gateway", on, &Block{}, Thresholds{8, 0.8}},
		{"block applies under switch off", off, &Block{ptr[int64](4), ptr(0.7)}, Thresholds{4, 0.7}},
		{"switch off: omitted field means no threshold", off, &Block{WaitingRequests: ptr[int64](4)}, Thresholds{WaitingRequests: 4}},
		{"custom gateway values", GatewayThresholds{WaitingRequests: 16, TokenUsage: 0.9}, &Block{TokenUsage: ptr(0.5)}, Thresholds{16, 0.5}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := c.gw.Resolve(c.block); got != c.want {
				t.Fatalf("Resolve = %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestGatewayThresholdsValidate(t *testing.T) {
	cases := []struct {
		g    GatewayThresholds
		want string
	}{
		{DefaultGatewayThresholds(), ""},
		{GatewayThresholds{WaitingRequests: 1, TokenUsage: 1}, ""},
		{GatewayThresholds{WaitingRequests: 0, TokenUsage: 0.8}, "--worker-overload-waiting-requests must be an integer >= 1, got 0"},
		{GatewayThresholds{WaitingRequests: -3, TokenUsage: 0.8}, "--worker-overload-waiting-requests must be an integer >= 1, got -3"},
		{GatewayThresholds{WaitingRequests: 8, TokenUsage: 0}, "--worker-overload-token-usage must be a number in (0, 1], got 0"},
		{GatewayThresholds{WaitingRequests: 8, TokenUsage: 1.5}, "--worker-overload-token-usage must be a number in (0, 1], got 1.5"},
		{GatewayThresholds{WaitingRequests: 8, TokenUsage: math.NaN()}, "--worker-overload-token-usage must be a number in (0, 1], got NaN"},
	}
	for _, c := range cases {
		if got := errString(c.g.Validate()); got != c.want {
			t.Errorf("%+v.Validate() = %q, want %q", c.g, got, c.want)
		}
	}
}

func TestBlockValidate(t *testing.T) {
	cases := []struct {
		b    Block
		want string
	}{
		{Block{}, ""},
		{Block{ptr[int64](1), ptr(1.0)}, ""},
		{Block{WaitingRequests: ptr[int64](0)}, "overload.waiting_requests must be >= 1, got 0"},
		{Block{TokenUsage: ptr(0.0)}, "overload.token_usage must be in (0, 1], got 0"},
		{Block{TokenUsage: ptr(1.01)}, "overload.token_usage must be in (0, 1], got 1.01"},
		{Block{ptr[int64](-1), ptr(-0.5)}, "overload.waiting_requests must be >= 1, got -1\noverload.token_usage must be in (0, 1], got -0.5"},
	}
	for _, c := range cases {
		if got := errString(c.b.Validate()); got != c.want {
			t.Errorf("Validate() = %q, want %q", got, c.want)
		}
	}
}

func TestGatewayFlags(t *testing.T) {
	var out bytes.Buffer
	fs := cli.NewFlagSet("launch", "test", &out)
	g := DefaultGatewayThresholds()
	g.AddFlags(fs)
	if err := cli.Parse(fs, []string{"--worker-overload-waiting-requests", "16", "--worker-overload-token-usage", "0.9", "--disable-worker-overload-protection"}); err != nil {
		t.Fatal(err)
	}
	if want := (GatewayThresholds{16, 0.9, true}); g != want {
		t.Fatalf("parsed %+v, want %+v", g, want)
	}
	fs.Usage()
	for _, want := range []string{"-worker-overload-waiting-requests int", "(default 8)", "(default 0.8)", "-disable-worker-overload-protection"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("help lacks %q:\n%s", want, out.String())
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
