// Package backoff is the one reconnect backoff of smg's long-lived streams
// (the agent's report stream and the router's watch stream): exponential,
// jittered, with an explicit cap, so a control plane that comes back is
// reached within about a second.
//
// It only computes delays; it dials nothing.
package backoff

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
)

// Defaults of Policy. The cap is short on purpose: a reconnect costs one
// dial, while every second of a missed control plane is a second of stale
// verdicts.
const (
	DefaultInitial = 100 * time.Millisecond
	DefaultMax     = time.Second
	DefaultJitter  = 0.2
)

// Policy says how waits grow: Initial, doubled after each failure up to Max,
// each spread by ±Jitter (a fraction) and never above Max.
type Policy struct {
	Initial time.Duration
	Max     time.Duration
	Jitter  float64
}

// DefaultPolicy returns the defaults.
func DefaultPolicy() Policy {
	return Policy{Initial: DefaultInitial, Max: DefaultMax, Jitter: DefaultJitter}
}

// WithDefaults fills zero fields from DefaultPolicy.
func (p Policy) WithDefaults() Policy {
	d := DefaultPolicy()
	if p.Initial == 0 {
		p.Initial = d.Initial
	}
	if p.Max == 0 {
		p.Max = max(d.Max, p.Initial)
	}
	if p.Jitter == 0 {
		p.Jitter = d.Jitter
	}
	return p
}

// Validate reports a policy that cannot work.
func (p Policy) Validate() error {
	if p.Initial <= 0 || p.Max < p.Initial {
		return fmt.Errorf("backoff must satisfy 0 < initial <= max, got %s and %s", p.Initial, p.Max)
	}
	if p.Jitter < 0 || p.Jitter >= 1 {
		return fmt.Errorf("backoff jitter must be within [0, 1), got %v", p.Jitter)
	}
	return nil
}

// Backoff hands out the waits of one reconnect loop. It is not safe for
// concurrent use: one loop owns it.
type Backoff struct {
	p    Policy
	next time.Duration
	rand func() float64 // in [0, 1)
}

// New returns a Backoff at its first wait. rnd draws from [0, 1); nil means
// math/rand/v2 (tests pass a fixed source).
func New(p Policy, rnd func() float64) *Backoff {
	p = p.WithDefaults()
	if rnd == nil {
		rnd = rand.Float64
	}
	return &Backoff{p: p, next: p.Initial, rand: rnd}
}

// Next returns the wait before the next attempt and doubles the one after.
func (b *Backoff) Next() time.Duration {
	d := b.next
	b.next = min(b.next*2, b.p.Max)
	f := 1 + b.p.Jitter*(2*b.rand()-1)
	return min(time.Duration(float64(d)*f), b.p.Max)
}

// Reset starts over from Initial: the link worked.
func (b *Backoff) Reset() { b.next = b.p.Initial }

// Sleep waits d, or until ctx ends; it reports whether ctx is still live.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// DialOption sets gRPC's own connect backoff to p, so the channel under a
// stream retries as quickly as the stream does (gRPC's default cap is 120 s).
func DialOption(p Policy) grpc.DialOption {
	p = p.WithDefaults()
	return grpc.WithConnectParams(grpc.ConnectParams{
		Backoff: grpcbackoff.Config{
			BaseDelay:  p.Initial,
			Multiplier: 2,
			Jitter:     p.Jitter,
			// gRPC spreads its capped delay by ±Jitter: cap below Max so
			// the spread stays under it.
			MaxDelay: time.Duration(float64(p.Max) / (1 + p.Jitter)),
		},
		MinConnectTimeout: 3 * time.Second,
	})
}
