package validate

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// specMetrics is the spec's metrics table (facts.md "Metrics"): names a
// dashboard or alert may use even before an event creates their first series.
var specMetrics = []string{
	"smg_workers_overloaded", "smg_worker_overload_shed_total", "smg_worker_overload_fallback_total",
	"smg_worker_liveness_fallback_total", "smg_worker_stalled", "smg_worker_stall_transitions_total",
	"smg_pd_admission_waits_total", "smg_pd_admission_sheds_total", "smg_engine_waiting_requests",
	"smg_engine_token_usage", "smg_engine_running_requests", "smg_engine_gen_throughput", "smg_engine_cache_hit_rate",
}

// TestManifestsRunOnLoopback plays kubelet: it starts each workload's
// container args (host and ports moved to free loopback ports, $(VARS)
// expanded, --controlplane pointed at the loopback control plane) with the
// real smg binary, and requires every probe to pass and every /metrics page
// to satisfy `promtool check metrics`.
func TestManifestsRunOnLoopback(t *testing.T) {
	bin := smgBinary(t)
	var exported []string
	for _, dir := range kustomizations {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			objs, err := Render(dir)
			if err != nil {
				t.Fatal(err)
			}
			byCmd := map[string]Workload{}
			for _, w := range objs.Workloads() {
				byCmd[w.Template.Spec.Containers[0].Args[0]] = w
			}
			cpHTTP, cpGRPC := freePort(t), freePort(t)
			ports := map[string]map[string]int{ // cmd → container port name → loopback port
				"controlplane": {"http": cpHTTP, "grpc": cpGRPC},
				"router":       {"http": freePort(t)},
				"agent":        {"http": freePort(t)},
			}
			cpAddr := "127.0.0.1:" + itoa(cpGRPC)
			env := map[string]string{"NODE_NAME": "gpu-node-a", "POD_NAME": "smg-router-test"}
			pki := newTestPKI(t)          // plays cert-manager for overlays that mount certificates
			scheme := map[string]string{} // cmd -> http or https
			for _, cmd := range []string{"controlplane", "router", "agent"} {
				w, ok := byCmd[cmd]
				if !ok {
					t.Fatalf("no workload runs 'smg %s'", cmd)
				}
				set := map[string]string{"host": "127.0.0.1", "port": itoa(ports[cmd]["http"]), "controlplane": cpAddr}
				if cmd == "controlplane" {
					set["grpc-port"] = itoa(cpGRPC)
					// A replicated control plane runs as a cluster of one on
					// loopback: its own data dir, Raft on a free port.
					raft := "127.0.0.1:" + itoa(freePort(t))
					set["data-dir"], set["raft-addr"], set["raft-advertise"] = t.TempDir(), raft, raft
					set["advertise-host"], set["raft-peers"] = "127.0.0.1", env["POD_NAME"]+"="+raft
				}
				_, flags, err := ParseArgs(w.Template.Spec.Containers[0].Args)
				if err != nil {
					t.Fatal(err)
				}
				scheme[cmd] = "http"
				if last(flags["tls-cert-file"]) != "" {
					scheme[cmd] = "https"
				}
				for f, path := range pki.files(t, objs, w, flags) {
					set[f] = path
				}
				args := rewriteArgs(w.Template.Spec.Containers[0].Args, set, env)
				start(t, cmd, bin, args...)
			}
			ctx := t.Context()
			for _, cmd := range []string{"controlplane", "router", "agent"} {
				c := byCmd[cmd].Template.Spec.Containers[0]
				for kind, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
					if p == nil {
						continue
					}
					what := fmt.Sprintf("%s %s probe", cmd, kind)
					switch {
					case p.HTTPGet != nil:
						url := fmt.Sprintf("%s://127.0.0.1:%d%s", strings.ToLower(string(orHTTP(p.HTTPGet.Scheme))), loopbackPort(t, c, p.HTTPGet.Port, ports[cmd]), p.HTTPGet.Path)
						eventually(t, 20*time.Second, what+" GET "+url, func() error { return wantOK(ctx, url) })
					case p.GRPC != nil:
						addr := fmt.Sprintf("127.0.0.1:%d", loopbackPort(t, c, intstr.FromInt32(p.GRPC.Port), ports[cmd]))
						eventually(t, 20*time.Second, what+" grpc.health.v1 on "+addr, func() error { return grpcServing(ctx, addr) })
					}
				}
				for _, route := range routes[cmd] {
					url := fmt.Sprintf("%s://127.0.0.1:%d%s", scheme[cmd], ports[cmd]["http"], route)
					eventually(t, 20*time.Second, cmd+" route "+route, func() error { return wantOK(ctx, url) })
				}
			}
			// Scraped once every probe passed: the control plane exports a
			// router's watch lag only once the router watches (a replicated
			// control plane elects itself first), which its readiness says.
			for _, cmd := range []string{"controlplane", "router", "agent"} {
				_, page, err := get(ctx, fmt.Sprintf("%s://127.0.0.1:%d/metrics", scheme[cmd], ports[cmd]["http"]))
				if err != nil {
					t.Fatal(err)
				}
				exported = append(exported, metricNames(string(page))...)
				t.Run("promtool check metrics "+cmd, func(t *testing.T) { promtoolCheckMetrics(t, page) })
			}
		})
	}
	t.Run("alerts and dashboard use exported metrics", func(t *testing.T) {
		known := append(slices.Clone(specMetrics), exported...)
		for _, src := range []string{"../prometheus/alerts.yaml", "../grafana/smg.json"} {
			b, err := os.ReadFile(src)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range smgMetricRE.FindAllString(string(b), -1) {
				if !slices.Contains(known, m) {
					t.Errorf("%s uses %s, which neither the spec nor any smg component exports", src, m)
				}
			}
		}
	})
}

