package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// deps lists the packages smg links, each with the packages it imports.
func deps(t *testing.T) map[string][]string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	m := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		m[f[0]] = f[1:]
	}
	return m
}

// The smg binary links no plotting stack (gonum/plot and the fonts, image and
// PDF packages it pulls in: plots are drawn by bench/cmd/benchsuite only), no
// test harness (the benchmark suite's process starter, httptest's servers,
// the fakes of client-go, which its typed clientsets link through gentype)
// and no package of ours imports package testing.
func TestBinaryLinksNoPlottingFakesOrTestHarness(t *testing.T) {
	banned := []string{
		"gonum.org/", "golang.org/x/image/", "codeberg.org/go-pdf/", "github.com/go-pdf/", "git.sr.ht/~sbinet/gg",
		"net/http/httptest", "k8s.io/client-go/testing", "k8s.io/client-go/gentype", "k8s.io/client-go/kubernetes/",
		"github.com/smg-project/smg/internal/testutil", "github.com/smg-project/smg/bench/suite",
		"github.com/smg-project/smg/internal/podwatch/podwatchtest",
	}
	// Third-party packages that import testing in a file of their own (test
	// helpers they export); the linker keeps nothing of it but its init.
	mayImportTesting := []string{"github.com/hashicorp/raft", "github.com/pandatix/go-abnf"}
	m := deps(t)
	if len(m) < 100 {
		t.Fatalf("go list -deps listed %d packages; the listing is broken", len(m))
	}
	for pkg, imports := range m {
		for _, b := range banned {
			if strings.HasPrefix(pkg, b) || strings.HasSuffix(pkg, "/fake") {
				t.Errorf("smg links %s", pkg)
			}
		}
		if slices.Contains(imports, "testing") && !slices.Contains(mayImportTesting, pkg) {
			t.Errorf("%s imports package testing and is linked into smg", pkg)
		}
	}
}
