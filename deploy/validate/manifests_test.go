package validate

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

const repoRoot = "../.."

// kustomizations are every directory rendered and checked.
var kustomizations = []string{"../base", "../overlays/single", "../overlays/example", "../overlays/cert-manager"}

// routes are the HTTP routes each subcommand serves that manifests may probe or
// scrape; the live test proves each answers on the real binary.
var routes = map[string][]string{
	"controlplane": {"/health", "/metrics"},
	"router":       {"/health", "/readyz", "/metrics"},
	"agent":        {"/health", "/metrics"},
}

// grpcHealth lists the subcommands that serve grpc.health.v1 (K8s grpc probes).
var grpcHealth = map[string]bool{"controlplane": true}

func TestManifestsRenderAndDecodeStrictly(t *testing.T) {
	for _, dir := range kustomizations {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			objs, err := Render(dir)
			if err != nil {
				t.Fatal(err)
			}
			if len(objs.Deployments)+len(objs.StatefulSets) != 2 || len(objs.DaemonSets) != 1 || len(objs.HPAs) != 1 || len(objs.ServiceMonitors) != 1 {
				t.Fatalf("want the control plane (Deployment or StatefulSet) and router Deployment, the agent DaemonSet, one HPA and one ServiceMonitor; got %d, %d, %d, %d, %d",
					len(objs.Deployments), len(objs.StatefulSets), len(objs.DaemonSets), len(objs.HPAs), len(objs.ServiceMonitors))
			}
			checkInvariants(t, objs)
		})
	}
}

// The two layouts: the base (and the overlays built on it) runs the control
// plane as a StatefulSet of three; overlays/single as one in-memory replica,
// with nothing of the replicated layout left over.
func TestControlPlaneLayouts(t *testing.T) {
	for dir, replicated := range map[string]bool{"../base": true, "../overlays/example": true, "../overlays/cert-manager": true, "../overlays/single": false} {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			o, err := Render(dir)
			if err != nil {
				t.Fatal(err)
			}
			var ss, deps []string
			for _, s := range o.StatefulSets {
				ss = append(ss, s.Name)
			}
			for _, d := range o.Deployments {
				deps = append(deps, d.Name)
			}
			slices.Sort(deps)
			_, peers := o.Raw["Service/smg-controlplane-peers"]
			_, pdb := o.Raw["PodDisruptionBudget/smg-controlplane"]
			if replicated {
				if !slices.Equal(ss, []string{"smg-controlplane"}) || !slices.Equal(deps, []string{"smg-router"}) || !peers || !pdb {
					t.Errorf("want the control plane as StatefulSet/smg-controlplane with its peers Service and PodDisruptionBudget; got StatefulSets %v, Deployments %v, peers %v, PDB %v", ss, deps, peers, pdb)
				}
				return
			}
			if len(ss) != 0 || !slices.Equal(deps, []string{"smg-controlplane", "smg-router"}) || peers || pdb {
				t.Errorf("want one control plane Deployment and nothing of the replicated layout; got StatefulSets %v, Deployments %v, peers %v, PDB %v", ss, deps, peers, pdb)
			}
			for _, np := range o.NetworkPolicies {
				for _, r := range np.Spec.Ingress {
					for _, p := range r.Ports {
						if p.Port != nil && p.Port.String() == "raft" {
							t.Errorf("NetworkPolicy/%s opens a Raft port the single replica does not have", np.Name)
						}
					}
				}
			}
		})
	}
}

// Strict decoding is what catches a misspelt or misplaced field: prove it does.
func TestStrictDecodingRejectsUnknownFields(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "kustomization.yaml", "resources: [svc.yaml]\n")
	write(t, dir, "svc.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec:\n  selectr: {a: b}\n")
	if _, err := Render(dir); err == nil || !strings.Contains(err.Error(), "selectr") {
		t.Fatalf("a Service with an unknown field decoded; err = %v", err)
	}
	write(t, dir, "svc.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec:\n  selector: {a: b}\n")
	if _, err := Render(dir); err != nil {
		t.Fatalf("a valid Service failed to decode: %v", err)
	}
}

