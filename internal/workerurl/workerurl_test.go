package workerurl

import (
	"net/url"
	"strings"
	"testing"
)

func TestAliasesOfOneEngineNormaliseAlike(t *testing.T) {
	for want, aliases := range map[string][]string{
		"http://10.0.0.5:8000":      {"http://10.0.0.5:8000", "http://10.0.0.5:8000/", "HTTP://10.0.0.5:8000//", "http://10.0.0.5:08000"},
		"http://gpu-1.example:8000": {"http://GPU-1.Example:8000", "Http://gpu-1.example:8000/"},
		"http://engine":             {"http://engine:80", "http://ENGINE/", "http://engine:80/"},
		"https://engine":            {"https://engine:443/"},
		"https://engine:80":         {"https://engine:80"},
		"http://[::1]:8000":         {"http://[::1]:8000/"},
		"http://h:8000/v1/base":     {"http://H:8000/v1/base/"},
	} {
		for _, a := range aliases {
			got, err := Normalize(a, Options{})
			if err != nil || got != want {
				t.Errorf("Normalize(%q) = %q, %v; want %q", a, got, err, want)
			}
		}
	}
}

func TestRefusals(t *testing.T) {
	for raw, want := range map[string]string{
		"":                                   "required",
		"http://user:hunter2@engine:8000":    "credentials",
		"http://tok3n@engine:8000":           "credentials",
		"ftp://engine":                       "must start with",
		"http://engine:99999":                "port must be 1-65535",
		"http://engine:0":                    "port must be 1-65535",
		"http://engine:":                     "empty port",
		"http://engine:8000/?key=x":          "without query",
		"http://engine:8000/#x":              "without query",
		"http://169.254.169.254/latest":      "link-local",
		"http://[fe80::1]:8000":              "link-local",
		"http://metadata.google.internal":    "metadata",
		"http://[fd00:ec2::254]":             "metadata",
		"http://[::ffff:169.254.169.254]:80": "link-local",
		"http://0.0.0.0:8000":                "no engine answers",
		"http:engine":                        "no host",
		// Spellings of 169.254.169.254 that resolvers read differently,
		// and a metadata name with its trailing root dot.
		"http://2852039166":                "write it as 169.254.169.254",
		"http://0xa9fea9fe":                "write it as 169.254.169.254",
		"http://0251.0376.0251.0376":       "write it as 169.254.169.254",
		"http://169.254.43518":             "write it as 169.254.169.254",
		"http://2130706433:8000":           "write it as 127.0.0.1",
		"http://metadata.google.internal.": "metadata",
		"http://METADATA.goog..":           "metadata",
	} {
		got, err := Normalize(raw, Options{})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Normalize(%q) = %q, %v; want an error containing %q", raw, got, err, want)
		}
		if err != nil && (strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "tok3n")) {
			t.Errorf("Normalize(%q) error leaks the secret: %v", raw, err)
		}
	}
	if got, err := Normalize("http://169.254.169.254:80", Options{AllowLinkLocal: true}); err != nil || got != "http://169.254.169.254" {
		t.Errorf("with AllowLinkLocal: %q, %v", got, err)
	}
	for _, ok := range []string{"http://10.0.0.1:8000", "http://engine-7", "http://1e100.net", "http://0x.example", "http://123.example"} {
		if _, err := Normalize(ok, Options{}); err != nil {
			t.Errorf("Normalize(%q): %v", ok, err)
		}
	}
}

func TestRedact(t *testing.T) {
	for _, raw := range []string{"http://user:hunter2@h:1", "http://hunter2@h", "http://h/?token=hunter2", "http://u:hunter2@h:1/%zz"} {
		if r := Redact(raw); strings.Contains(r, "hunter2") {
			t.Errorf("Redact(%q) = %q", raw, r)
		}
	}
}

// FuzzNormalize: whatever the input, an accepted URL is canonical (a fixed
// point), parses back to the same host and carries no credentials, query,
// fragment or trailing slash; no error or redaction leaks a password.
func FuzzNormalize(f *testing.F) {
	for _, s := range []string{"http://10.0.0.5:8000/", "HTTP://A:80", "http://u:p@h", "https://[::1]:443/x/",
		"http://169.254.169.254", "grpc://h:50051", "http://h:65536", "http://h/a//", "http://%41:80", "http://h/%2F/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		if r := Redact(raw); hasPassword(raw) && strings.Contains(r, password(raw)) {
			t.Fatalf("Redact(%q) = %q leaks the password", raw, r)
		}
		got, err := Normalize(raw, Options{})
		if err != nil {
			if hasPassword(raw) && strings.Contains(err.Error(), ":"+password(raw)+"@") {
				t.Fatalf("error leaks the password: %v", err)
			}
			return
		}
		again, err := Normalize(got, Options{})
		if err != nil || again != got {
			t.Fatalf("Normalize(%q) = %q, but Normalize of that = %q, %v", raw, got, again, err)
		}
		u, err := url.Parse(got)
		if err != nil {
			t.Fatalf("normalised %q does not parse: %v", got, err)
		}
		if u.User != nil || u.RawQuery != "" || u.Fragment != "" || strings.HasSuffix(got, "/") ||
			u.Scheme != strings.ToLower(u.Scheme) || u.Host != strings.ToLower(u.Host) {
			t.Fatalf("Normalize(%q) = %q is not canonical", raw, got)
		}
		if forbidden(strings.ToLower(u.Hostname())) != "" {
			t.Fatalf("Normalize(%q) = %q let a forbidden host through", raw, got)
		}
	})
}

func hasPassword(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return false
	}
	p, ok := u.User.Password()
	return ok && len(p) >= 4
}

func password(raw string) string {
	u, _ := url.Parse(raw)
	p, _ := u.User.Password()
	return p
}
