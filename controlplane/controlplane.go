// Package controlplane wires the control plane: the registry, the admin API
// (gRPC and REST), the health checker, the load monitor with its overload
// verdicts, and the watch stream to routers.
//
// It owns the order components are built and started in, their options and
// flags, and the listeners. It holds no rule and no state of its own: every
// verdict is decided in the registry's transaction (registry.decide), every
// piece of evidence is collected by its package.
package controlplane

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	grpchealth "google.golang.org/grpc/health"
	"google.golang.org/grpc/status"

	"github.com/smg-project/smg/controlplane/admin"
	"github.com/smg-project/smg/controlplane/agentsvc"
	"github.com/smg-project/smg/controlplane/cluster"
	"github.com/smg-project/smg/controlplane/discovery"
	"github.com/smg-project/smg/controlplane/evidence"
	"github.com/smg-project/smg/controlplane/health"
	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/monitor"
	"github.com/smg-project/smg/controlplane/registry"
	"github.com/smg-project/smg/controlplane/watch"
	"github.com/smg-project/smg/controlplane/windows"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/cli"
	"github.com/smg-project/smg/internal/enginegrpc"
	"github.com/smg-project/smg/internal/identity"
	"github.com/smg-project/smg/internal/inproc"
	"github.com/smg-project/smg/internal/podwatch"
	"github.com/smg-project/smg/internal/readbudget"
	"github.com/smg-project/smg/internal/tlsutil"
	"github.com/smg-project/smg/internal/workerurl"
)

// Options configure the control plane; AddFlags binds them to flags (each
// field is the flag of its name, described there).
type Options struct {
	WorkerURLs cli.List
	// EngineTLS verifies https:// engines (nil: Go's defaults); set by the
	// command from --engine-ca-file and friends.
	EngineTLS                     *tlsutil.ClientOptions
	PrefillURLs                   cli.List
	DecodeURLs                    cli.List
	LoadMonitorInterval           int // seconds
	Thresholds                    judge.GatewayThresholds
	Health                        health.Options
	Liveness                      judge.LivenessConfig
	AdminAPIKey                   string
	WatchToken                    string
	WatchLoadInterval             time.Duration
	AgentToken                    string
	AgentTokenFile                string
	AgentModels                   cli.List
	AgentAnyModel                 bool
	RegistrationTimeout           time.Duration
	AllowLinkLocalWorkers         bool
	ProviderAllowInsecureLoopback bool
	EngineReadBudgetMiB           int
	GRPCEngineMaxMessageMiB       int
	AdmissionWindow               bool // --worker-admission-window
	AdmissionQueue                int  // --worker-admission-queue
	TokenBudget                   bool // --worker-token-budget
	// Now is the clock of every component (nil: time.Now); tests inject one.
	Now       func() time.Time
	Cluster   cluster.Options // --data-dir and the replication flags
	Discovery podwatch.Options
	// KubeClient lists and watches pods for --service-discovery (nil: the
	// pod's in-cluster credentials).
	KubeClient podwatch.Client
	// The scale harness's hooks (nil: none): watch.Options.Sent times the
	// fan-out; agentsvc.Options.Applying blocks to model a control plane
	// that has stopped reading its agents.
	WatchSent     func(routerID string, revision uint64)
	AgentApplying func()
}

// DefaultOptions returns the spec's defaults.
func DefaultOptions() Options {
	return Options{
		LoadMonitorInterval:     10,
		Thresholds:              judge.DefaultGatewayThresholds(),
		Health:                  health.DefaultOptions(),
		Liveness:                judge.DefaultLivenessConfig(),
		RegistrationTimeout:     30 * time.Second,
		EngineReadBudgetMiB:     readbudget.DefaultMiB,
		GRPCEngineMaxMessageMiB: enginegrpc.DefaultMaxMessageMiB,
		WatchLoadInterval:       watch.DefaultLoadInterval,
		Cluster:                 cluster.DefaultOptions(),
		Discovery:               podwatch.DefaultOptions(),
	}
}