func TestParseArgs(t *testing.T) {
	cmd, flags, err := ParseArgs([]string{"launch", "--worker-urls", "http://a", "http://b", "--port=1", "--x", "-1", "--shed"})
	if err != nil || cmd != "launch" {
		t.Fatal(cmd, err)
	}
	if !slices.Equal(flags["worker-urls"], []string{"http://a", "http://b"}) || !slices.Equal(flags["port"], []string{"1"}) ||
		!slices.Equal(flags["x"], []string{"-1"}) || flags["shed"] == nil || len(flags["shed"]) != 0 {
		t.Fatalf("%q", flags)
	}
	if _, _, err := ParseArgs([]string{"--port", "1"}); err == nil {
		t.Fatal("args without a subcommand accepted")
	}
}

func TestCLIFlagsReadsGeneratedDocs(t *testing.T) {
	flags, err := CLIFlags(repoRoot, "launch")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"worker-urls", "worker-overload-shed", "load-monitor-interval", "port"} {
		if !flags[f] {
			t.Errorf("docs/cli/launch.md: flag --%s not found", f)
		}
	}
	if flags["definitely-not-a-flag"] {
		t.Error("unknown flag reported present")
	}
}

// Every patch of the overlay targets an object of the base and changes it
// (beyond the namespace and image the overlay sets everywhere).
func TestOverlayPatchesTargetBaseObjects(t *testing.T) {
	base, err := Render("../base")
	if err != nil {
		t.Fatal(err)
	}
	overlay, err := Render("../overlays/example")
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Patches []struct {
			Path   string `json:"path"`
			Patch  string `json:"patch"`
			Target *struct {
				Kind string `json:"kind"`
				Name string `json:"name"`
			} `json:"target"`
		} `json:"patches"`
	}
	b, err := os.ReadFile("../overlays/example/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &k); err != nil {
		t.Fatal(err)
	}
	if len(k.Patches) == 0 {
		t.Fatal("the example overlay has no patches")
	}
	for _, p := range k.Patches {
		var key string
		switch {
		case p.Target != nil:
			key = p.Target.Kind + "/" + p.Target.Name
		case p.Path != "":
			var head struct {
				Kind     string `json:"kind"`
				Metadata struct {
					Name string `json:"name"`
				} `json:"metadata"`
			}
			pb, err := os.ReadFile(filepath.Join("../overlays/example", p.Path))
			if err != nil {
				t.Fatal(err)
			}
			if err := yaml.Unmarshal(pb, &head); err != nil {
				t.Fatal(err)
			}
			key = head.Kind + "/" + head.Metadata.Name
		default:
			t.Fatalf("patch without target or path: %+v", p)
		}
		before, ok := base.Raw[key]
		if !ok {
			t.Errorf("overlay patch targets %s, which the base does not have", key)
			continue
		}
		if normalize(before) == normalize(overlay.Raw[key]) {
			t.Errorf("overlay patch on %s changes nothing", key)
		}
	}
}

// normalize drops the lines every overlay changes on every object.
func normalize(y []byte) string {
	var keep []string
	for _, l := range strings.Split(string(y), "\n") {
		f := strings.TrimSpace(l)
		if strings.HasPrefix(f, "namespace:") || strings.HasPrefix(f, "image:") {
			continue
		}
		keep = append(keep, l)
	}
	return strings.Join(keep, "\n")
}

