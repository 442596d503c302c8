package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The smg binary does not link the benchmark suite's plotting stack
// (gonum/plot and the fonts, image and PDF packages it pulls in): plots are
// drawn by bench/cmd/benchsuite only.
func TestBinaryLinksNoPlotting(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, banned := range []string{"gonum.org/", "golang.org/x/image/", "codeberg.org/go-pdf/", "github.com/go-pdf/", "git.sr.ht/~sbinet/gg"} {
			if strings.HasPrefix(pkg, banned) {
				t.Errorf("smg links %s (the plotting stack belongs to bench/cmd/benchsuite)", pkg)
			}
		}
	}
}
