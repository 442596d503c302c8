// Package e2e runs the real smg binary (sim, launch, controlplane, router) as
// separate processes on loopback and checks the spec's end-to-end promises:
// exclusion and re-admission of an overloaded engine, steer and shed, the
// stripped X-SMG-Error-Code, router convergence and a control-plane restart
// under load.
//
// TestMain builds ./cmd/smg once into a temp dir. The long tests whose
// processes mostly wait (failover, restarts, PD bursts) run in parallel, four
// at a time unless -parallel says otherwise; the ones that measure a liveness
// bound run alone. SMG_E2E_RACE=1 builds it with
// -race; every process's stderr is then scanned for data race reports.
//
// It drives the binaries from outside only (flags, HTTP, gRPC); it imports no
// component.
package e2e

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/smg-project/smg/internal/testutil"
)

// smgBin is the binary under test, built by TestMain.
var smgBin string

func TestMain(m *testing.M) {
	flag.Parse()
	parallelSet := false
	flag.Visit(func(f *flag.Flag) { parallelSet = parallelSet || f.Name == "test.parallel" })
	if !parallelSet {
		_ = flag.Set("test.parallel", "4")
	}
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