func checkInvariants(t *testing.T, o *Objects) {
	t.Helper()
	workloads := o.Workloads()
	byCmd := map[string]Workload{}
	cmdFlags := map[string]map[string][]string{}
	for _, w := range workloads {
		where := w.Kind + "/" + w.Name
		if !Selects(w.Selector, w.Template.Labels) {
			t.Errorf("%s: selector %v does not match its pod labels %v", where, w.Selector, w.Template.Labels)
		}
		if len(w.Template.Spec.Containers) != 1 {
			t.Fatalf("%s: want one container", where)
		}
		c := w.Template.Spec.Containers[0]
		if !strings.HasPrefix(c.Image, "ghcr.io/smg-project/smg:") || strings.HasSuffix(c.Image, ":") {
			t.Errorf("%s: image %q is not a tagged smg image", where, c.Image)
		}
		checkResources(t, where, c)
		checkSecurityContext(t, where, w.Template.Spec, c)
		cmd, flags, err := ParseArgs(c.Args)
		if err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		known, err := CLIFlags(repoRoot, cmd)
		if err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		for f := range flags {
			if !known[f] {
				t.Errorf("%s: 'smg %s' has no flag --%s (docs/cli/%s.md)", where, cmd, f, cmd)
			}
		}
		checkEnvRefs(t, where, c)
		if last(flags["host"]) != "0.0.0.0" {
			t.Errorf("%s: --host %q: a pod must listen on its own IP (0.0.0.0)", where, last(flags["host"]))
		}
		for name, flag := range map[string]string{"http": "port", "grpc": "grpc-port"} {
			p, ok := containerPort(c, intstr.FromString(name))
			if !ok {
				continue
			}
			if last(flags[flag]) != strconv.Itoa(int(p)) {
				t.Errorf("%s: container port %q is %d but --%s is %q", where, name, p, flag, last(flags[flag]))
			}
		}
		checkProbes(t, where, cmd, c)
		if _, dup := byCmd[cmd]; dup {
			t.Errorf("%s: a second workload runs 'smg %s'", where, cmd)
		}
		byCmd[cmd] = w
		cmdFlags[cmd] = flags
	}
	for _, cmd := range []string{"controlplane", "router", "agent"} {
		if _, ok := byCmd[cmd]; !ok {
			t.Fatalf("no workload runs 'smg %s'", cmd)
		}
	}
	if cp := byCmd["controlplane"].Kind; byCmd["agent"].Kind != "DaemonSet" || (cp != "Deployment" && cp != "StatefulSet") || byCmd["router"].Kind != "Deployment" {
		t.Error("want the agent as a DaemonSet, the router as a Deployment and the control plane as a Deployment (one in-memory replica) or a StatefulSet (replicated)")
	}
	checkControlPlane(t, o, byCmd["controlplane"])
	checkReplicated(t, o, byCmd["controlplane"], cmdFlags["controlplane"])
	checkDiscovery(t, o, byCmd["controlplane"], cmdFlags["controlplane"])
	cpGRPC := last(cmdFlags["controlplane"]["grpc-port"])
	for _, cmd := range []string{"router", "agent"} {
		for _, addr := range strings.Split(last(cmdFlags[cmd]["controlplane"]), ",") {
			checkControlPlaneAddress(t, o, cmd, addr, byCmd["controlplane"], cpGRPC)
		}
	}
	// The router's Retry-After is its own --load-monitor-interval: it must be the
	// interval the control plane actually polls at.
	if r, c := orDefault(cmdFlags["router"]["load-monitor-interval"], "10"), orDefault(cmdFlags["controlplane"]["load-monitor-interval"], "10"); r != c {
		t.Errorf("router --load-monitor-interval %s differs from the control plane's %s (Retry-After would lie)", r, c)
	}
	checkAgent(t, byCmd["agent"], cmdFlags["agent"])
	checkTLS(t, o, byCmd, cmdFlags)
	checkServices(t, o, workloads)
	checkScaling(t, o, workloads)
	checkServiceMonitor(t, o)
	checkNamespace(t, o)
}

func checkResources(t *testing.T, where string, c corev1.Container) {
	t.Helper()
	cpu, mem := c.Resources.Requests.Cpu(), c.Resources.Requests.Memory()
	if cpu.IsZero() || mem.IsZero() {
		t.Errorf("%s: requests need cpu and memory (got %v, %v)", where, cpu, mem)
	}
	if lim := c.Resources.Limits.Memory(); lim.IsZero() || lim.Cmp(*mem) < 0 {
		t.Errorf("%s: memory limit %v must be set and at least the request %v", where, lim, mem)
	}
}

