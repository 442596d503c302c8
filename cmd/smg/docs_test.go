package main

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var updateDocs = flag.Bool("update", false, "rewrite docs/cli/*.md from the subcommands' --help")

// TestCLIDocsListEveryFlag keeps docs/cli/<command>.md equal to the
// command's --help, so every flag and its default is documented.
// Run `make docs` to refresh them.
func TestCLIDocsListEveryFlag(t *testing.T) {
	for _, c := range commands() {
		t.Run(c.name, func(t *testing.T) {
			var out bytes.Buffer
			if code := run(context.Background(), []string{c.name, "--help"}, &out, &out); code != 0 {
				t.Fatalf("smg %s --help exited %d: %s", c.name, code, out.String())
			}
			if !strings.Contains(out.String(), "-host") && c.name != "bench" {
				t.Fatalf("smg %s --help lists no --host flag:\n%s", c.name, out.String())
			}
			page := "# smg " + c.name + "\n\n" + c.summary + ".\n\nFlags take Go syntax (`--flag value` or `--flag=value`); list flags also take several\nspace-separated values after one flag. Generated from `smg " + c.name + " --help` by `make docs`.\n\n```\n" + out.String() + "```\n"
			path := filepath.Join("..", "..", "docs", "cli", c.name+".md")
			if *updateDocs {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(page), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run `make docs`)", err)
			}
			if string(got) != page {
				t.Fatalf("%s is stale: run `make docs`", path)
			}
		})
	}
}
