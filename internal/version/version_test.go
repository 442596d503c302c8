package version

import (
	"strings"
	"testing"
)

func TestStampedValuesWin(t *testing.T) {
	oldV, oldC := Version, Commit
	t.Cleanup(func() { Version, Commit = oldV, oldC })
	Version, Commit = "v9.8.7", "abc123"
	got := Get()
	if got.Version != "v9.8.7" || got.Commit != "abc123" {
		t.Fatalf("Get() = %+v, want the stamped version and commit", got)
	}
	if s := got.String(); !strings.HasPrefix(s, "smg v9.8.7 (commit abc123") {
		t.Fatalf("String() = %q", s)
	}
}

func TestUnstampedBuildNamesItself(t *testing.T) {
	oldV, oldC := Version, Commit
	t.Cleanup(func() { Version, Commit = oldV, oldC })
	Version, Commit = "", ""
	got := Get()
	if got.Version == "" || got.Commit == "" {
		t.Fatalf("Get() = %+v: an unstamped build must still say dev/unknown, never blank", got)
	}
}

// go install ...@<commit> records a pseudo-version and no VCS settings: the
// commit is the pseudo-version's last part.
func TestPseudoVersionNamesItsCommit(t *testing.T) {
	for v, want := range map[string]string{
		"v0.0.0-20261201223000-0123456789ab":              "0123456789ab",
		"v1.2.4-0.20261201223000-0123456789ab":            "0123456789ab",
		"v1.2.4-rc.1.0.20261201223000-0123456789ab+dirty": "0123456789ab",
		"v1.2.3":          "",
		"v1.2.3-rc.1":     "",
		"dev":             "",
		"v1.0.0-zzzzzzzz": "",
	} {
		if got := pseudoRevision(v); got != want {
			t.Errorf("pseudoRevision(%q) = %q, want %q", v, got, want)
		}
	}
}
