// Package podwatch finds engine pods in Kubernetes: client-go shared
// informers list and watch the pods that match a label selector (per role),
// and every change of a pod is turned into one Pod observation (its URL,
// role, readiness and annotations) handed to a Sink. Deciding what to
// register, and when to give up on a pod, is the Sink's job: the control
// plane's discovery reconciler, directly or through an agent's stream.
//
// It never writes to the registry.
package podwatch

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"
)

// Annotations read from an engine pod.
const (
	// AnnotationBootstrapPort is a prefill pod's PD bootstrap port (1-65535).
	AnnotationBootstrapPort = "smg.io/bootstrap-port"
	// AnnotationOverload is the pod's overload block as JSON:
	// {"waiting_requests": 16, "token_usage": 0.9}; either field may be omitted.
	AnnotationOverload = "smg.io/overload"
)

// Labels set on a discovered worker's spec (shown by GET /workers).
const (
	LabelPod       = "smg.io/pod"
	LabelNamespace = "smg.io/namespace"
	// LabelSource names who discovered the worker: "controlplane" or
	// "agent/<node>". Only the source that added a worker removes it.
	LabelSource = "smg.io/discovered-by"
)

// SourceControlPlane names the control plane's own informers.
const SourceControlPlane = "controlplane"

// SourceAgent names the pods an agent discovered on its node.
func SourceAgent(node string) string { return "agent/" + node }

// Options are the service-discovery flags, shared by smg controlplane and
// smg agent (the agent adds its node as a field selector).
type Options struct {
	Enabled         bool
	Selector        string // regular workers
	PrefillSelector string // PD prefill workers
	DecodeSelector  string // PD decode workers
	Namespace       string // "" watches every namespace
	Port            int
	Protocol        string
	// Resync is how often the informers replay every pod, which also brings
	// back a discovered worker deleted by hand while its pod exists.
	Resync time.Duration
}

// DefaultOptions returns SMG's defaults.
func DefaultOptions() Options {
	return Options{Namespace: "default", Port: 8000, Protocol: "http", Resync: 30 * time.Second}
}

// AddFlags registers the --service-discovery flags on fs.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.BoolVar(&o.Enabled, "service-discovery", o.Enabled, "discover engine pods in Kubernetes by label selector and register them (in-cluster credentials)")
	fs.StringVar(&o.Selector, "selector", o.Selector, "label selector of regular engine pods, as kubectl parses it: 'app=vllm,tier in (a,b)'; several key=value words are joined with ','")
	fs.StringVar(&o.PrefillSelector, "prefill-selector", o.PrefillSelector, "label selector of PD prefill engine pods (bootstrap port from the "+AnnotationBootstrapPort+" annotation)")
	fs.StringVar(&o.DecodeSelector, "decode-selector", o.DecodeSelector, "label selector of PD decode engine pods")
	fs.StringVar(&o.Namespace, "service-discovery-namespace", o.Namespace, "namespace whose pods are discovered; '' for every namespace (needs a ClusterRole)")
	fs.IntVar(&o.Port, "service-discovery-port", o.Port, "engine port on each discovered pod")
	fs.StringVar(&o.Protocol, "service-discovery-protocol", o.Protocol, "protocol of discovered engines: http (URLs http://pod-ip:port) or grpc (grpc://pod-ip:port, SMG's gRPC engine protocol)")
}

// Role is what a selector makes a pod.
type Role struct {
	WorkerType string // regular, prefill, decode
	Selector   labels.Selector
	Raw        string
}

// Roles parses the selectors; an error carries the parser's message and the
// flag's name.
func (o Options) Roles() ([]Role, error) {
	var roles []Role
	var errs []error
	for _, r := range []struct{ flag, typ, raw string }{
		{"selector", "regular", o.Selector},
		{"prefill-selector", "prefill", o.PrefillSelector},
		{"decode-selector", "decode", o.DecodeSelector},
	} {
		if strings.TrimSpace(r.raw) == "" {
			continue
		}
		sel, err := labels.Parse(normalize(r.raw))
		if err != nil {
			errs = append(errs, fmt.Errorf("--%s %q: %v", r.flag, r.raw, err))
			continue
		}
		if sel.Empty() {
			errs = append(errs, fmt.Errorf("--%s %q selects every pod; name at least one label", r.flag, r.raw))
			continue
		}
		roles = append(roles, Role{WorkerType: r.typ, Selector: sel, Raw: r.raw})
	}
	return roles, errors.Join(errs...)
}

// normalize accepts SMG's space-separated key=value words ("app=sglang
// role=worker") as well as Kubernetes syntax: a space between two plain
// equality terms becomes a comma; anything else is left to the parser.
func normalize(s string) string {
	words := strings.Fields(s)
	for _, w := range words {
		if !strings.Contains(w, "=") || strings.ContainsAny(w, "(),") {
			return s
		}
	}
	return strings.Join(words, ",")
}

// Validate reports every invalid option, naming its flag.
func (o Options) Validate() error {
	if !o.Enabled {
		return nil
	}
	var errs []error
	roles, err := o.Roles()
	if err != nil {
		errs = append(errs, err)
	} else if len(roles) == 0 {
		errs = append(errs, errors.New("--service-discovery needs --selector, or --prefill-selector and --decode-selector"))
	}
	if (o.PrefillSelector == "") != (o.DecodeSelector == "") {
		errs = append(errs, errors.New("--prefill-selector and --decode-selector go together"))
	}
	if o.Port < 1 || o.Port > 65535 {
		errs = append(errs, fmt.Errorf("--service-discovery-port must be a port number (1-65535), got %d", o.Port))
	}
	switch o.Protocol {
	case "http", "grpc":
	default:
		errs = append(errs, fmt.Errorf("--service-discovery-protocol must be http or grpc, got %q", o.Protocol))
	}
	if o.Resync <= 0 {
		errs = append(errs, fmt.Errorf("service discovery resync must be positive, got %s", o.Resync))
	}
	return errors.Join(errs...)
}