// checkSecurityContext: the image runs as 65532 from a read-only root with no
// capabilities; the manifests must not grant more than the image needs.
func checkSecurityContext(t *testing.T, where string, pod corev1.PodSpec, c corev1.Container) {
	t.Helper()
	ps, cs := pod.SecurityContext, c.SecurityContext
	if ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot {
		t.Errorf("%s: pod securityContext.runAsNonRoot must be true", where)
	}
	if ps != nil && ps.RunAsUser != nil && *ps.RunAsUser == 0 {
		t.Errorf("%s: pod runs as uid 0", where)
	}
	if cs == nil {
		t.Errorf("%s: container has no securityContext", where)
		return
	}
	if cs.ReadOnlyRootFilesystem == nil || !*cs.ReadOnlyRootFilesystem {
		t.Errorf("%s: container securityContext.readOnlyRootFilesystem must be true", where)
	}
	if cs.AllowPrivilegeEscalation == nil || *cs.AllowPrivilegeEscalation {
		t.Errorf("%s: container securityContext.allowPrivilegeEscalation must be false", where)
	}
	if cs.Privileged != nil && *cs.Privileged {
		t.Errorf("%s: container is privileged", where)
	}
	if cs.Capabilities == nil || !slices.Contains(cs.Capabilities.Drop, corev1.Capability("ALL")) || len(cs.Capabilities.Add) > 0 {
		t.Errorf("%s: container must drop ALL capabilities and add none", where)
	}
}

// checkEnvRefs: Kubernetes expands $(VAR) in args only for declared env vars;
// an undeclared one reaches smg literally.
func checkEnvRefs(t *testing.T, where string, c corev1.Container) {
	t.Helper()
	declared := map[string]bool{}
	for _, e := range c.Env {
		declared[e.Name] = true
	}
	for _, a := range c.Args {
		for rest := a; ; {
			i := strings.Index(rest, "$(")
			if i < 0 {
				break
			}
			j := strings.Index(rest[i:], ")")
			if j < 0 {
				break
			}
			if name := rest[i+2 : i+j]; !declared[name] {
				t.Errorf("%s: arg %q uses $(%s), which the container does not declare", where, a, name)
			}
			rest = rest[i+j:]
		}
	}
}

func checkProbes(t *testing.T, where, cmd string, c corev1.Container) {
	t.Helper()
	if c.LivenessProbe == nil || c.ReadinessProbe == nil {
		t.Errorf("%s: want liveness and readiness probes", where)
	}
	for kind, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
		switch {
		case p == nil:
		case p.HTTPGet != nil:
			if _, ok := containerPort(c, p.HTTPGet.Port); !ok {
				t.Errorf("%s: %s probe port %s is not a container port", where, kind, p.HTTPGet.Port.String())
			}
			if !slices.Contains(routes[cmd], p.HTTPGet.Path) {
				t.Errorf("%s: %s probe path %q is not a route of 'smg %s' %v", where, kind, p.HTTPGet.Path, cmd, routes[cmd])
			}
		case p.GRPC != nil:
			if _, ok := containerPort(c, intstr.FromInt32(p.GRPC.Port)); !ok {
				t.Errorf("%s: %s gRPC probe port %d is not a container port", where, kind, p.GRPC.Port)
			}
			if !grpcHealth[cmd] {
				t.Errorf("%s: 'smg %s' serves no gRPC health service", where, cmd)
			}
		default:
			t.Errorf("%s: %s probe must be httpGet or grpc", where, kind)
		}
	}
}

func checkControlPlane(t *testing.T, o *Objects, w Workload) {
	t.Helper()
	for _, d := range o.Deployments {
		if d.Name != w.Name {
			continue
		}
		// One registry, one verdict: two control planes would judge apart.
		if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 || d.Spec.Strategy.Type != "Recreate" {
			t.Errorf("Deployment/%s: the control plane needs replicas 1 and strategy Recreate", d.Name)
		}
		// A budget of more than its one replica would block every drain.
		for _, p := range o.PDBs {
			if p.Spec.Selector != nil && Selects(p.Spec.Selector.MatchLabels, w.Template.Labels) && p.Spec.MinAvailable != nil && p.Spec.MinAvailable.IntValue() >= 1 {
				t.Errorf("PodDisruptionBudget/%s keeps %s of the single control plane: no node could drain", p.Name, p.Spec.MinAvailable.String())
			}
		}
	}
	for _, h := range o.HPAs {
		if h.Spec.ScaleTargetRef.Name == w.Name {
			t.Errorf("HPA/%s scales the control plane, which must stay at one replica", h.Name)
		}
	}
	var guarded bool
	for _, np := range o.NetworkPolicies {
		if !Selects(np.Spec.PodSelector.MatchLabels, w.Template.Labels) {
			t.Errorf("NetworkPolicy/%s selects no control plane pod", np.Name)
			continue
		}
		for _, rule := range np.Spec.Ingress {
			for _, p := range rule.Ports {
				if p.Port == nil {
					continue
				}
				if _, ok := containerPort(w.Template.Spec.Containers[0], *p.Port); !ok {
					t.Errorf("NetworkPolicy/%s: port %s is not a control plane port", np.Name, p.Port.String())
				}
				if p.Port.String() == "grpc" && len(rule.From) > 0 {
					guarded = true
				}
			}
		}
	}
	if !guarded {
		t.Error("no NetworkPolicy limits who reaches the control plane's plaintext gRPC port")
	}
}

