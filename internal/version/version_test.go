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
