// Package e2e runs the real smg binary (sim, launch, controlplane, router) as
// separate processes on loopback and checks the spec's end-to-end promises:
// exclusion and re-admission of an overloaded engine, steer and shed, the
// stripped X-SMG-Error-Code, router convergence and a control-plane restart
// under load.
//
// TestMain builds ./cmd/smg once into a temp dir. SMG_E2E_RACE=1 builds it with
// -race; every process's stderr is then scanned for data race reports.
//
// It drives the binaries from outside only (flags, HTTP, gRPC); it imports no
// component.
package e2e

import (
	"fmt"
	"os"
	"testing"

	"github.com/smg-project/smg/internal/testutil"
)

// smgBin is the binary under test, built by TestMain.
var smgBin string

func TestMain(m *testing.M) {
	os.Exit(buildAndRun(m))
}

func buildAndRun(m *testing.M) int {
	defer testutil.Cleanup()
	var err error
	if smgBin, err = testutil.SMGBinary(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: building smg:", err)
		return 1
	}
	return m.Run()
}
