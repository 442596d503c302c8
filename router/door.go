package router

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/smg-project/smg/router/admission"
)

// Scheduler answers (SMG's error codes; each also in X-SMG-Error-Code).
const (
	CodeSchedulerPreempted       = "scheduler_preempted"
	CodeSchedulerQueueFull       = "scheduler_queue_full"
	CodeSchedulerQueueTimeout    = "scheduler_queue_timeout"
	CodeSchedulerClientCancelled = "scheduler_client_cancelled"
	// CodeTenantOverFairShare is smg's 429 for a tenant that holds its fair
	// share of the capacity while other tenants are active (fair_share in
	// the scheduler's YAML): its own doing, unlike the fleet out of capacity
	// (503).
	CodeTenantOverFairShare = "tenant_over_fair_share"
)

// PriorityHeader carries the requested class.
const PriorityHeader = "x-smg-priority"

// PreemptedHeader marks a 503 whose request was preempted before its first byte.
const PreemptedHeader = "X-SMG-Preempted"

// errPreempted is the cause of a request context cancelled by preemption.
var errPreempted = errors.New("preempted by a higher-priority request before the first byte")

// The door is the first admission layer (admission.Door): the priority
// scheduler when enabled and able to start, else the token bucket when
// --max-concurrent-requests is set, else none. This file builds it and writes
// its refusals in the contract's words.

// buildScheduler loads the scheduler's configuration. An error means the
// router runs the rate limiting path instead (the caller logs it): bad YAML,
// an unknown class, reservations over a static capacity, or no capacity at all.
func buildScheduler(opts Options, reg prometheus.Registerer) (*admission.Scheduler, error) {
	cfg := admission.DefaultSchedulerConfig()
	cfg.DefaultMaxClass, _ = admission.ParseClass(opts.PrioritySchedulerDefaultMaxClass)
	cfg.TenantMetricTopN = opts.PrioritySchedulerTenantMetricTopN
	if opts.PrioritySchedulerConfig != "" {
		var err error
		if cfg, err = admission.LoadSchedulerConfig(opts.PrioritySchedulerConfig, cfg); err != nil {
			return nil, fmt.Errorf("%s: %w", opts.PrioritySchedulerConfig, err)
		}
	}
	capacity := staticCapacity(opts)
	if fleetCapacitySource(opts) {
		capacity = 0 // until the first snapshot grants shares; reservations scale to it
	} else if capacity == 0 {
		return nil, errors.New("no capacity to admit against: turn on --worker-admission-window (the fleet's windows) or set --max-concurrent-requests")
	}
	if !fleetCapacitySource(opts) && cfg.ReservedTotal() > capacity {
		return nil, fmt.Errorf("reservations over capacity: the classes reserve %d slots, --max-concurrent-requests is %d",
			cfg.ReservedTotal(), capacity)
	}
	m, err := admission.NewSchedulerMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("scheduler metrics: %w", err)
	}
	cfg.Now = opts.Now
	capQueueTimeouts(&cfg, opts)
	return admission.NewScheduler(cfg, capacity, m), nil
}

// fleetCapacitySource: with running windows on, the scheduler admits
// against the sum of the shares the control plane grants this router, so
// its slots hold fleet-wide; otherwise against --max-concurrent-requests.
func fleetCapacitySource(opts Options) bool { return opts.WorkerAdmissionWindow }

// fleetCap is the sum of this router's gate limits over the workers with a
// regular running window (its shares, or whole windows when no share is
// allocated), kept up to date as windows change so a delta does not sum
// the fleet again; Unlimited while one of them has no window (never gated).
// Guarded by Router.applyMu.
type fleetCap struct {
	sum       int64
	windows   int64 // the whole windows those limits are shares of: the fleet's capacity
	unlimited int   // regular workers without a window
	// models: the same per model, the scheduler's pools (one model's rooms
	// admit none of another's requests).
	models map[string]*modelCap
	// spillApart (--spill-over): external workers serve the overflow only,
	// so they add nothing to the capacity of the local windows.
	spillApart bool
}

// add counts (sign 1) or uncounts (sign -1) a worker's gate limit.
func (c *fleetCap) add(w *Worker, limit, window int64, sign int64) {
	if t := w.Type; t == TypePrefill || t == TypeDecode || (c.spillApart && w.Provider != nil) {
		return
	}
	c.windows += sign * window
	if c.models == nil {
		c.models = map[string]*modelCap{}
	}
	m := c.models[w.Model]
	if m == nil {
		m = &modelCap{}
		c.models[w.Model] = m
	}
	m.workers += int(sign)
	if limit == admission.Unlimited {
		c.unlimited += int(sign)
		m.unlimited += int(sign)
	} else {
		c.sum += sign * limit
		m.sum += sign * limit
	}
	if m.workers <= 0 {
		delete(c.models, w.Model)
	}
}