// AddFlags registers the control plane's flags on fs.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.Var(&o.WorkerURLs, "worker-urls", "engine URLs to register at start, space-separated after one flag or repeated (model discovered from /v1/models)")
	fs.Var(&o.PrefillURLs, "prefill", "PD prefill engine to register at start: URL [BOOTSTRAP_PORT], repeatable (no port: the engine's default)")
	fs.Var(&o.DecodeURLs, "decode", "PD decode engine to register at start: URL, repeatable")
	fs.IntVar(&o.LoadMonitorInterval, "load-monitor-interval", o.LoadMonitorInterval, "seconds between load polls of each worker group (> 0); also the Retry-After of a shed")
	o.Thresholds.AddFlags(fs)
	o.Health.AddFlags(fs)
	o.Liveness.AddFlags(fs)
	fs.StringVar(&o.AdminAPIKey, "admin-api-key", o.AdminAPIKey, "when set, every admin route but /loads needs 'Authorization: Bearer <key>' (REST and gRPC)")
	fs.StringVar(&o.WatchToken, "watch-token", o.WatchToken, "when set, routers must present it ('authorization: Bearer <token>') to watch")
	fs.DurationVar(&o.WatchLoadInterval, "watch-load-interval", o.WatchLoadInterval,
		"how often a change to a worker's load alone reaches routers, on a grid shared by every router (verdicts, health and window shares go at once); 0 sends every load at once")
	fs.StringVar(&o.AgentToken, "agent-token", o.AgentToken,
		"when set, agents may present it ('authorization: Bearer <token>') to push records; it names no node, so an agent's node is taken on trust (prefer --agent-token-file)")
	fs.StringVar(&o.AgentTokenFile, "agent-token-file", o.AgentTokenFile,
		"file of per-node agent tokens, one '<token> <node> [<address>...]' per line, an address being a host, an IP or a CIDR prefix (the node's pod CIDR): a token speaks only for its node's workers, and registers only engines at the addresses given (or the one it connects from)")
	fs.Var(&o.AgentModels, "agent-models", "models agents may register engines for with smg agent --register (space-separated or repeated); none by default")
	fs.BoolVar(&o.AgentAnyModel, "agent-register-any-model", o.AgentAnyModel, "let agents register engines for any model, not only --agent-models")
	fs.IntVar(&o.EngineReadBudgetMiB, "engine-read-budget-mib", o.EngineReadBudgetMiB,
		"memory, in MiB, that the engine polls in flight may hold together (bytes read times 8, what parsing them holds); polls beyond it wait, logged and counted in smg_engine_read_budget_waits_total")
	fs.IntVar(&o.GRPCEngineMaxMessageMiB, enginegrpc.MaxMessageFlag, o.GRPCEngineMaxMessageMiB, enginegrpc.MaxMessageUsage)
	fs.BoolVar(&o.AllowLinkLocalWorkers, "allow-link-local-workers", o.AllowLinkLocalWorkers,
		"accept worker URLs at link-local addresses (169.254.0.0/16, fe80::/10) and cloud metadata endpoints, refused by default")
	fs.BoolVar(&o.ProviderAllowInsecureLoopback, "provider-allow-insecure-loopback", o.ProviderAllowInsecureLoopback,
		"accept external workers (providers) at plain http:// loopback URLs, for tests against a local fake provider (providers are https:// only otherwise: their API key must not cross a network in clear)")
	fs.BoolVar(&o.AdmissionWindow, "worker-admission-window", o.AdmissionWindow,
		"give every worker a running window (spec max_running_requests, else the engine's report, else learned) split into per-router shares; routers with the same flag gate on it (off: as the spec)")
	fs.IntVar(&o.AdmissionQueue, "worker-admission-queue", o.AdmissionQueue,
		"requests allowed to wait in an engine beyond its running window under --worker-admission-window (>= 0)")
	fs.BoolVar(&o.TokenBudget, "worker-token-budget", o.TokenBudget,
		"give every worker a token budget (the KV capacity in tokens its engine reports) split into per-router shares; routers with the same flag gate on it (off: as the spec)")
	fs.DurationVar(&o.RegistrationTimeout, "registration-timeout", o.RegistrationTimeout, "how long registration tries to reach a new engine before the registration fails")
	o.Cluster.AddFlags(fs)
	o.Discovery.AddFlags(fs)
}

