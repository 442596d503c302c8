// Package workerurl puts a worker's URL in its one canonical form, so that
// aliases of one engine (case, default port, trailing slash) are caught as
// duplicates, and refuses URLs that carry secrets or point at addresses a
// worker has no business at (link-local, cloud metadata).
//
// It never dials the URL it checks.
package workerurl

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"regexp"
	"strconv"
	"strings"
)

// Options relax the rules.
type Options struct {
	// AllowLinkLocal accepts link-local and cloud metadata addresses
	// (smg controlplane --allow-link-local-workers).
	AllowLinkLocal bool
}

var defaultPorts = map[string]string{"http": "80", "https": "443", "grpc": "80", "grpcs": "443"}

// metadataHosts are cloud instance-metadata endpoints by name or by an
// address that is not link-local.
var metadataHosts = map[string]bool{
	"metadata":                 true,
	"metadata.google.internal": true,
	"metadata.goog":            true,
	"100.100.100.200":          true, // Alibaba Cloud
	"fd00:ec2::254":            true, // AWS IMDS over IPv6
}

// Normalize returns raw in canonical form: scheme and host in lower case,
// no default port, no trailing slash. It refuses userinfo (credentials go in
// api_key), a query or fragment, a port outside 1-65535, and (unless
// allowed) link-local and metadata addresses. Errors never echo a secret.
func Normalize(raw string, o Options) (string, error) {
	if raw == "" {
		return "", errors.New("url is required")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("url %q is invalid: %v", Redact(raw), unwrapParse(err))
	}
	scheme := strings.ToLower(u.Scheme)
	def, known := defaultPorts[scheme]
	if !known {
		return "", fmt.Errorf("url %q must start with http://, https://, grpc:// or grpcs://", Redact(raw))
	}
	if u.User != nil {
		return "", fmt.Errorf("url %q carries credentials: put the engine's key in api_key", Redact(raw))
	}
	if u.Opaque != "" || u.Host == "" {
		return "", fmt.Errorf("url %q has no host", Redact(raw))
	}
	if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.Contains(raw, "#") {
		return "", fmt.Errorf("url %q must be a base URL, without query or fragment", Redact(raw))
	}
	host := strings.ToLower(u.Hostname())
	if host == "" || strings.ContainsAny(host, " %") {
		return "", fmt.Errorf("url %q has no valid host", Redact(raw))
	}
	port := u.Port()
	if port == "" && strings.HasSuffix(u.Host, ":") {
		return "", fmt.Errorf("url %q has an empty port", Redact(raw))
	}
	if port != "" {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			return "", fmt.Errorf("url %q: port must be 1-65535, got %s", Redact(raw), port)
		}
		port = strconv.Itoa(n) // no leading zeros
	}
	if ip, ok := legacyIPv4(host); ok {
		// Resolvers disagree on these (the C library reads 2852039166 as
		// 169.254.169.254; Go looks it up as a name): one spelling only.
		return "", fmt.Errorf("url %q writes the IPv4 address %s in a form resolvers read differently; write it as %s", Redact(raw), host, ip)
	}
	if !o.AllowLinkLocal {
		if why := forbidden(host); why != "" {
			return "", fmt.Errorf("url %q points at %s; a worker cannot be registered there unless the control plane runs with --allow-link-local-workers", Redact(raw), why)
		}
	}
	hostport := host
	if strings.Contains(host, ":") {
		hostport = "[" + host + "]"
	}
	if port != "" && port != def {
		hostport += ":" + port
	}
	path := strings.TrimRight(u.EscapedPath(), "/")
	return scheme + "://" + hostport + path, nil
}

// forbidden says why host is off limits, or "". This is the early check,
// on the URL as written; DialControl checks the address actually dialled.
func forbidden(host string) string {
	if metadataHosts[strings.TrimRight(host, ".")] { // "metadata.google.internal." is the same name
		return "a cloud metadata endpoint"
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return ""
	}
	return forbiddenIP(ip)
}

// forbiddenIP says why the address ip is off limits, or "".
func forbiddenIP(ip netip.Addr) string {
	ip = ip.Unmap()
	if metadataHosts[ip.String()] {
		return "a cloud metadata endpoint"
	}
	switch {
	case ip.IsLinkLocalUnicast(), ip.IsLinkLocalMulticast():
		return "a link-local address (cloud metadata lives at 169.254.169.254)"
	case ip.IsMulticast(), ip.IsUnspecified():
		return "an address no engine answers on"
	}
	return ""
}

var userinfo = regexp.MustCompile(`//[^/?#]*@`)

// Redact hides the credentials of a URL, for logs and messages, including
// one that does not parse.
func Redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return userinfo.ReplaceAllString(raw, "//xxxxx@")
	}
	if u.User != nil {
		u.User = url.User("xxxxx") // a bare token in the user part is a secret too
	}
	if u.RawQuery != "" {
		u.RawQuery = "xxxxx"
	}
	return u.String()
}

// unwrapParse drops url.Error's copy of the input, which may hold a secret.
func unwrapParse(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// Host returns the lower-case host of a URL already normalised, or "".
func Host(normalized string) string {
	u, err := url.Parse(normalized)
	if err != nil {
		return ""
	}
	return strings.ToLower(u.Hostname())
}

// legacyIPv4 reads host as an IPv4 address in one of the forms inet_aton and
// browsers accept beside the dotted quad: one to four parts, each decimal,
// hex (0x) or octal (leading 0), the last filling the remaining bytes
// (2852039166, 0xa9fea9fe, 0251.0376.0251.0376, 169.254.43518). ok is false
// for a host that is not such a number (a name, or a plain dotted quad).
func legacyIPv4(host string) (ip netip.Addr, ok bool) {
	if _, err := netip.ParseAddr(host); err == nil {
		return netip.Addr{}, false
	}
	parts := strings.Split(strings.TrimSuffix(host, "."), ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	nums := make([]uint64, len(parts))
	for i, p := range parts {
		base, digits := 10, p
		switch {
		case len(p) > 1 && (p[:2] == "0x" || p[:2] == "0X"):
			base, digits = 16, p[2:]
		case len(p) > 1 && p[0] == '0':
			base, digits = 8, p[1:]
		}
		if digits == "" && base == 16 {
			digits = "0"
		}
		n, err := strconv.ParseUint(digits, base, 32)
		if err != nil || digits == "" {
			return netip.Addr{}, false
		}
		nums[i] = n
	}
	var v uint64
	for i, n := range nums[:len(nums)-1] {
		if n > 255 {
			return netip.Addr{}, false
		}
		v |= n << (8 * (3 - i))
	}
	last := nums[len(nums)-1]
	if last >= 1<<(8*(5-len(nums))) {
		return netip.Addr{}, false
	}
	v |= last
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), true
}
