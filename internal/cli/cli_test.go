package cli

import (
	"bytes"
	"errors"
	"flag"
	"slices"
	"strings"
	"testing"
)

func newSet() (*flag.FlagSet, *List, *int, *bool) {
	fs := NewFlagSet("t", "test", &bytes.Buffer{})
	var urls List
	fs.Var(&urls, "worker-urls", "urls")
	n := fs.Int("load-monitor-interval", 10, "secs")
	b := fs.Bool("worker-overload-shed", false, "shed")
	return fs, &urls, n, b
}

func TestListFlagTakesSpaceSeparatedValuesLikeTheSpec(t *testing.T) {
	fs, urls, n, b := newSet()
	err := Parse(fs, []string{"--worker-urls", "http://w1:8000", "http://w2:8000", "--load-monitor-interval", "5", "--worker-overload-shed"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"http://w1:8000", "http://w2:8000"}; !slices.Equal(*urls, want) {
		t.Fatalf("urls = %v, want %v", *urls, want)
	}
	if *n != 5 || !*b {
		t.Fatalf("interval %d shed %v", *n, *b)
	}
}

func TestListFlagRepeatedAndWithEquals(t *testing.T) {
	fs, urls, _, _ := newSet()
	if err := Parse(fs, []string{"--worker-urls=http://a", "http://b", "--worker-urls", "http://c"}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"http://a", "http://b", "http://c"}; !slices.Equal(*urls, want) {
		t.Fatalf("urls = %v, want %v", *urls, want)
	}
}

func TestStrayPositionalArgumentIsAnError(t *testing.T) {
	fs, _, _, _ := newSet()
	err := Parse(fs, []string{"--load-monitor-interval", "5", "extra"})
	if err == nil || !strings.Contains(err.Error(), `unexpected argument "extra"`) {
		t.Fatalf("err = %v", err)
	}
}

func TestHelpListsEveryFlagWithDefaults(t *testing.T) {
	var out bytes.Buffer
	fs := NewFlagSet("t", "test", &out)
	fs.Int("load-monitor-interval", 10, "secs")
	fs.Bool("worker-overload-shed", false, "shed")
	if err := Parse(fs, []string{"--help"}); !errors.Is(err, ErrHelp) {
		t.Fatalf("err = %v", err)
	}
	for _, want := range []string{"--load-monitor-interval int", "secs (default 10)", "--worker-overload-shed\n"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("help lacks %q:\n%s", want, out.String())
		}
	}
}