// checkControlPlaneAddress: the --controlplane HOST:PORT of a router or agent
// is a Service that reaches the control plane's gRPC port.
func checkControlPlaneAddress(t *testing.T, o *Objects, cmd, addr string, cp Workload, grpcPort string) {
	t.Helper()
	host, port, ok := strings.Cut(addr, ":")
	if !ok {
		t.Errorf("smg %s: --controlplane %q is not HOST:PORT", cmd, addr)
		return
	}
	// A StatefulSet pod by name: <statefulset>-<i>.<its headless Service>.
	if pod, svc, ok := strings.Cut(host, "."); ok && cp.Kind == "StatefulSet" {
		for _, st := range o.StatefulSets {
			i, err := strconv.Atoi(strings.TrimPrefix(pod, st.Name+"-"))
			if st.Name != cp.Name || !strings.HasPrefix(pod, st.Name+"-") || err != nil || i < 0 || i >= int(*st.Spec.Replicas) || svc != st.Spec.ServiceName {
				t.Errorf("smg %s: --controlplane %q is not a pod of StatefulSet/%s (<name>-<0..%d>.%s)", cmd, addr, st.Name, *st.Spec.Replicas-1, st.Spec.ServiceName)
			}
		}
		host = svc
	}
	for _, s := range o.Services {
		if s.Name != host {
			continue
		}
		if !Selects(s.Spec.Selector, cp.Template.Labels) {
			t.Errorf("smg %s: Service/%s does not select the control plane", cmd, host)
		}
		for _, sp := range s.Spec.Ports {
			if strconv.Itoa(int(sp.Port)) != port {
				continue
			}
			target, ok := containerPort(cp.Template.Spec.Containers[0], sp.TargetPort)
			if !ok || strconv.Itoa(int(target)) != grpcPort {
				t.Errorf("smg %s: Service/%s port %s reaches %d, not the control plane's --grpc-port %s", cmd, host, port, target, grpcPort)
			}
			return
		}
		t.Errorf("smg %s: Service/%s has no port %s", cmd, host, port)
		return
	}
	t.Errorf("smg %s: --controlplane %q names no Service", cmd, addr)
}

func checkAgent(t *testing.T, w Workload, flags map[string][]string) {
	t.Helper()
	c := w.Template.Spec.Containers[0]
	if last(flags["node"]) != "$(NODE_NAME)" {
		t.Errorf("agent: --node %q, want $(NODE_NAME) from the downward API", last(flags["node"]))
	}
	var fromDownwardAPI bool
	for _, e := range c.Env {
		if e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName" {
			fromDownwardAPI = true
		}
	}
	if !fromDownwardAPI {
		t.Error("agent: NODE_NAME must come from fieldRef spec.nodeName")
	}
	if len(w.Template.Spec.NodeSelector) == 0 && w.Template.Spec.Affinity == nil {
		t.Error("agent: the DaemonSet must be limited to GPU nodes (nodeSelector or affinity)")
	}
}

