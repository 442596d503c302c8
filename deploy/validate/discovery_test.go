package validate

import (
	"bytes"
	"os"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// checkDiscovery: a control plane with --service-discovery needs a parsable
// selector and a ServiceAccount whose token is mounted and which may get,
// list and watch pods in the namespace it discovers (a Role there, or a
// ClusterRole for every namespace).
func checkDiscovery(t *testing.T, o *Objects, w Workload, flags map[string][]string) {
	t.Helper()
	if _, on := flags["service-discovery"]; !on {
		return
	}
	where := w.Kind + "/" + w.Name
	for _, f := range []string{"selector", "prefill-selector", "decode-selector"} {
		if v := last(flags[f]); v != "" {
			if _, err := labels.Parse(v); err != nil {
				t.Errorf("%s: --%s %q: %v", where, f, v, err)
			}
		}
	}
	spec := w.Template.Spec
	sa := spec.ServiceAccountName
	if sa == "" || sa == "default" {
		t.Fatalf("%s: --service-discovery needs its own serviceAccountName", where)
	}
	if spec.AutomountServiceAccountToken != nil && !*spec.AutomountServiceAccountToken {
		t.Errorf("%s: the pod does not mount its ServiceAccount token, which discovery needs", where)
	}
	i := slices.IndexFunc(o.ServiceAccounts, func(a corev1.ServiceAccount) bool { return a.Name == sa })
	if i < 0 {
		t.Fatalf("%s: ServiceAccount %s does not exist", where, sa)
	}
	podNS := o.ServiceAccounts[i].Namespace
	ns := orDefault(flags["service-discovery-namespace"], "default")
	if ns == "" {
		t.Errorf("%s: every namespace needs the ClusterRole of deploy/discovery/rbac-cluster.yaml, not this overlay's Role", where)
		return
	}
	for _, b := range o.RoleBindings {
		if b.Namespace != ns || b.RoleRef.Kind != "Role" || !bindsSA(b.Subjects, sa, podNS, b.Namespace) {
			continue
		}
		for _, r := range o.Roles {
			if r.Name == b.RoleRef.Name && r.Namespace == ns && readsPods(r.Rules) {
				return
			}
		}
	}
	t.Errorf("%s: no Role in namespace %q bound to ServiceAccount %s lets it get, list and watch pods", where, ns, sa)
}

func bindsSA(subjects []rbacv1.Subject, sa, saNS, bindingNS string) bool {
	for _, s := range subjects {
		ns := s.Namespace
		if ns == "" {
			ns = bindingNS
		}
		if s.Kind == "ServiceAccount" && s.Name == sa && ns == saNS {
			return true
		}
	}
	return false
}

// readsPods: the rules grant get, list and watch on core pods, and nothing
// else (discovery only reads).
func readsPods(rules []rbacv1.PolicyRule) bool {
	ok := false
	for _, r := range rules {
		if !slices.Equal(r.APIGroups, []string{""}) || !slices.Equal(r.Resources, []string{"pods"}) {
			return false
		}
		for _, v := range r.Verbs {
			if !slices.Contains([]string{"get", "list", "watch"}, v) {
				return false
			}
		}
		ok = ok || (slices.Contains(r.Verbs, "get") && slices.Contains(r.Verbs, "list") && slices.Contains(r.Verbs, "watch"))
	}
	return ok
}

// TestClusterRBACDecodes decodes deploy/discovery/rbac-cluster.yaml strictly:
// a read-only ClusterRole on pods bound to the control plane's and the
// agents' ServiceAccounts.
func TestClusterRBACDecodes(t *testing.T) {
	raw, err := os.ReadFile("../discovery/rbac-cluster.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var role rbacv1.ClusterRole
	var binding rbacv1.ClusterRoleBinding
	var sas []corev1.ServiceAccount
	for _, doc := range bytes.Split(raw, []byte("\n---\n")) {
		var head struct{ Kind string }
		if err := yaml.Unmarshal(doc, &head); err != nil {
			t.Fatal(err)
		}
		switch head.Kind {
		case "ClusterRole":
			err = yaml.UnmarshalStrict(doc, &role)
		case "ClusterRoleBinding":
			err = yaml.UnmarshalStrict(doc, &binding)
		case "ServiceAccount":
			var sa corev1.ServiceAccount
			err = yaml.UnmarshalStrict(doc, &sa)
			sas = append(sas, sa)
		default:
			t.Fatalf("unexpected kind %q", head.Kind)
		}
		if err != nil {
			t.Fatalf("%s: %v", head.Kind, err)
		}
	}
	if !readsPods(role.Rules) {
		t.Errorf("ClusterRole/%s: want get, list and watch on pods only, got %+v", role.Name, role.Rules)
	}
	if binding.RoleRef.Kind != "ClusterRole" || binding.RoleRef.Name != role.Name {
		t.Errorf("ClusterRoleBinding/%s refers to %s/%s", binding.Name, binding.RoleRef.Kind, binding.RoleRef.Name)
	}
	for _, sa := range []string{"smg-controlplane", "smg-agent"} {
		if !bindsSA(binding.Subjects, sa, "smg", "") {
			t.Errorf("ClusterRoleBinding/%s does not bind ServiceAccount smg/%s", binding.Name, sa)
		}
	}
	if len(sas) != 1 || sas[0].Name != "smg-agent" {
		t.Errorf("want the smg-agent ServiceAccount (the control plane's is in rbac-namespace.yaml), got %d", len(sas))
	}
}
