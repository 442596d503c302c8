package router

import (
	"bytes"
	"io"

	"github.com/smg-project/smg/router/admission"
)

// FleetTenants takes what the control plane relayed of the other routers'
// tenants (fair shares fleet-wide); nothing without the scheduler.
func (r *Router) FleetTenants(others []admission.TenantDemand) {
	if r.sched != nil {
		r.sched.SetFleetTenants(others)
	}
}

// outputCounter estimates the output tokens of an HTTP answer as it is read,
// for the tenant's virtual token counter: one per SSE data event (an
// engine's stream sends one token or a few per event), else the body's bytes
// over the prompt's bytes-per-token guess.
type outputCounter struct {
	r             io.ReadCloser
	sse           bool
	bytesPerToken int64
	events, bytes int64
}

var sseData = []byte("data:")

func (c *outputCounter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if c.sse {
		c.events += int64(bytes.Count(p[:n], sseData))
	} else {
		c.bytes += int64(n)
	}
	return n, err
}

func (c *outputCounter) Close() error { return c.r.Close() }

func (c *outputCounter) tokens() int64 {
	if c.sse {
		return max(0, c.events-1) // the closing "data: [DONE]"
	}
	return c.bytes / max(1, c.bytesPerToken)
}