// Validate reports the first invalid option with a clear message.
func (o Options) Validate() error {
	if o.LoadMonitorInterval <= 0 {
		return fmt.Errorf("--load-monitor-interval must be greater than zero (seconds), got %d", o.LoadMonitorInterval)
	}
	for _, check := range []func() error{o.Thresholds.Validate, o.Health.Validate, o.Liveness.Validate,
		func() error { return enginegrpc.CheckMaxMessageMiB(o.GRPCEngineMaxMessageMiB) }, o.Cluster.Validate, o.Discovery.Validate} {
		if err := check(); err != nil {
			return err
		}
	}
	if o.AdmissionQueue < 0 {
		return fmt.Errorf("--worker-admission-queue must be >= 0, got %d", o.AdmissionQueue)
	}
	if o.WatchLoadInterval < 0 {
		return fmt.Errorf("--watch-load-interval must be >= 0, got %s", o.WatchLoadInterval)
	}
	if o.RegistrationTimeout <= 0 {
		return fmt.Errorf("--registration-timeout must be positive, got %s", o.RegistrationTimeout)
	}
	if o.EngineReadBudgetMiB < 1 || o.EngineReadBudgetMiB > 1<<20 {
		return fmt.Errorf("--engine-read-budget-mib must be 1-1048576, got %d", o.EngineReadBudgetMiB)
	}
	return nil
}

// ControlPlane is a running control plane's components.
type ControlPlane struct {
	opts     Options
	log      *slog.Logger
	Registry *registry.Registry
	Admin    *admin.Service
	// Evidence takes every observation of every worker (agents, polls,
	// probes, routers) into the registry.
	Evidence *evidence.Inbox
	Monitor  *monitor.Monitor
	Health   *health.Checker
	Watch    *watch.Server
	Windows  *windows.Allocator
	Agents   *agentsvc.Server
	// Cluster is the Raft node (nil: in memory, always leading); it hands a
	// follower's calls to the leader.
	Cluster *cluster.Node
	metrics *prometheus.Registry
	// Discovery reconciles discovered pods (this control plane's informers
	// and agents') with the registry.
	Discovery *discovery.Reconciler
	kube      podwatch.Client // nil without --service-discovery

	rest       http.Handler
	grpcHealth *grpchealth.Server
	grpcPool   *enginegrpc.Pool // channels to gRPC workers (health probes, load polls)
}

