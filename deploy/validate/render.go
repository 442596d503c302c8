// Package validate renders smg's Kubernetes manifests with the kustomize Go API,
// decodes every object strictly into the Kubernetes API types (an unknown or
// misplaced field fails), and checks the invariants that tie them to the smg
// binary: flags that exist, probes on real routes and ports, selectors that
// match, a control plane address that resolves to its Service.
//
// It reads the manifests and the smg binary's flags; it changes neither.
package validate

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	certmanagerv1 "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// Objects is one rendered kustomization, decoded by kind.
type Objects struct {
	Namespaces      []corev1.Namespace
	Deployments     []appsv1.Deployment
	StatefulSets    []appsv1.StatefulSet
	DaemonSets      []appsv1.DaemonSet
	Services        []corev1.Service
	HPAs            []autoscalingv2.HorizontalPodAutoscaler
	PDBs            []policyv1.PodDisruptionBudget
	NetworkPolicies []networkingv1.NetworkPolicy
	ServiceMonitors []monitoringv1.ServiceMonitor
	Issuers         []certmanagerv1.Issuer
	Certificates    []certmanagerv1.Certificate
	ServiceAccounts []corev1.ServiceAccount
	Roles           []rbacv1.Role
	RoleBindings    []rbacv1.RoleBinding
	ClusterRoles    []rbacv1.ClusterRole
	ClusterBindings []rbacv1.ClusterRoleBinding
	// Raw holds each object's rendered YAML under "Kind/name".
	Raw map[string][]byte
}

// Render runs kustomize on dir (a base or an overlay) and decodes each object
// strictly. A kind this package does not know is an error, so nothing slips
// through undecoded.
func Render(dir string) (*Objects, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize %s: %w", dir, err)
	}
	objs := &Objects{Raw: map[string][]byte{}}
	for _, r := range rm.Resources() {
		y, err := r.AsYAML()
		if err != nil {
			return nil, err
		}
		key := r.GetKind() + "/" + r.GetName()
		objs.Raw[key] = y
		if err := objs.add(r.GetApiVersion(), r.GetKind(), y); err != nil {
			return nil, fmt.Errorf("%s: %w", key, err)
		}
	}
	return objs, nil
}

func (o *Objects) add(apiVersion, kind string, y []byte) error {
	switch apiVersion + " " + kind {
	case "v1 Namespace":
		return decodeInto(y, &o.Namespaces)
	case "apps/v1 Deployment":
		return decodeInto(y, &o.Deployments)
	case "apps/v1 StatefulSet":
		return decodeInto(y, &o.StatefulSets)
	case "apps/v1 DaemonSet":
		return decodeInto(y, &o.DaemonSets)
	case "v1 Service":
		return decodeInto(y, &o.Services)
	case "autoscaling/v2 HorizontalPodAutoscaler":
		return decodeInto(y, &o.HPAs)
	case "policy/v1 PodDisruptionBudget":
		return decodeInto(y, &o.PDBs)
	case "networking.k8s.io/v1 NetworkPolicy":
		return decodeInto(y, &o.NetworkPolicies)
	case "monitoring.coreos.com/v1 ServiceMonitor":
		return decodeInto(y, &o.ServiceMonitors)
	case "cert-manager.io/v1 Issuer":
		return decodeInto(y, &o.Issuers)
	case "cert-manager.io/v1 Certificate":
		return decodeInto(y, &o.Certificates)
	case "v1 ServiceAccount":
		return decodeInto(y, &o.ServiceAccounts)
	case "rbac.authorization.k8s.io/v1 Role":
		return decodeInto(y, &o.Roles)
	case "rbac.authorization.k8s.io/v1 RoleBinding":
		return decodeInto(y, &o.RoleBindings)
	case "rbac.authorization.k8s.io/v1 ClusterRole":
		return decodeInto(y, &o.ClusterRoles)
	case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
		return decodeInto(y, &o.ClusterBindings)
	}
	return fmt.Errorf("unexpected apiVersion/kind %s %s: teach deploy/validate to decode it", apiVersion, kind)
}

// decodeInto strictly decodes y (unknown and duplicate fields fail) and appends
// the object to list.
func decodeInto[T any](y []byte, list *[]T) error {
	var v T
	if err := yaml.UnmarshalStrict(y, &v); err != nil {
		return err
	}
	*list = append(*list, v)
	return nil
}

// Workload is a pod template with the name of the object that owns it.
type Workload struct {
	Kind, Name string
	Selector   map[string]string
	Template   corev1.PodTemplateSpec
}

// Workloads lists every Deployment, StatefulSet and DaemonSet.
func (o *Objects) Workloads() []Workload {
	var ws []Workload
	for _, d := range o.Deployments {
		ws = append(ws, Workload{"Deployment", d.Name, matchLabels(d.Spec.Selector.MatchLabels), d.Spec.Template})
	}
	for _, d := range o.StatefulSets {
		ws = append(ws, Workload{"StatefulSet", d.Name, matchLabels(d.Spec.Selector.MatchLabels), d.Spec.Template})
	}
	for _, d := range o.DaemonSets {
		ws = append(ws, Workload{"DaemonSet", d.Name, matchLabels(d.Spec.Selector.MatchLabels), d.Spec.Template})
	}
	return ws
}

func matchLabels(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// Selects reports whether a non-empty equality selector matches labels.
func Selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// CLIFlags reads the flags a subcommand accepts from docs/cli/<cmd>.md, which
// `make docs` generates from `smg <cmd> --help` (and a test keeps current).
func CLIFlags(repoRoot, cmd string) (map[string]bool, error) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "docs", "cli", cmd+".md"))
	if err != nil {
		return nil, fmt.Errorf("flags of 'smg %s': %w (run 'make docs')", cmd, err)
	}
	flags := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		// Flag lines are indented "  --name type" (or Go's "  -name type").
		if !strings.HasPrefix(line, "  -") || strings.HasPrefix(line, "   ") {
			continue
		}
		name := strings.TrimLeft(strings.Fields(line)[0], "-")
		flags[name] = true
	}
	if len(flags) == 0 {
		return nil, fmt.Errorf("docs/cli/%s.md lists no flags", cmd)
	}
	return flags, nil
}

// ParseArgs splits a container's args into the subcommand and its flags
// (name → values; a list flag keeps every value that follows it, and a repeated
// flag accumulates, so the last value is the one a scalar flag takes).
func ParseArgs(args []string) (cmd string, flags map[string][]string, err error) {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return "", nil, fmt.Errorf("args %q: the first arg must be the subcommand", args)
	}
	flags = map[string][]string{}
	cur := ""
	for _, a := range args[1:] {
		if strings.HasPrefix(a, "-") && len(a) > 1 && !isNumber(a) {
			name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
			cur = name
			if _, seen := flags[cur]; !seen {
				flags[cur] = []string{}
			}
			if hasVal {
				flags[cur] = append(flags[cur], val)
			}
			continue
		}
		if cur == "" {
			return "", nil, fmt.Errorf("args %q: value %q before any flag", args, a)
		}
		flags[cur] = append(flags[cur], a)
	}
	return args[0], flags, nil
}

func isNumber(s string) bool {
	for i, c := range s {
		if !(c >= '0' && c <= '9' || c == '.' || (i == 0 && c == '-')) {
			return false
		}
	}
	return true
}
