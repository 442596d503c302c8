// Package version says which build of smg is running. Release builds stamp
// Version and Commit with -ldflags; other builds fall back to what the Go
// toolchain recorded (module version, VCS revision).
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// Stamped at link time (make build): -X github.com/smg-project/smg/internal/version.Version=v1.2.3
// -X github.com/smg-project/smg/internal/version.Commit=<sha>.
var (
	Version = ""
	Commit  = ""
)

// Info is what `smg --version` prints and /metrics exports.
type Info struct {
	Version, Commit, GoVersion string
	Modified                   bool
}

// Get returns the stamped values, or the toolchain's build info where a value
// was not stamped.
func Get() Info {
	info := Info{Version: Version, Commit: Commit, GoVersion: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if ok {
		if info.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			info.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if info.Commit == "" {
					info.Commit = s.Value
				}
			case "vcs.modified":
				info.Modified = s.Value == "true"
			}
		}
	}
	if info.Version == "" {
		info.Version = "dev"
	}
	if info.Commit == "" {
		info.Commit = pseudoRevision(info.Version)
	}
	if info.Commit == "" {
		info.Commit = "unknown"
	}
	return info
}

// pseudoRevision is the commit prefix a pseudo-version ends in
// (v0.0.0-20261201223000-0123456789ab, what go install ...@<commit> or
// @<branch> records, where no VCS settings are), or "".
func pseudoRevision(v string) string {
	v, _, _ = strings.Cut(v, "+")
	i := strings.LastIndexByte(v, '-')
	if i < 15 {
		return ""
	}
	rev, stamp := v[i+1:], v[i-14:i]
	if len(rev) != 12 || strings.Trim(rev, "0123456789abcdef") != "" || strings.Trim(stamp, "0123456789") != "" {
		return ""
	}
	return rev
}

// String is the one line `smg --version` prints.
func (i Info) String() string {
	dirty := ""
	if i.Modified {
		dirty = "-dirty"
	}
	return fmt.Sprintf("smg %s (commit %s%s, %s)", i.Version, i.Commit, dirty, i.GoVersion)
}