// New builds the control plane; metrics register on reg.
func New(opts Options, log *slog.Logger, reg *prometheus.Registry) (*ControlPlane, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	for _, w := range opts.Liveness.Warnings(opts.LoadMonitorInterval) {
		log.Warn(w)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	cp := &ControlPlane{opts: opts, log: log, metrics: reg}
	cp.Registry = registry.New(rand.Text(), registry.DefaultHistory)
	// Engines are dialled through a hook that checks the address actually
	// dialled, after resolution (registration checks only the URL as written).
	dialer := workerurl.Dialer(&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second},
		workerurl.Options{AllowLinkLocal: opts.AllowLinkLocalWorkers})
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4, IdleConnTimeout: 90 * time.Second,
		DialContext: dialer.DialContext, DialTLSContext: opts.EngineTLS.DialTLS(dialer)}}
	oversized, err := enginegrpc.OversizedCounter(reg, log, opts.GRPCEngineMaxMessageMiB)
	if err != nil {
		return nil, err
	}
	grpcOpts := enginegrpc.Options{Dial: func(ctx context.Context, addr string) (net.Conn, error) {
		return dialer.DialContext(ctx, "tcp", addr)
	}, MaxRecvMsgSize: opts.GRPCEngineMaxMessageMiB << 20, Oversized: oversized}
	if opts.EngineTLS != nil {
		grpcOpts.Creds = tlsutil.Credentials(*opts.EngineTLS)
	}
	cp.grpcPool = enginegrpc.NewPool(grpcOpts)
	collector := evidence.NewCollector(cp.Registry)
	if err := reg.Register(collector); err != nil {
		return nil, err
	}
	var commit func(context.Context, *admin.Change) (*registry.Worker, error)
	if opts.Cluster.Enabled() {
		opts.Cluster.Route = func(m string) cluster.Route { return rpcs[m].route }
		node, err := cluster.Open(opts.Cluster, cp.Registry, resolver(opts.Thresholds), opts.AdminAPIKey, log)
		if err != nil {
			return nil, err
		}
		if err := node.RegisterMetrics(reg); err != nil {
			_ = node.Close()
			return nil, err
		}
		cp.Cluster, commit = node, node.Commit
	} else {
		log.Info("No --data-dir: the worker registry is in memory, and registrations are lost when the control plane restarts")
		if err := reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "smg_controlplane_is_leader",
			Help: "1 while this control plane leads (runs the monitor, health checks, verdicts and the watch stream)."}, func() float64 { return 1 })); err != nil {
			return nil, err
		}
	}
	// Collaborators go to the constructors, in dependency order; every
	// component takes the one clock, opts.Now.
	cp.Windows = windows.New(cp.Registry, windows.Options{StaleAfter: time.Duration(opts.Liveness.StaleSecs) * time.Second,
		Warmup: windows.DefaultWarmup, HeldWarmup: windows.DefaultHeldWarmup, Admission: opts.AdmissionWindow, Queue: int64(opts.AdmissionQueue),
		TokenBudget: opts.TokenBudget, Now: opts.Now}, log, reg)
	eopts := evidence.Options{Rules: opts.Liveness, Now: opts.Now, Coalesce: true}
	if opts.AdmissionWindow {
		eopts.Observe = cp.Windows.ObserveLoad // learned windows read every report, before coalescing
	}
	cp.Evidence = evidence.New(cp.Registry, eopts, log, reg)
	hopts := opts.Health
	hopts.Now = opts.Now
	if !opts.Cluster.Enabled() {
		// In-memory control planes each probe on their own phases; the
		// replicas of a cluster share the empty seed, so a new leader keeps
		// its predecessor's phases across a takeover.
		hopts.Seed = rand.Text()
	}
	hopts.GRPC = cp.grpcPool
	cp.Health = health.New(cp.Registry, hopts, client, cp.Evidence.Contact, log)
	budget, err := readbudget.New(int64(opts.EngineReadBudgetMiB)<<20, reg, log)
	if err != nil {
		return nil, err
	}
	cp.Monitor = monitor.New(cp.Registry, cp.Evidence, client, monitor.Options{
		Interval:       time.Duration(opts.LoadMonitorInterval) * time.Second,
		RecentlyPushed: cp.Evidence.RecentlyPushed, Now: opts.Now, Seed: hopts.Seed, GRPC: cp.grpcPool, Budget: budget,
		Covered: func(url string) bool { return cp.Agents.Covers(url) },
	}, log)
	if opts.AdmissionWindow || opts.TokenBudget {
		if err := reg.Register(windows.NewCollector(cp.Registry)); err != nil {
			return nil, err
		}
	}
	loadInterval := opts.WatchLoadInterval
	if loadInterval == 0 {
		loadInterval = -1 // watch.Options: negative is "at once"
	}
	cp.Watch = watch.NewServer(cp.Registry, watch.Options{Token: opts.WatchToken, Sink: cp.Evidence, Demand: cp.Windows, Now: opts.Now,
		LoadInterval: loadInterval, Sent: opts.WatchSent, WarmUntil: cp.warmUntil(),
		Settings: &smgv1.FleetSettings{LoadMonitorIntervalSecs: int32(opts.LoadMonitorInterval), WorkerStaleSecs: int32(opts.Liveness.StaleSecs)}}, log, reg)
	cp.Admin = admin.New(cp.Registry, admin.Options{
		APIKey: opts.AdminAPIKey, RegistrationTimeout: opts.RegistrationTimeout,
		URL:                           workerurl.Options{AllowLinkLocal: opts.AllowLinkLocalWorkers},
		AllowInsecureProviderLoopback: opts.ProviderAllowInsecureLoopback,
		Routers:                       cp.Watch.Routers, OnRemove: collector.Removed, Now: opts.Now, Commit: commit, GRPC: grpcOpts,
	}, resolver(opts.Thresholds), client, log)
	if err := cp.newDiscovery(reg); err != nil {
		return nil, err
	}
	auth := agentsvc.TokenAuth{Shared: opts.AgentToken}
	if opts.AgentTokenFile != "" {
		nodes, err := agentsvc.LoadTokenFile(opts.AgentTokenFile)
		if err != nil {
			return nil, err
		}
		auth.Nodes = nodes
	}
	cp.Agents = agentsvc.New(cp.Registry, cp.Evidence, cp.Admin.Submit, agentsvc.Options{
		Auth: auth,
		Now:  opts.Now,
		Registration: agentsvc.RegistrationPolicy{
			Models: opts.AgentModels, AnyModel: opts.AgentAnyModel, Timeout: opts.RegistrationTimeout,
			Discover: cp.Admin.Discover,
		},
		Remove:          cp.Admin.Remove,
		Discovery:       cp.Discovery,
		Applying:        opts.AgentApplying,
		GoneAfter:       time.Duration(opts.Liveness.StaleSecs) * time.Second,
		CoverageChanged: cp.Monitor.CoverageChanged,
		StreamEnded: func(ids []string) {
			for _, id := range ids {
				cp.Evidence.StopPushed(id)
			}
			cp.Monitor.PollNow(ids...)
		},
	}, log)
	if cp.rest, err = admin.RESTHandlerWith(cp.Admin, inproc.New(&smgv1.WorkerService_ServiceDesc, cp.Admin, cp.unary)); err != nil {
		return nil, err
	}
	return cp, nil
}