func checkServices(t *testing.T, o *Objects, ws []Workload) {
	t.Helper()
	for _, s := range o.Services {
		var matched []Workload
		for _, w := range ws {
			if Selects(s.Spec.Selector, w.Template.Labels) {
				matched = append(matched, w)
			}
		}
		if len(matched) != 1 {
			t.Errorf("Service/%s selects %d workloads, want 1", s.Name, len(matched))
			continue
		}
		for _, p := range s.Spec.Ports {
			if _, ok := containerPort(matched[0].Template.Spec.Containers[0], p.TargetPort); !ok {
				t.Errorf("Service/%s port %s: targetPort %s is not a port of %s", s.Name, p.Name, p.TargetPort.String(), matched[0].Name)
			}
		}
	}
}

func checkScaling(t *testing.T, o *Objects, ws []Workload) {
	t.Helper()
	for _, h := range o.HPAs {
		ref := h.Spec.ScaleTargetRef
		var target *Workload
		for i := range ws {
			if ws[i].Kind == ref.Kind && ws[i].Name == ref.Name {
				target = &ws[i]
			}
		}
		if target == nil {
			t.Errorf("HPA/%s targets %s/%s, which does not exist", h.Name, ref.Kind, ref.Name)
			continue
		}
		if h.Spec.MinReplicas == nil || *h.Spec.MinReplicas < 2 || *h.Spec.MinReplicas > h.Spec.MaxReplicas {
			t.Errorf("HPA/%s: want 2 <= minReplicas <= maxReplicas", h.Name)
		}
		if target.Template.Spec.Containers[0].Resources.Requests.Cpu().IsZero() {
			t.Errorf("HPA/%s: CPU utilization needs a CPU request on %s", h.Name, ref.Name)
		}
	}
	for _, p := range o.PDBs {
		var ok bool
		for _, w := range ws {
			ok = ok || Selects(p.Spec.Selector.MatchLabels, w.Template.Labels)
		}
		if !ok {
			t.Errorf("PodDisruptionBudget/%s selects no workload", p.Name)
		}
	}
}

func checkServiceMonitor(t *testing.T, o *Objects) {
	t.Helper()
	for _, sm := range o.ServiceMonitors {
		for _, s := range o.Services {
			if !Selects(sm.Spec.Selector.MatchLabels, s.Labels) {
				continue
			}
			for _, ep := range sm.Spec.Endpoints {
				if !slices.ContainsFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port }) {
					t.Errorf("ServiceMonitor/%s: Service/%s has no port named %q", sm.Name, s.Name, ep.Port)
				}
				if ep.Path != "/metrics" {
					t.Errorf("ServiceMonitor/%s: path %q, want /metrics", sm.Name, ep.Path)
				}
			}
		}
		// Each pod is scraped through one Service only.
		for i, a := range o.Services {
			for _, b := range o.Services[i+1:] {
				if Selects(sm.Spec.Selector.MatchLabels, a.Labels) && Selects(sm.Spec.Selector.MatchLabels, b.Labels) && maps.Equal(a.Spec.Selector, b.Spec.Selector) {
					t.Errorf("ServiceMonitor/%s scrapes the same pods twice, through Service/%s and Service/%s", sm.Name, a.Name, b.Name)
				}
			}
		}
		// A Service left out must select pods another scraped Service
		// reaches (the control plane's headless peers Service): every pod is
		// scraped once.
		for _, s := range o.Services {
			if Selects(sm.Spec.Selector.MatchLabels, s.Labels) {
				continue
			}
			if !slices.ContainsFunc(o.Services, func(other corev1.Service) bool {
				return other.Name != s.Name && Selects(sm.Spec.Selector.MatchLabels, other.Labels) && maps.Equal(other.Spec.Selector, s.Spec.Selector)
			}) {
				t.Errorf("ServiceMonitor/%s does not scrape Service/%s, and no scraped Service selects its pods", sm.Name, s.Name)
			}
		}
	}
}

func checkNamespace(t *testing.T, o *Objects) {
	t.Helper()
	for _, ns := range o.Namespaces {
		for _, d := range o.Deployments {
			if d.Namespace != ns.Name {
				t.Errorf("Deployment/%s is in namespace %q, not the overlay's %q", d.Name, d.Namespace, ns.Name)
			}
		}
	}
}

// containerPort resolves a port reference (number or name) against c's ports.
func containerPort(c corev1.Container, ref intstr.IntOrString) (int32, bool) {
	for _, p := range c.Ports {
		if (ref.Type == intstr.String && p.Name == ref.StrVal) || (ref.Type == intstr.Int && p.ContainerPort == ref.IntVal) {
			return p.ContainerPort, true
		}
	}
	return 0, false
}

