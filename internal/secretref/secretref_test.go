package secretref

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeKey(t *testing.T, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil { // umask may have narrowed it
		t.Fatal(err)
	}
	return p
}

func TestResolveReadsEnvAndFile(t *testing.T) {
	t.Setenv("SMG_TEST_PROVIDER_KEY", " sk-env \n")
	if got, err := Resolve("env:SMG_TEST_PROVIDER_KEY"); err != nil || got != "sk-env" {
		t.Fatalf("env: %q, %v", got, err)
	}
	p := writeKey(t, "sk-file\n", 0o600)
	if got, err := Resolve("file:" + p); err != nil || got != "sk-file" {
		t.Fatalf("file: %q, %v", got, err)
	}
	if got, err := Resolve("file:" + writeKey(t, "sk-group", 0o640)); err != nil || got != "sk-group" {
		t.Fatalf("group-readable file: %q, %v", got, err)
	}
}

// Every refusal names the reference (the file or the variable) and never
// the secret.
func TestResolveRefusals(t *testing.T) {
	t.Setenv("SMG_TEST_EMPTY_KEY", "  ")
	dir := t.TempDir()
	world := writeKey(t, "sk-secret-world", 0o644)
	cases := []struct{ ref, want string }{
		{"", "env:NAME"},
		{"sk-plain-key", "env:NAME"},
		{"vault:x", "env:NAME"},
		{"sk-abc:def", "never accepted"},
		{"env:", "non-empty"},
		{"env:A=B", "non-empty"},
		{"file:relative/key", "absolute"},
		{"env:SMG_TEST_UNSET_KEY_XYZ", "SMG_TEST_UNSET_KEY_XYZ is not set"},
		{"env:SMG_TEST_EMPTY_KEY", "empty"},
		{"file:" + filepath.Join(dir, "missing"), filepath.Join(dir, "missing") + " does not exist"},
		{"file:" + world, world + " is readable by every user (mode 0644)"},
		{"file:" + dir, "not a regular file"},
		{"file:" + writeKey(t, strings.Repeat("k", MaxSize+10), 0o600), "larger than"},
		{"file:" + writeKey(t, "sk-a\nsk-b", 0o600), "several lines"},
	}
	for _, c := range cases {
		_, err := Resolve(c.ref)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Resolve(%q) = %v, want an error containing %q", c.ref, err, c.want)
			continue
		}
		if strings.Contains(err.Error(), "sk-") {
			t.Errorf("Resolve(%q): the error shows the secret: %v", c.ref, err)
		}
	}
}