// warmUntil is when an in-memory registry, which starts empty and refills as
// agents, discovery and --worker-urls register again, counts as complete;
// until then snapshots tell routers to keep the workers they held
// (docs/ha.md). The bound is --worker-stale-secs, after which an agent's
// workers count as gone anyway. A durable registry is complete at once.
func (cp *ControlPlane) warmUntil() time.Time {
	if cp.opts.Cluster.Enabled() || cp.opts.Liveness.StaleSecs <= 0 {
		return time.Time{}
	}
	return cp.opts.Now().Add(time.Duration(cp.opts.Liveness.StaleSecs) * time.Second)
}

// newDiscovery builds the reconciler of discovered pods and, with
// --service-discovery, the informers that feed it.
func (cp *ControlPlane) newDiscovery(reg prometheus.Registerer) error {
	m, err := discovery.NewMetrics(reg)
	if err != nil {
		return err
	}
	resolve := resolver(cp.opts.Thresholds)
	h := cp.opts.Health
	cp.Discovery = discovery.New(cp.Registry, cp.Admin, discovery.Options{
		Grace: time.Duration(h.FailureThreshold*h.IntervalSecs) * time.Second,
		Now:   cp.opts.Now,
		CheckOverload: func(b *smgv1.OverloadBlock) error {
			_, err := resolve(b)
			return err
		},
	}, m, cp.log)
	if !cp.opts.Discovery.Enabled {
		return nil
	}
	client := cp.opts.KubeClient
	if client == nil {
		if client, err = podwatch.InCluster(); err != nil {
			return err
		}
	}
	cp.kube = client
	_, err = cp.podWatcher() // selectors checked now, not at the first term
	return err
}

// podWatcher returns new informers over the pods --service-discovery selects;
// each leader term runs its own (a watcher runs once).
func (cp *ControlPlane) podWatcher() (*podwatch.Watcher, error) {
	return podwatch.NewWatcher(cp.kube, cp.opts.Discovery, "", podwatch.SourceControlPlane, cp.Discovery, cp.log)
}

