package agent

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/smg-project/smg/internal/podwatch"

	"github.com/smg-project/smg/internal/backoff"
	"github.com/smg-project/smg/internal/cpconn"
	"github.com/smg-project/smg/internal/enginegrpc"
	"github.com/smg-project/smg/internal/readbudget"
	"github.com/smg-project/smg/internal/workerurl"
)

// Defaults of Options.
const (
	DefaultControlPlane      = "127.0.0.1:30002"
	DefaultPollInterval      = time.Second
	DefaultHeartbeatInterval = 2 * time.Second

	// MaxHeartbeatInterval keeps heartbeats well inside the control plane's
	// default --worker-stale-secs (15): several may be lost before a
	// pushing worker is judged silent.
	MaxHeartbeatInterval = 5 * time.Second
)

// Options configure an Agent.
type Options struct {
	// ControlPlane is HOST:PORT of the control plane's gRPC port, or of
	// every replica's, comma-separated (the agent follows the leader).
	ControlPlane string
	// Node names this agent's node; workers whose spec names it are assigned.
	Node string
	// EngineURLs are the engines given on the command line.
	EngineURLs []string
	// Register asks the control plane to register EngineURLs with Node.
	Register bool
	// PollInterval is how often each engine is read (sub-second allowed).
	PollInterval time.Duration
	// EngineReadBudgetMiB bounds the memory the engine reads in flight
	// hold, together (--engine-read-budget-mib).
	EngineReadBudgetMiB int
	// HeartbeatInterval is the longest quiet spell on the stream before a
	// heartbeat vouches for every answering engine.
	HeartbeatInterval time.Duration
	// Token is sent as "authorization: Bearer <token>" on the stream.
	Token string
	// TransportCredentials secure the stream (mTLS). Nil means plaintext,
	// meant for a control plane on loopback or a private network only.
	TransportCredentials credentials.TransportCredentials
	// HTTPClient reads the engines (nil: a client with small idle pools).
	HTTPClient *http.Client
	// GRPC configures the channels to grpc:// and grpcs:// engines (its
	// MaxRecvMsgSize and Oversized are set from GRPCEngineMaxMessageMiB).
	GRPC enginegrpc.Options
	// GRPCEngineMaxMessageMiB bounds each message read from a gRPC engine
	// (--grpc-engine-max-message-mib).
	GRPCEngineMaxMessageMiB int
	// Backoff spaces reconnects to the control plane (zero fields: the
	// defaults of internal/backoff, capped at 1s).
	Backoff backoff.Policy
	// Now is the clock of engine silence and observation times (nil: time.Now).
	Now func() time.Time
	// Discovery finds the engine pods of Node (the --service-discovery
	// flags); they are registered under Node, so Register is required.
	Discovery podwatch.Options
	// KubeClient lists and watches pods (nil: in-cluster credentials).
	KubeClient podwatch.Client
}

// DefaultOptions returns the defaults; Node is left for the caller (the
// command line defaults it to the host name).
func DefaultOptions() Options {
	return Options{
		ControlPlane:            DefaultControlPlane,
		PollInterval:            DefaultPollInterval,
		EngineReadBudgetMiB:     readbudget.DefaultMiB,
		GRPCEngineMaxMessageMiB: enginegrpc.DefaultMaxMessageMiB,
		HeartbeatInterval:       DefaultHeartbeatInterval,
		Backoff:                 backoff.DefaultPolicy(),
		Discovery:               podwatch.DefaultOptions(),
	}
}

// withDefaults fills the zero fields.
func (o Options) withDefaults() Options {
	d := DefaultOptions()
	if o.ControlPlane == "" {
		o.ControlPlane = d.ControlPlane
	}
	if o.PollInterval == 0 {
		o.PollInterval = d.PollInterval
	}
	if o.EngineReadBudgetMiB == 0 {
		o.EngineReadBudgetMiB = d.EngineReadBudgetMiB
	}
	if o.GRPCEngineMaxMessageMiB == 0 {
		o.GRPCEngineMaxMessageMiB = d.GRPCEngineMaxMessageMiB
	}
	if o.HeartbeatInterval == 0 {
		o.HeartbeatInterval = d.HeartbeatInterval
	}
	o.Backoff = o.Backoff.WithDefaults()
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// Validate reports every invalid option, naming its flag.
func (o Options) Validate() error {
	var errs []error
	if _, err := cpconn.ParseAddrs(o.ControlPlane); err != nil {
		errs = append(errs, fmt.Errorf("--controlplane %q: want HOST:PORT of the control plane's gRPC port (several replicas: comma-separated)", o.ControlPlane))
	}
	if o.EngineReadBudgetMiB < 1 || o.EngineReadBudgetMiB > 1<<20 {
		errs = append(errs, fmt.Errorf("--engine-read-budget-mib must be 1-1048576, got %d", o.EngineReadBudgetMiB))
	}
	if err := enginegrpc.CheckMaxMessageMiB(o.GRPCEngineMaxMessageMiB); err != nil {
		errs = append(errs, err)
	}
	if o.Node == "" {
		errs = append(errs, errors.New("--node must not be empty"))
	}
	for _, u := range o.EngineURLs {
		if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") && !enginegrpc.IsGRPC(u) {
			errs = append(errs, fmt.Errorf("--engine-urls %q: want an http://, https://, grpc:// or grpcs:// URL", workerurl.Redact(u)))
		} else if _, err := workerurl.Normalize(u, workerurl.Options{AllowLinkLocal: true}); err != nil {
			errs = append(errs, fmt.Errorf("--engine-urls: %v", err)) // credentials, bad ports: never echoed
		}
	}
	if o.Register && len(o.EngineURLs) == 0 && !o.Discovery.Enabled {
		errs = append(errs, errors.New("--register needs --engine-urls or --service-discovery"))
	}
	if o.Discovery.Enabled && !o.Register {
		errs = append(errs, errors.New("--service-discovery needs --register: the agent registers the engine pods it finds on its node"))
	}
	if err := o.Discovery.Validate(); err != nil {
		errs = append(errs, err)
	}
	if o.PollInterval <= 0 {
		errs = append(errs, fmt.Errorf("--poll-interval must be positive, got %s", o.PollInterval))
	}
	if o.HeartbeatInterval <= 0 || o.HeartbeatInterval > MaxHeartbeatInterval {
		errs = append(errs, fmt.Errorf("--heartbeat-interval must be in (0, %s] to stay well inside --worker-stale-secs, got %s",
			MaxHeartbeatInterval, o.HeartbeatInterval))
	}
	if err := o.Backoff.WithDefaults().Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