var smgMetricRE = regexp.MustCompile(`\bsmg_[a-z0-9_]+`)

// metricNames lists the metric families a /metrics page declares.
func metricNames(page string) []string {
	var names []string
	for _, line := range strings.Split(page, "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == "#" && f[1] == "TYPE" {
			names = append(names, f[2])
		}
	}
	return names
}

func promtoolCheckMetrics(t *testing.T, page []byte) {
	cmd := exec.Command(tool(t, "promtool"), "check", "metrics")
	cmd.Stdin = strings.NewReader(string(page))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
}

// orHTTP is a probe's scheme, HTTP when unset (as kubelet reads it).
func orHTTP(s corev1.URIScheme) corev1.URIScheme {
	if s == "" {
		return corev1.URISchemeHTTP
	}
	return s
}

// rewriteArgs replaces the value of each flag in set and expands $(VAR).
func rewriteArgs(args []string, set, env map[string]string) []string {
	// Loopback has no Kubernetes API: discovery is checked by checkDiscovery
	// and by smg's own tests with client-go's fake clientset.
	out := slices.DeleteFunc(slices.Clone(args), func(a string) bool { return a == "--service-discovery" })
	for i := 1; i < len(out); i++ {
		if v, ok := set[strings.TrimLeft(out[i], "-")]; ok && strings.HasPrefix(out[i], "-") && i+1 < len(out) {
			out[i+1] = v
			i++
			continue
		}
		for k, v := range env {
			out[i] = strings.ReplaceAll(out[i], "$("+k+")", v)
		}
	}
	return out
}

// loopbackPort maps a probe's port (name or number) to where the container's
// port was moved on loopback.
func loopbackPort(t *testing.T, c corev1.Container, ref intstr.IntOrString, moved map[string]int) int {
	t.Helper()
	for _, p := range c.Ports {
		if (ref.Type == intstr.String && p.Name == ref.StrVal) || (ref.Type == intstr.Int && p.ContainerPort == ref.IntVal) {
			if port, ok := moved[p.Name]; ok {
				return port
			}
		}
	}
	t.Fatalf("%s: probe port %s maps to no moved container port", c.Name, ref.String())
	return 0
}

func grpcServing(ctx context.Context, addr string) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return err
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("status %v", resp.GetStatus())
	}
	return nil
}

// jsonExprs collects every "expr" string of a Grafana dashboard.
func jsonExprs(v any) []string {
	var out []string
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if s, ok := e.(string); ok && k == "expr" {
				out = append(out, s)
			} else {
				out = append(out, jsonExprs(e)...)
			}
		}
	case []any:
		for _, e := range x {
			out = append(out, jsonExprs(e)...)
		}
	}
	return out
}

func dashboardExprs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../grafana/smg.json")
	if err != nil {
		t.Fatal(err)
	}
	var d any
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("smg.json: %v", err)
	}
	exprs := jsonExprs(d)
	if len(exprs) < 8 {
		t.Fatalf("smg.json has %d queries, want one per panel", len(exprs))
	}
	return exprs
}