// resolver validates a worker's overload block and resolves its thresholds.
func resolver(g judge.GatewayThresholds) admin.ThresholdResolver {
	return func(b *smgv1.OverloadBlock) (judge.Thresholds, error) {
		if b == nil {
			return g.Resolve(nil), nil
		}
		blk := &judge.Block{TokenUsage: b.TokenUsage}
		if b.WaitingRequests != nil {
			blk.WaitingRequests = new(int64(b.GetWaitingRequests()))
		}
		if err := blk.Validate(); err != nil {
			return judge.Thresholds{}, err
		}
		return g.Resolve(blk), nil
	}
}

// TransportOptions are the gRPC transport options of the control plane's
// server (the scale harness's floor uses the same). Fixed flow-control
// windows: gRPC's default (sized by estimating the bandwidth-delay product)
// answers every burst after a quiet spell with a window update and a ping,
// thousands a second at 1,000 routers. The window is larger than what the
// agents' records and routers' reports have in flight.
func TransportOptions() []grpc.ServerOption {
	const window = 4 << 20 // per stream and per connection
	return []grpc.ServerOption{grpc.InitialWindowSize(window), grpc.InitialConnWindowSize(window)}
}

// Listening tells a replicated control plane the ports it serves on, which
// it announces to the cluster (routers and agents are sent there).
func (cp *ControlPlane) Listening(grpcAddr, httpAddr net.Addr) {
	if cp.Cluster == nil {
		return
	}
	_, gp, _ := net.SplitHostPort(grpcAddr.String())
	_, hp, _ := net.SplitHostPort(httpAddr.String())
	cp.Cluster.Advertise(gp, hp)
}

// AdminRoutes mounts the REST admin routes and /loads on mux (and the
// cluster's routes when replicated).
func (cp *ControlPlane) AdminRoutes(mux *http.ServeMux) {
	for _, p := range []string{"/workers", "/workers/", "/loads", "/jobs", "/routers"} {
		mux.Handle(p, cp.rest)
	}
	if cp.Cluster != nil {
		cp.Cluster.Routes(mux, cp.Admin.RequireKey)
	}
}