// modelCap is one model's part of a fleetCap.
type modelCap struct {
	sum                int64
	unlimited, workers int
}

func (c *fleetCap) capacity() int64 {
	if c.unlimited > 0 {
		return admission.Unlimited
	}
	return c.sum
}

// pools is every named model's capacity (Unlimited while one of its
// workers has no window); requests naming no model have no pool.
func (c *fleetCap) pools() map[string]int64 {
	out := make(map[string]int64, len(c.models))
	for name, m := range c.models {
		if name == "" {
			continue
		}
		out[name] = m.sum
		if m.unlimited > 0 {
			out[name] = admission.Unlimited
		}
	}
	return out
}

// setSchedCapacity gives the scheduler this router's capacity from the fleet
// (running windows on). The reservations are checked against a static
// capacity at start; a fleet capacity comes and goes, so reservations over
// it are scaled down and warned about: scaled to fit, the higher classes'
// unused reservations hold back nearly every slot from the lower ones.
// Caller holds applyMu.
func (r *Router) setSchedCapacity() {
	if r.sched == nil || !r.schedFromFleet {
		return
	}
	capacity := r.fleetCap.capacity()
	r.sched.SetFleetCapacity(r.fleetCap.windows)
	r.sched.SetCapacity(capacity)
	r.sched.SetPoolCapacities(r.fleetCap.pools())
	reserved := r.sched.Config().ReservedTotal()
	over := capacity != admission.Unlimited && capacity > 0 && reserved > capacity
	if over && !r.reservedOver {
		r.log.Warn("Priority scheduler: the classes' reservations exceed this router's capacity (its window shares); "+
			"scaled down to fit, unused ones hold back nearly every slot from the lower classes: lower classes.<class>.reserved or use reserve_demand",
			"reserved", reserved, "capacity", capacity)
	}
	r.reservedOver = over
}

// staticCapacity is the scheduler's capacity when it does not come from the
// fleet: --max-concurrent-requests (0: none).
func staticCapacity(opts Options) int64 {
	return int64(max(0, opts.MaxConcurrentRequests))
}

// startDoor builds the door: the scheduler when enabled (on failure it logs
// the problem and falls back), else the token bucket when
// --max-concurrent-requests is set.
func (r *Router) startDoor(reg prometheus.Registerer) {
	if r.opts.PrioritySchedulerEnabled && r.startScheduler(reg) {
		return
	}
	if r.opts.MaxConcurrentRequests > 0 {
		r.door = admission.NewLimiter(r.opts.MaxConcurrentRequests, r.opts.RateLimitTokensPerSecond, r.opts.QueueSize,
			r.objectiveQueueTimeout(admission.Default, time.Duration(r.opts.QueueTimeoutSecs)*time.Second), r.metrics.limiter, r.opts.Now)
	}
}

// startScheduler builds the scheduler; on failure it logs the problem and
// the fallback and returns false.
func (r *Router) startScheduler(reg prometheus.Registerer) bool {
	s, err := buildScheduler(r.opts, reg)
	if err != nil {
		fallback := "no admission limit"
		if r.opts.MaxConcurrentRequests > 0 {
			fallback = "the rate limiting path (--max-concurrent-requests token bucket)"
		}
		r.log.Error("Priority scheduler not started; falling back", "problem", err.Error(), "fallback", fallback)
		return false
	}
	for _, p := range s.Config().Problems {
		r.log.Error("Priority scheduler config: a mistake, fallback taken", "config", r.opts.PrioritySchedulerConfig, "problem", p)
	}
	r.sched, r.door = s, s
	r.schedFromFleet = fleetCapacitySource(r.opts)
	capacity := "--max-concurrent-requests"
	if r.schedFromFleet {
		capacity = "the sum of this router's window shares"
	}
	r.log.Info("Priority scheduler on", "capacity", capacity, "config", r.opts.PrioritySchedulerConfig)
	return true
}

// requestClass reads the caller's tenant and requested class and clamps it.
func (r *Router) requestClass(req *http.Request) (admission.Class, string) {
	cfg := r.sched.Config()
	m := r.sched.Metrics()
	tenant := cfg.Tenant(req.Header, req.RemoteAddr)
	requested := admission.Default
	if vals, present := req.Header[http.CanonicalHeaderKey(PriorityHeader)]; present {
		var ok bool
		if requested, ok = admission.ParseClass(vals[0]); !ok {
			m.CountUnknown(tenant)
		}
	}
	effective := admission.Clamp(requested, cfg.MaxClass(tenant))
	if effective != requested {
		m.CountClamp(tenant, requested, effective)
	}
	return effective, tenant
}

