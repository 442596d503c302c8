// Command smg is overload protection for fleets of LLM inference engines:
// one binary with a subcommand per component.
//
// It owns flag parsing and process wiring per subcommand; the behaviour lives
// in the packages it calls.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/smg-project/smg/internal/cli"
	"github.com/smg-project/smg/internal/version"
)

type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"launch", "control plane, router and load monitor in one process (the first thing to run)", runLaunch},
		{"serve", "engines (vllm, sglang or sim) and the gateway on one machine, engines supervised", runServe},
		{"controlplane", "the control plane: registry, admin API, load monitor, verdicts, watch stream", runControlPlane},
		{"router", "a stateless OpenAI-compatible router fed by the control plane's watch stream", runRouter},
		{"agent", "a per-node agent pushing its engines' load to the control plane", runAgent},
		{"sim", "simulated vLLM/SGLang engines for tests, demos and benchmarks", runSim},
		{"bench", "an open-loop load generator for OpenAI streaming endpoints", runBench},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	if args[0] == "--version" || args[0] == "version" {
		fmt.Fprintln(stdout, version.Get())
		return 0
	}
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		stopProfiles := startProfiles(stderr)
		err := c.run(ctx, args[1:], stdout, stderr)
		stopProfiles()
		switch {
		case err == nil, errors.Is(err, cli.ErrHelp):
			return 0
		default:
			fmt.Fprintf(stderr, "smg %s: %v\n", c.name, err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "smg: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "Usage: smg <command> [flags]\n\nCommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-13s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun 'smg <command> --help' for the flags of a command, 'smg --version' for the build.")
}