// HTTPHandler is the control plane's own HTTP port: admin REST, /loads,
// /metrics and /health.
func (cp *ControlPlane) HTTPHandler() http.Handler {
	mux := http.NewServeMux()
	cp.AdminRoutes(mux)
	mux.Handle("/metrics", promhttp.HandlerFor(cp.metrics, promhttp.HandlerOpts{}))
	mux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !cp.Ready() {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "not ready: no leader yet, writes are not taken", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.Handle("GET "+identity.Path, identity.Handler(identity.ControlPlane))
	return mux
}

// Ready reports whether this control plane takes writes: always in memory;
// replicated, once it leads with its duties taken up or knows the leader to
// hand them to. /readyz and the gRPC health service say so.
func (cp *ControlPlane) Ready() bool { return cp.Cluster == nil || cp.Cluster.Ready() }

// SubmitStatic starts the registration of every --worker-urls engine; an
// invalid or duplicate URL is an error at startup. A replicated control plane
// checks them now and registers them when it leads (those not yet stored).
func (cp *ControlPlane) SubmitStatic() error {
	if cp.Cluster != nil {
		_, err := PDSpecs(cp.opts.PrefillURLs, cp.opts.DecodeURLs)
		return err
	}
	return cp.submitStatic()
}

func (cp *ControlPlane) submitStatic() error {
	pd, err := PDSpecs(cp.opts.PrefillURLs, cp.opts.DecodeURLs)
	errs := []error{err}
	var specs []*smgv1.WorkerSpec
	for _, u := range cp.opts.WorkerURLs {
		specs = append(specs, &smgv1.WorkerSpec{Url: u})
	}
	for _, spec := range append(specs, pd...) {
		if _, err := cp.Admin.Submit(spec); err != nil {
			flag := cmp.Or(spec.GetWorkerType(), "worker-urls") // --prefill, --decode
			errs = append(errs, fmt.Errorf("--%s %s: %s", flag, workerurl.Redact(spec.GetUrl()), status.Convert(err).Message()))
		}
	}
	return errors.Join(errs...)
}

// PDSpecs turns --prefill URL [BOOTSTRAP_PORT] ... and --decode URL ... into
// worker specs: a number after a prefill URL is that engine's bootstrap port.
func PDSpecs(prefill, decode []string) ([]*smgv1.WorkerSpec, error) {
	var specs []*smgv1.WorkerSpec
	for _, v := range prefill {
		if port, err := strconv.ParseInt(v, 10, 32); err == nil {
			if len(specs) == 0 || specs[len(specs)-1].BootstrapPort != nil {
				return nil, fmt.Errorf("--prefill: bootstrap port %s must follow a prefill URL", v)
			}
			specs[len(specs)-1].BootstrapPort = new(int32(port))
			continue
		}
		specs = append(specs, &smgv1.WorkerSpec{Url: v, WorkerType: "prefill"})
	}
	for _, v := range decode {
		specs = append(specs, &smgv1.WorkerSpec{Url: v, WorkerType: "decode"})
	}
	return specs, nil
}

// Run runs the background loops until ctx ends (a replica: while it
// leads), then stops. A replica that cannot join its cluster returns why.
func (cp *ControlPlane) Run(ctx context.Context) error {
	var err error
	if cp.Cluster == nil {
		cp.Lead(ctx)
	} else {
		rctx, stop := context.WithCancel(ctx)
		go cp.reportReadiness(rctx)
		err = cp.Cluster.Run(ctx, cp)
		stop()
		cp.Cluster.Handover()
	}
	if cp.grpcHealth != nil {
		cp.grpcHealth.Shutdown() // NOT_SERVING: probes and clients move on
	}
	cp.Watch.Close()
	cp.Agents.Close()
	cp.Admin.Close()
	cp.grpcPool.Close()
	if cp.Cluster != nil {
		err = errors.Join(err, cp.Cluster.Close())
	}
	return err
}

// Prepare readies a replica elected leader in term: a new watch epoch
// (routers never mix two leaders' revisions), every stored worker presumed
// Ready with no veto until its first probe or report (fail open: never an
// empty or half-judged fleet), and its predecessor's registrations resumed.
func (cp *ControlPlane) Prepare(term uint64) {
	cp.Registry.SetEpoch(fmt.Sprintf("%s-t%d", cp.Cluster.ID(), term))
	cp.Evidence.Rebuild(fmt.Sprintf("elected leader in term %d: no worker's load is known yet", term), (*registry.Worker).Presumed)
	cp.Admin.ResumeJobs()
}

// Lead runs the leader's loops (load monitor, health checks, liveness
// sweep, window allocator, report ingest) until ctx ends.
func (cp *ControlPlane) Lead(ctx context.Context) {
	if cp.Cluster != nil {
		if err := cp.submitStatic(); err != nil {
			cp.log.Debug("Static workers already stored", "detail", err.Error())
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() { cp.Discovery.Run(ctx, time.Second) })
	if cp.kube != nil {
		// Only the leader discovers: it alone writes the registry.
		if pods, err := cp.podWatcher(); err != nil {
			cp.log.Error("Service discovery not started", "error", err)
		} else {
			wg.Go(func() { pods.Run(ctx) })
		}
	}
	for _, run := range []func(context.Context){cp.Windows.Run, cp.Monitor.Run, cp.Health.Run, cp.Evidence.Run} {
		wg.Go(func() { run(ctx) })
	}
	<-ctx.Done()
	wg.Wait()
	if cp.Cluster != nil {
		// A replica that stopped leading drops its soft state (the next
		// leader rebuilds its own). Workers go back to presumed Ready with no
		// veto, failing open: a router still attached in the instant before
		// its stream ends must not see the fleet vanish.
		cp.Evidence.Rebuild("no longer the leader: its verdicts are dropped", (*registry.Worker).Presumed)
		cp.Evidence.Sweep(cp.opts.Now()) // drops the evidence of every worker not Ready
	}
}