func last(vs []string) string {
	if len(vs) == 0 {
		return ""
	}
	return vs[len(vs)-1]
}

func orDefault(vs []string, def string) string {
	if len(vs) == 0 {
		return def
	}
	return last(vs)
}

func write(t *testing.T, dir, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// checkReplicated: a replicated control plane is a StatefulSet of three with a
// volume per replica for --data-dir, a headless Service naming each pod (with
// the Raft port), --raft-peers listing exactly those pods, and a
// PodDisruptionBudget that keeps a quorum. An in-memory one sets no --data-dir.
func checkReplicated(t *testing.T, o *Objects, w Workload, flags map[string][]string) {
	t.Helper()
	dataDir := last(flags["data-dir"])
	if w.Kind != "StatefulSet" {
		if dataDir != "" {
			t.Errorf("%s/%s: --data-dir on a Deployment: use the base's StatefulSet for a durable registry", w.Kind, w.Name)
		}
		return
	}
	var st *appsv1.StatefulSet
	for i := range o.StatefulSets {
		if o.StatefulSets[i].Name == w.Name {
			st = &o.StatefulSets[i]
		}
	}
	where := "StatefulSet/" + w.Name
	if st.Spec.Replicas == nil || *st.Spec.Replicas != 3 {
		t.Errorf("%s: want 3 replicas (a quorum survives one loss)", where)
	}
	if st.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Errorf("%s: want podManagementPolicy Parallel: the replicas bootstrap together", where)
	}
	c := w.Template.Spec.Containers[0]
	var claimed bool
	for _, vm := range c.VolumeMounts {
		for _, pvc := range st.Spec.VolumeClaimTemplates {
			if vm.Name == pvc.Name && vm.MountPath == dataDir {
				claimed = true
			}
		}
	}
	if dataDir == "" || !claimed {
		t.Errorf("%s: --data-dir %q must be a volume from volumeClaimTemplates (one per replica)", where, dataDir)
	}
	raft, ok := containerPort(c, intstr.FromString("raft"))
	if !ok {
		t.Fatalf("%s: no container port named raft", where)
	}
	var headless bool
	for _, s := range o.Services {
		if s.Name == st.Spec.ServiceName && s.Spec.ClusterIP == corev1.ClusterIPNone && Selects(s.Spec.Selector, w.Template.Labels) {
			for _, p := range s.Spec.Ports {
				if p.TargetPort.String() == "raft" {
					headless = true
				}
			}
		}
	}
	if !headless {
		t.Errorf("%s: serviceName %q must be a headless Service selecting it with the raft port", where, st.Spec.ServiceName)
	}
	var want []string
	for i := range int(*st.Spec.Replicas) {
		pod := fmt.Sprintf("%s-%d", st.Name, i)
		want = append(want, fmt.Sprintf("%s=%s.%s:%d", pod, pod, st.Spec.ServiceName, raft))
	}
	var got []string
	for _, v := range flags["raft-peers"] {
		got = append(got, strings.Split(v, ",")...)
	}
	if !slices.Equal(got, want) {
		t.Errorf("%s: --raft-peers %v, want every replica %v", where, got, want)
	}
	if last(flags["node-id"]) != "$(POD_NAME)" || last(flags["raft-advertise"]) != fmt.Sprintf("$(POD_NAME).%s:%d", st.Spec.ServiceName, raft) {
		t.Errorf("%s: --node-id and --raft-advertise must name the pod ($(POD_NAME), $(POD_NAME).%s:%d)", where, st.Spec.ServiceName, raft)
	}
	var pdb bool
	for _, p := range o.PDBs {
		if p.Spec.Selector != nil && Selects(p.Spec.Selector.MatchLabels, w.Template.Labels) && p.Spec.MinAvailable != nil && p.Spec.MinAvailable.IntValue() == 2 {
			pdb = true
		}
	}
	if !pdb {
		t.Errorf("%s: want a PodDisruptionBudget with minAvailable 2 (a quorum through drains)", where)
	}
}
