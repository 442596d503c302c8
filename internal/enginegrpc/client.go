// Package enginegrpc talks to inference engines over SMG's gRPC engine
// protocol (the SGLang scheduler and vLLM engine services): what smg reads
// from a gRPC worker at registration (model, window, DP size, PD role,
// tokenizer) and for load and liveness (GetLoads, SubscribeKvEvents).
package enginegrpc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	sglangpb "github.com/smg-project/smg/gen/sglang/grpc/scheduler"
	vllmpb "github.com/smg-project/smg/gen/vllm/grpc/engine"
)

// Flavors of the engine protocol.
const (
	FlavorSGLang = "sglang"
	FlavorVLLM   = "vllm"
)

// DefaultMaxRecvMsgSize bounds one message from an engine. Load and model
// answers are a few hundred bytes; KV event batches and tokenizer chunks are
// the large ones.
const DefaultMaxRecvMsgSize = 16 << 20

// Options configure a Client.
type Options struct {
	// Creds secure grpcs:// URLs (nil: TLS with the system roots).
	Creds credentials.TransportCredentials
	// MaxRecvMsgSize bounds each message received (0: DefaultMaxRecvMsgSize).
	MaxRecvMsgSize int
	// Flavor skips detection when set ("sglang" or "vllm").
	Flavor string
	// Dial (nil: a plain TCP dial) opens the connection under the channel,
	// so the control plane's check of the address actually dialled applies.
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// Oversized (nil: none) hears of every message refused for exceeding
	// MaxRecvMsgSize (the caller counts and logs it).
	Oversized func(url string, err error)
}

// Client is one gRPC worker's channel. Methods are safe for concurrent use.
type Client struct {
	url       string
	oversized func(string, error)
	conn      *grpc.ClientConn
	sg        sglangpb.SglangSchedulerClient
	vl        vllmpb.VllmEngineClient

	mu     sync.Mutex
	flavor string
}

// IsGRPC reports whether a worker URL names a gRPC engine.
func IsGRPC(rawURL string) bool {
	return strings.HasPrefix(rawURL, "grpc://") || strings.HasPrefix(rawURL, "grpcs://")
}

// New makes a client for a grpc:// or grpcs:// URL. It does not connect:
// the first call does.
func New(rawURL string, o Options) (*Client, error) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "grpc" && u.Scheme != "grpcs") || u.Host == "" || (u.Path != "" && u.Path != "/") {
		return nil, fmt.Errorf("%q is not a grpc:// or grpcs:// URL", rawURL)
	}
	host := u.Host
	if u.Port() == "" {
		host += map[string]string{"grpc": ":80", "grpcs": ":443"}[u.Scheme]
	}
	creds := insecure.NewCredentials()
	if u.Scheme == "grpcs" {
		creds = o.Creds
		if creds == nil {
			creds = credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12})
		}
	}
	limit := o.MaxRecvMsgSize
	if limit <= 0 {
		limit = DefaultMaxRecvMsgSize
	}
	dopts := []grpc.DialOption{grpc.WithTransportCredentials(creds), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(limit))}
	if o.Dial != nil {
		dopts = append(dopts, grpc.WithContextDialer(o.Dial))
	}
	conn, err := grpc.NewClient("passthrough:///"+host, dopts...)
	if err != nil {
		return nil, fmt.Errorf("worker %s: %w", rawURL, err)
	}
	switch o.Flavor {
	case "", FlavorSGLang, FlavorVLLM:
	default:
		conn.Close()
		return nil, fmt.Errorf("flavor %q: want sglang or vllm", o.Flavor)
	}
	return &Client{url: rawURL, conn: conn, flavor: o.Flavor, oversized: o.Oversized,
		sg: sglangpb.NewSglangSchedulerClient(conn), vl: vllmpb.NewVllmEngineClient(conn)}, nil
}

// Conn is the channel, for calls this package does not wrap (Generate).
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// URL is the worker's URL.
func (c *Client) URL() string { return c.url }

// Close ends the channel and every call on it.
func (c *Client) Close() error { return c.conn.Close() }

