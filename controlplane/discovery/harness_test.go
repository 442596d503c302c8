package discovery

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/smg-project/smg/controlplane/admin"
	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/podwatch"
	"github.com/smg-project/smg/internal/podwatch/podwatchtest"
)

// engines starts n tiny engines answering /v1/models, all on one port, at
// 127.0.0.2, 127.0.0.3, ...: pods with their own IPs and the discovery port.
func engines(t *testing.T, n int) (port int, ips []string) {
	t.Helper()
	for attempt := 0; attempt < 20; attempt++ {
		lns, ok := listenAll(n)
		if !ok {
			continue
		}
		port = lns[0].Addr().(*net.TCPAddr).Port
		for i, ln := range lns {
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				_, _ = fmt.Fprint(w, `{"data":[{"id":"m"}]}`)
			})}
			go func() { _ = srv.Serve(ln) }()
			t.Cleanup(func() { _ = srv.Close() })
			ips = append(ips, "127.0.0."+strconv.Itoa(i+2))
		}
		return port, ips
	}
	t.Fatal("no common free port on 127.0.0.2..")
	return 0, nil
}

func listenAll(n int) ([]net.Listener, bool) {
	first, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		return nil, false
	}
	lns := []net.Listener{first}
	port := first.Addr().(*net.TCPAddr).Port
	for i := 1; i < n; i++ {
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0."+strconv.Itoa(i+2), strconv.Itoa(port)))
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return nil, false
		}
		lns = append(lns, ln)
	}
	return lns, true
}

// clock is the injected clock of the grace rule.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// env is a registry, the admin registration path, a reconciler and a fake
// clientset watched by podwatch.
type env struct {
	t       *testing.T
	reg     *registry.Registry
	admin   *admin.Service
	rc      *Reconciler
	client  *fake.Clientset
	clock   *clock
	metrics *prometheus.Registry
	port    int
	ips     []string
	ns      string
}

const grace = 3 * time.Minute

func newEnv(t *testing.T, engineCount int) *env {
	t.Helper()
	port, ips := engines(t, engineCount)
	log := slog.New(slog.DiscardHandler)
	reg := registry.New("test", registry.DefaultHistory)
	g := judge.DefaultGatewayThresholds()
	resolve := func(b *smgv1.OverloadBlock) (judge.Thresholds, error) {
		if b == nil {
			return g.Resolve(nil), nil
		}
		blk := &judge.Block{TokenUsage: b.TokenUsage}
		if b.WaitingRequests != nil {
			w := int64(b.GetWaitingRequests())
			blk.WaitingRequests = &w
		}
		if err := blk.Validate(); err != nil {
			return judge.Thresholds{}, err
		}
		return g.Resolve(blk), nil
	}
	ad := admin.New(reg, admin.Options{RegistrationTimeout: 10 * time.Second}, resolve, &http.Client{}, log)
	t.Cleanup(ad.Close)
	pm := prometheus.NewRegistry()
	m, err := NewMetrics(pm)
	if err != nil {
		t.Fatal(err)
	}
	c := &clock{now: time.Unix(1_000_000, 0)}
	rc := New(reg, ad, Options{Grace: grace, Now: c.Now, CheckOverload: func(b *smgv1.OverloadBlock) error {
		_, err := resolve(b)
		return err
	}}, m, log)
	return &env{t: t, reg: reg, admin: ad, rc: rc, client: fake.NewClientset(), clock: c, metrics: pm, port: port, ips: ips, ns: "default"}
}

// watch runs podwatch over the fake clientset into the reconciler.
func (e *env) watch(opts podwatch.Options, node string) {
	e.t.Helper()
	opts.Enabled, opts.Port = true, e.port
	if opts.Namespace == "" {
		opts.Namespace = e.ns
	}
	if opts.Resync == 0 {
		opts.Resync = time.Hour
	}
	source := podwatch.SourceControlPlane
	if node != "" {
		source = podwatch.SourceAgent(node)
	}
	w, err := podwatch.NewWatcher(podwatchtest.Fake(e.client), opts, node, source, e.rc, slog.New(slog.DiscardHandler))
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	e.t.Cleanup(func() { cancel(); <-done })
}

func pod(name, ip string, ready bool, lbls map[string]string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: lbls},
		Spec:       corev1.PodSpec{NodeName: "node-a"},
		Status:     corev1.PodStatus{PodIP: ip},
	}
	setReady(p, ready)
	return p
}

func setReady(p *corev1.Pod, ready bool) {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}
}

func (e *env) create(p *corev1.Pod) {
	e.t.Helper()
	if _, err := e.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// edit reads a pod, changes it and writes it back.
func (e *env) edit(name string, fn func(*corev1.Pod)) {
	e.t.Helper()
	pods := e.client.CoreV1().Pods(e.ns)
	p, err := pods.Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	fn(p)
	if _, err := pods.Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) delete(name string) {
	e.t.Helper()
	if err := e.client.CoreV1().Pods(e.ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) url(i int) string {
	return "http://" + net.JoinHostPort(e.ips[i], strconv.Itoa(e.port))
}

// state is the registry as "url type" lines, registered workers only.
func (e *env) state() []string {
	var out []string
	for _, w := range e.reg.Snapshot().Workers() {
		out = append(out, w.Spec.GetUrl()+" "+w.Type)
	}
	sort.Strings(out)
	return out
}

// waitState waits (on registry commits, bounded) until the registry holds
// exactly want.
func (e *env) waitState(want ...string) {
	e.t.Helper()
	sort.Strings(want)
	deadline := time.After(20 * time.Second)
	for {
		changed := e.reg.Changed()
		got := e.state()
		if fmt.Sprint(got) == fmt.Sprint(want) {
			return
		}
		select {
		case <-changed:
		case <-time.After(50 * time.Millisecond): // informer deliveries commit nothing until they register
		case <-deadline:
			e.t.Fatalf("registry holds %q, want %q", got, want)
		}
	}
}

func (e *env) worker(url string) *registry.Worker {
	e.t.Helper()
	w := e.reg.Snapshot().GetByURL(url)
	if w == nil {
		e.t.Fatalf("no worker at %s", url)
	}
	return w
}

func (e *env) events(ev string) float64 {
	return testutil.ToFloat64(e.rc.m.events.WithLabelValues(ev))
}

func (e *env) pods(state string) float64 {
	return testutil.ToFloat64(e.rc.m.pods.WithLabelValues(state))
}
