package router

import (
	"bytes"
	"flag"
	"math"
	"strings"
	"testing"

	"github.com/smg-project/smg/internal/cli"
)

func TestDefaultsMatchTheSpec(t *testing.T) {
	o := DefaultOptions()
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	got := []any{o.Policy, o.WorkerOverloadShed, o.LoadMonitorInterval, o.WorkerStaleSecs,
		o.CBFailureThreshold, o.CBSuccessThreshold, o.CBTimeoutDurationSecs,
		o.RetryMaxRetries, o.RetryInitialBackoffMs, o.RetryMaxBackoffMs, o.RetryBackoffMultiplier, o.RetryJitterFactor,
		o.MaxConcurrentRequests, o.QueueSize, o.QueueTimeoutSecs}
	want := []any{"cache_aware", false, 10, 15, 10, 3, 60, 5, 50, 30000, 1.5, 0.2, -1, 100, 60}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("default %d = %v, want %v", i, got[i], want[i])
		}
	}
}

func TestFlagsParseAndValidate(t *testing.T) {
	var out bytes.Buffer
	fs := cli.NewFlagSet("router", "test", &out)
	o := DefaultOptions()
	o.AddFlags(fs)
	err := cli.Parse(fs, []string{"--policy", "power_of_two", "--worker-overload-shed", "--load-monitor-interval", "5",
		"--cb-failure-threshold", "4", "--max-concurrent-requests", "8", "--disable-retries", "--worker-admission-wait-secs", "0.05"})
	if err != nil {
		t.Fatal(err)
	}
	if o.Policy != "power_of_two" || !o.WorkerOverloadShed || o.LoadMonitorInterval != 5 ||
		o.CBFailureThreshold != 4 || o.MaxConcurrentRequests != 8 || !o.DisableRetries || o.WorkerAdmissionWaitSecs != 0.05 {
		t.Fatalf("parsed %+v", o)
	}
	if err := cli.Parse(fs, []string{"--help"}); err != cli.ErrHelp {
		t.Fatalf("--help: %v", err)
	}
	for _, name := range []string{"--worker-overload-shed", "--cb-timeout-duration-secs", "--queue-timeout-secs", "--policy"} {
		if !strings.Contains(out.String(), strings.TrimPrefix(name, "-")) {
			t.Fatalf("help lacks %s:\n%s", name, out.String())
		}
	}
}

func TestValidateRejects(t *testing.T) {
	for name, mutate := range map[string]func(*Options){
		"unknown policy":                func(o *Options) { o.Policy = "fastest" },
		"load monitor interval 0":       func(o *Options) { o.LoadMonitorInterval = 0 },
		"max concurrent 0":              func(o *Options) { o.MaxConcurrentRequests = 0 },
		"cb threshold 0":                func(o *Options) { o.CBFailureThreshold = 0 },
		"jitter above 1":                func(o *Options) { o.RetryJitterFactor = 1.5 },
		"admission wait negative":       func(o *Options) { o.WorkerAdmissionWaitSecs = -0.5 },
		"admission wait NaN":            func(o *Options) { o.WorkerAdmissionWaitSecs = math.NaN() },
		"admission wait over a day":     func(o *Options) { o.WorkerAdmissionWaitSecs = 1e12 },
		"token usage threshold 0":       func(o *Options) { o.BalanceTokenUsageThreshold = 0 },
		"token usage threshold above 1": func(o *Options) { o.BalanceTokenUsageThreshold = 1.5 },
		"multiplier below 1":            func(o *Options) { o.RetryBackoffMultiplier = 0.5 },
		"negative stale":                func(o *Options) { o.WorkerStaleSecs = -1 },
		"max backoff below intial":      func(o *Options) { o.RetryMaxBackoffMs = 1 },
	} {
		o := DefaultOptions()
		mutate(&o)
		if o.Validate() == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// A flag another component already defined (smg launch shares
// --load-monitor-interval with the control plane) feeds both owners.
func TestSharedFlagFeedsBothOwners(t *testing.T) {
	fs := flag.NewFlagSet("launch", flag.ContinueOnError)
	other := fs.Int("load-monitor-interval", 10, "control plane's")
	otherShed := fs.Bool("worker-overload-shed", false, "control plane's")
	o := DefaultOptions()
	o.AddFlags(fs)
	if err := fs.Parse([]string{"--load-monitor-interval", "3", "--worker-overload-shed"}); err != nil {
		t.Fatal(err)
	}
	if *other != 3 || o.LoadMonitorInterval != 3 || !*otherShed || !o.WorkerOverloadShed {
		t.Fatalf("control plane %d/%v, router %d/%v", *other, *otherShed, o.LoadMonitorInterval, o.WorkerOverloadShed)
	}
}
