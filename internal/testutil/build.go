package testutil

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

var built struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// SMGBinary builds ./cmd/smg once per test process and returns its path.
// SMG_BIN names a prebuilt binary instead; SMG_E2E_RACE=1 builds it with
// -race (StartT then fails a test whose processes report a data race).
// Cleanup removes the build; call it from TestMain after the tests.
func SMGBinary() (string, error) {
	if p := os.Getenv("SMG_BIN"); p != "" {
		return p, nil
	}
	built.once.Do(func() {
		built.dir, built.err = os.MkdirTemp("", "smg-test-")
		if built.err != nil {
			return
		}
		built.path = filepath.Join(built.dir, "smg")
		args := []string{"build", "-o", built.path}
		if os.Getenv("SMG_E2E_RACE") != "" {
			args = append(args, "-race")
		}
		cmd := exec.Command("go", append(args, "./cmd/smg")...)
		if cmd.Dir, built.err = repoRoot(); built.err != nil {
			return
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build ./cmd/smg: %v\n%s", err, out)
		}
	})
	return built.path, built.err
}

// repoRoot finds the smg repository above the working directory (tests run
// in their package's directory, deploy/validate in a module of its own).
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.HasPrefix(string(b), "module github.com/smg-project/smg\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the smg repository: no go.mod of github.com/smg-project/smg above the working directory")
		}
		dir = parent
	}
}

// Cleanup removes what SMGBinary built.
func Cleanup() {
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
}