// admit lets the request through the door. On refusal it has answered and
// returns false with the status sent. The ticket is nil unless the scheduler
// admitted the request; the caller releases it with r.door.Release. borrow
// (nil: none) asks a peer router for a room for the request of tenant in
// class when the scheduler would make it wait (pooled headroom).
func (r *Router) admit(w http.ResponseWriter, req *http.Request, model string, borrow func(admission.Class, string) bool) (*admission.Ticket, int, bool) {
	if r.sched == nil {
		t, res := r.door.Admit(req.Context(), admission.Default)
		switch res {
		case admission.Admitted:
			return t, 0, true
		case admission.QueueFull:
			writeError(w, http.StatusTooManyRequests, CodeAdmissionQueueFull,
				"Too many requests: the admission queue is full", r.retryAfterQueued(admission.Bulk))
			return nil, http.StatusTooManyRequests, false
		case admission.QueueTimeout:
			writeError(w, http.StatusServiceUnavailable, CodeAdmissionQueueTimeout,
				"Timed out waiting in the admission queue", r.retryAfterQueued(admission.Bulk))
			return nil, http.StatusServiceUnavailable, false
		}
		return nil, r.admissionEnded(w, req), false
	}
	class, tenant := r.requestClass(req)
	var ask func() bool
	if borrow != nil {
		ask = func() bool { return borrow(class, tenant) }
	}
	t, res := r.sched.AdmitOrBorrow(req.Context(), class, tenant, model, ask)
	switch res {
	case admission.Admitted:
		return t, 0, true
	case admission.OverFairShare:
		writeError(w, http.StatusTooManyRequests, CodeTenantOverFairShare,
			"Too many requests: tenant '"+tenant+"' holds its fair share of the capacity while other tenants are active", r.retryAfterQueued(class))
		return nil, http.StatusTooManyRequests, false
	case admission.QueueFull:
		writeError(w, http.StatusTooManyRequests, CodeSchedulerQueueFull,
			"Too many requests: the "+class.String()+" queue is full", r.retryAfterQueued(class))
		return nil, http.StatusTooManyRequests, false
	case admission.QueueTimeout:
		writeError(w, http.StatusRequestTimeout, CodeSchedulerQueueTimeout,
			"Timed out waiting in the "+class.String()+" queue", r.retryAfterQueued(class))
		return nil, http.StatusRequestTimeout, false
	}
	if !clientLeft(req) {
		return nil, r.admissionEnded(w, req), false
	}
	r.log.Info("Client left before admission", "class", class.String(), "tenant", tenant,
		"code", CodeSchedulerClientCancelled)
	writeError(w, statusClientClosed, CodeSchedulerClientCancelled, "The client left before admission", 0)
	return nil, statusClientClosed, false
}

// admissionEnded answers a request whose wait for admission ended without
// a verdict: nothing when its client left, router_shutting_down when Stop
// ended it (through the request's context).
func (r *Router) admissionEnded(w http.ResponseWriter, req *http.Request) int {
	if clientLeft(req) || !r.stopping() {
		return statusClientClosed
	}
	writeError(w, http.StatusServiceUnavailable, CodeShuttingDown, "The router is shutting down; retry on another router", 1)
	return http.StatusServiceUnavailable
}

// watchPreemption cancels ctx when the ticket is chosen as a victim.
func watchPreemption(ctx context.Context, t *admission.Ticket) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	t.OnPreempt(func() { cancel(errPreempted) })
	return ctx, func() { cancel(nil) }
}

// preempted reports whether ctx ended by preemption.
func preempted(ctx context.Context) bool { return errors.Is(context.Cause(ctx), errPreempted) }

// writePreempted is SMG's preemption answer.
func writePreempted(w http.ResponseWriter) int {
	w.Header()[PreemptedHeader] = []string{"true"}
	writeError(w, http.StatusServiceUnavailable, CodeSchedulerPreempted,
		"Preempted by a higher-priority request before the first byte; retry", 1)
	return http.StatusServiceUnavailable
}

// admissionRetryAfter is the Retry-After (seconds) of the door's refusals in
// --retry-after-mode interval: the gateway's own queue drains in well under
// the load monitor interval.
const admissionRetryAfter = 1
