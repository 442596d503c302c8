package podwatch

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/labels"
)

// A selector the Kubernetes parser refuses fails Validate with the parser's
// own message and the flag's name.
func TestSelectorParseErrorsCarryTheParsersMessage(t *testing.T) {
	for _, tc := range []struct{ flag, value string }{
		{"selector", "app in (a"},
		{"selector", "app notin"},
		{"prefill-selector", "role in"},
		{"decode-selector", "x=y,,"},
	} {
		o := DefaultOptions()
		o.Enabled = true
		o.Selector, o.PrefillSelector, o.DecodeSelector = "app=ok", "role=p", "role=d"
		switch tc.flag {
		case "selector":
			o.Selector = tc.value
		case "prefill-selector":
			o.PrefillSelector = tc.value
		case "decode-selector":
			o.DecodeSelector = tc.value
		}
		_, perr := labels.Parse(tc.value)
		if perr == nil {
			t.Fatalf("%q: the parser accepts it", tc.value)
		}
		err := o.Validate()
		if err == nil || !strings.Contains(err.Error(), perr.Error()) || !strings.Contains(err.Error(), "--"+tc.flag) {
			t.Errorf("--%s %q: got %v, want the parser's message %q", tc.flag, tc.value, err, perr)
		}
	}
}

func TestSelectorForms(t *testing.T) {
	for in, match := range map[string]map[string]string{
		"app=sglang role=worker":        {"app": "sglang", "role": "worker"}, // SMG's space-separated form
		"app=sglang,role=worker":        {"app": "sglang", "role": "worker"},
		"app in (sglang, vllm),!canary": {"app": "vllm"},
		"tier notin (cpu)":              {"tier": "gpu"},
	} {
		o := DefaultOptions()
		o.Enabled, o.Selector = true, in
		roles, err := o.Roles()
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		if !roles[0].Selector.Matches(labels.Set(match)) {
			t.Errorf("%q does not match %v", in, match)
		}
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		mutate func(*Options)
		want   string
	}{
		{func(o *Options) { o.Selector = "" }, "needs --selector"},
		{func(o *Options) { o.Protocol = "tcp" }, "must be http"},
		{func(o *Options) { o.Port = 0 }, "--service-discovery-port"},
		{func(o *Options) { o.PrefillSelector = "a=b" }, "go together"},
		{func(o *Options) { o.Selector = "!" }, "--selector"},
	} {
		o := DefaultOptions()
		o.Enabled, o.Selector = true, "app=engine"
		tc.mutate(&o)
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want %q", err, tc.want)
		}
	}
	o := DefaultOptions()
	if err := o.Validate(); err != nil {
		t.Errorf("discovery off: %v", err)
	}
}

func TestParseOverload(t *testing.T) {
	b, err := ParseOverload(`{"waiting_requests": 16, "token_usage": 0.9}`)
	if err != nil || b.GetWaitingRequests() != 16 || b.GetTokenUsage() != 0.9 {
		t.Fatalf("got %v, %v", b, err)
	}
	for _, bad := range []string{``, `16`, `{"waiting_requests": "16"}`, `{"waiting": 16}`, `{}`, `{"token_usage": 0.5} {}`, `{"waiting_requests": 1.5}`} {
		if _, err := ParseOverload(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