// Flavor finds which service the engine serves: SGLang's scheduler, else
// vLLM's engine (an Unimplemented answer from one means the other).
func (c *Client) Flavor(ctx context.Context) (string, error) {
	c.mu.Lock()
	f := c.flavor
	c.mu.Unlock()
	if f != "" {
		return f, nil
	}
	_, err := c.sg.HealthCheck(ctx, &sglangpb.HealthCheckRequest{})
	switch status.Code(err) {
	case codes.OK:
		f = FlavorSGLang
	case codes.Unimplemented:
		if _, err := c.vl.HealthCheck(ctx, &vllmpb.HealthCheckRequest{}); err != nil {
			if status.Code(err) == codes.Unimplemented {
				return "", fmt.Errorf("worker %s serves neither the SGLang scheduler nor the vLLM engine service", c.url)
			}
			return "", c.wrap(err)
		}
		f = FlavorVLLM
	default:
		return "", c.wrap(err)
	}
	c.mu.Lock()
	c.flavor = f
	c.mu.Unlock()
	return f, nil
}

// Wrap names the worker in an error of one of its streams (counting an
// oversized message).
func (c *Client) Wrap(err error) error { return c.wrap(err) }

// wrap names the worker and explains an HTTP server answering a gRPC call.
func (c *Client) wrap(err error) error {
	if err == nil {
		return nil
	}
	if c.oversized != nil && status.Code(err) == codes.ResourceExhausted && strings.Contains(status.Convert(err).Message(), "larger than max") {
		c.oversized(c.url, err)
	}
	if AnswersHTTP(err) {
		return fmt.Errorf("worker %s answers HTTP/1, not gRPC: register its http:// URL, or the engine's gRPC port (%w)", c.url, err)
	}
	return fmt.Errorf("worker %s: %w", c.url, err)
}

// AnswersHTTP reports an error that comes from speaking gRPC to an HTTP/1
// server: its answer is not an HTTP/2 preface.
func AnswersHTTP(err error) bool {
	msg := status.Convert(err).Message()
	for _, s := range []string{"server preface", "frame too large", "malformed header", "HTTP/1", "unexpected HTTP status code", "missing HTTP content-type"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// Health asks the engine's HealthCheck; an unhealthy answer is an error.
func (c *Client) Health(ctx context.Context) error {
	f, err := c.Flavor(ctx)
	if err != nil {
		return err
	}
	var healthy bool
	var msg string
	if f == FlavorSGLang {
		r, err := c.sg.HealthCheck(ctx, &sglangpb.HealthCheckRequest{})
		if err != nil {
			return c.wrap(err)
		}
		healthy, msg = r.GetHealthy(), r.GetMessage()
	} else {
		r, err := c.vl.HealthCheck(ctx, &vllmpb.HealthCheckRequest{})
		if err != nil {
			return c.wrap(err)
		}
		healthy, msg = r.GetHealthy(), r.GetMessage()
	}
	if !healthy {
		return fmt.Errorf("worker %s: HealthCheck answered unhealthy: %q", c.url, msg)
	}
	return nil
}

// Pool keeps one channel per gRPC worker, shared by the health checker and
// the load monitor.
type Pool struct {
	opts Options
	mu   sync.Mutex
	m    map[string]*Client
}

// NewPool returns an empty pool whose clients use o.
func NewPool(o Options) *Pool { return &Pool{opts: o, m: map[string]*Client{}} }

// Get returns the worker's client, made on first use.
func (p *Pool) Get(rawURL string) (*Client, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.m[rawURL]; c != nil {
		return c, nil
	}
	c, err := New(rawURL, p.opts)
	if err != nil {
		return nil, err
	}
	p.m[rawURL] = c
	return c, nil
}

// Retain closes the channels of workers not in keep.
func (p *Pool) Retain(keep map[string]bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for u, c := range p.m {
		if !keep[u] {
			c.Close()
			delete(p.m, u)
		}
	}
}

// Close closes every channel.
func (p *Pool) Close() { p.Retain(nil) }

// Answered reports an error the engine itself sent (an RPC status other
// than a transport failure, a deadline or a cancellation): contact.
func Answered(err error) bool {
	st, ok := status.FromError(err)
	if !ok || err == nil {
		return false
	}
	switch st.Code() {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Unknown:
		return false
	}
	return true
}

// IsTimeout reports a call that ran out of time (the engine is slow, not gone).
func IsTimeout(err error) bool {
	return status.Code(err) == codes.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded)
}

// IsConnectionFailure reports a transport-level failure (refused, reset,
// dropped, keepalive): the evidence that arms unreachable. A deadline or an
// engine-side error is not one.
func IsConnectionFailure(err error) bool {
	if err == nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	return status.Code(err) == codes.Unavailable
}
