// Package cli parses subcommand flags the way the spec writes them: Go's flag
// syntax plus list flags that take several space-separated values after one
// flag (`--worker-urls http://w1:8000 http://w2:8000`) as well as repeats.
//
// It parses and validates syntax only; what a flag means is its component's.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// List is a flag.Value holding every value given to a list flag.
type List []string

func (l *List) String() string { return strings.Join(*l, " ") }

// Set appends one value; repeated flags accumulate.
func (l *List) Set(v string) error {
	if v == "" {
		return errors.New("empty value")
	}
	*l = append(*l, v)
	return nil
}

// ErrHelp is returned when --help was asked for and usage has been printed.
var ErrHelp = flag.ErrHelp

// NewFlagSet returns a FlagSet that reports errors instead of exiting and
// prints its usage (every flag with its default) to out.
func NewFlagSet(name, summary string, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprintf(out, "Usage: smg %s [flags]\n\n%s\n\nFlags:\n", name, summary)
		PrintFlags(out, fs)
	}
	return fs
}

// PrintFlags lists every flag of fs as the spec writes them (--name), with
// its type and default.
func PrintFlags(out io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		typ, usage := flag.UnquoteUsage(f)
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			typ = ""
		} else if typ == "value" {
			typ = guessType(f.DefValue)
		}
		line := "  --" + f.Name
		if typ != "" {
			line += " " + typ
		}
		fmt.Fprintln(out, line)
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "[]" {
			usage += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintf(out, "        %s\n", strings.ReplaceAll(usage, "\n", "\n        "))
	})
}

func guessType(def string) string {
	if _, err := strconv.ParseInt(def, 10, 64); err == nil {
		return "int"
	}
	if _, err := strconv.ParseFloat(def, 64); err == nil {
		return "float"
	}
	if _, err := time.ParseDuration(def); err == nil {
		return "duration"
	}
	return "string"
}

// Parse parses args into fs. After a list flag (a *List value), every following
// argument that does not start with "-" is another value of that flag.
// Positional arguments are not accepted.
func Parse(fs *flag.FlagSet, args []string) error {
	expanded := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		expanded = append(expanded, a)
		name, hasValue := flagName(a)
		if name == "" {
			continue
		}
		f := fs.Lookup(name)
		if f == nil {
			continue
		}
		if _, ok := f.Value.(*List); !ok {
			continue
		}
		if !hasValue {
			if i+1 >= len(args) {
				continue
			}
			i++
			expanded = append(expanded, args[i])
		}
		for i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
			i++
			expanded = append(expanded, "--"+name, args[i])
		}
	}
	if err := fs.Parse(expanded); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (see smg %s --help)", fs.Arg(0), fs.Name())
	}
	return nil
}

// flagName returns the name of a flag argument ("--x=1" → "x", true).
func flagName(arg string) (name string, hasValue bool) {
	if len(arg) < 2 || arg[0] != '-' || arg == "--" {
		return "", false
	}
	s := strings.TrimPrefix(strings.TrimPrefix(arg, "-"), "-")
	if eq := strings.IndexByte(s, '='); eq >= 0 {
		return s[:eq], true
	}
	return s, false
}
