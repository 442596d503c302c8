// Package watchclient keeps a router's snapshot of the fleet in step with the
// control plane over WatchService, and reports back what the router sees.
//
// It holds the workers it was sent in a map, applies each snapshot or delta to
// it, and publishes an immutable router.Snapshot (workers sorted by id). When
// the stream breaks it reconnects with backoff and resumes from the (epoch,
// revision) it holds; while the control plane stays silent longer than
// StaleAfter it tells the router to drop the vetoes (fail open) and keeps the
// last snapshot. When a new epoch's control plane says it is still warming up
// (its registry refilling), it keeps the previous epoch's workers that the
// new one lacks or has not judged healthy yet, for as long as it says.
//
// It owns the stream and the copy of the fleet it was sent; routing on it is
// the router's.
package watchclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/timestamppb"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/backoff"
	"github.com/smg-project/smg/internal/cpconn"
	"github.com/smg-project/smg/router"
	"github.com/smg-project/smg/router/admission"
)

// Target is the router the client feeds.
type Target interface {
	// Apply publishes a new snapshot; the router owns it from then on.
	Apply(*router.Snapshot)
	// FailOpen drops the control plane's vetoes, keeping the last snapshot.
	FailOpen()
	// ContactSeen says the control plane heard from a worker after a failure.
	ContactSeen(workerID string)
	// Observations returns what the router saw since the previous call.
	Observations() router.Observations
}

// FleetTenantsTarget is a Target that weighs fair shares fleet-wide: it takes
// the other routers' tenants as the control plane relays them.
type FleetTenantsTarget interface {
	FleetTenants([]admission.TenantDemand)
}

// fleetTenants converts the relayed tenants.
func fleetTenants(m *smgv1.TenantShares) []admission.TenantDemand {
	out := make([]admission.TenantDemand, 0, len(m.GetOthers()))
	for _, u := range m.GetOthers() {
		out = append(out, admission.TenantDemand{Tenant: u.GetTenant(), Weight: u.GetWeight(),
			InFlight: u.GetInFlight(), Waiting: u.GetWaiting(), Demand: u.GetDemand(), Mean: u.GetMean()})
	}
	return out
}

// Defaults for Options.
const (
	DefaultReportInterval = 250 * time.Millisecond
)

// MinEarlyReport is the least time from one report to an early one: a
// router sends at most 1/MinEarlyReport early reports a second, each as a
// regular report (every worker), whatever its dispatches.
const MinEarlyReport = 50 * time.Millisecond

// EarlyReportTarget is a Target that asks for a report before the next
// tick: the router after a dispatch that moved its prompt tokens in flight
// on a worker by a jump (router.Router.ReportSoon).
type EarlyReportTarget interface {
	ReportSoon() <-chan struct{}
}

// Options configure a Client.
type Options struct {
	// RouterID names this router to the control plane.
	RouterID string
	// Token is sent as "authorization: Bearer <token>" (--watch-token).
	Token string
	// StaleAfter is how long the control plane may stay silent before the
	// router drops its vetoes (--worker-stale-secs); 0 never fails open.
	// Only until the first snapshot: then the control plane's own bound
	// (FleetSettings) applies.
	StaleAfter time.Duration
	// ReportInterval is how often observations are sent (default 250ms).
	ReportInterval time.Duration
	// Backoff spaces reconnects (zero fields: the defaults of
	// internal/backoff, capped at 1s).
	Backoff backoff.Policy
	// Rand draws backoff jitter from [0, 1) (nil: math/rand/v2).
	Rand func() float64
	// Now is the clock of the stale bound, warm-up and carried windows
	// (nil: time.Now): the router's own.
	Now func() time.Time
}

func (o Options) withDefaults() Options {
	if o.ReportInterval <= 0 {
		o.ReportInterval = DefaultReportInterval
	}
	o.Backoff = o.Backoff.WithDefaults()
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// Client watches the control plane for one router.
type Client struct {
	stub   smgv1.WatchServiceClient
	target Target
	opts   Options
	log    *slog.Logger

	connected atomic.Bool

	mu       sync.Mutex // guards epoch and revision
	epoch    string
	revision uint64

	// Owned by the applying side, under applyMu: the stream goroutine and
	// the stale timer both reach the target.
	applyMu    sync.Mutex
	workers    map[string]heldWorker
	order      []string  // ids sorted; nil when membership changed
	held       bool      // a snapshot has been published
	lastHeard  time.Time // last message from the control plane
	failedOpen bool
	stale      *time.Timer
	staleAfter time.Duration         // opts.StaleAfter until the control plane sends its own
	settings   *router.FleetSettings // the control plane's, from its last snapshot
	// reportAcked is the latest report of this router's that the control
	// plane on this stream acknowledged (0: none yet): each worker it sends
	// after the ack has a sum ahead that holds that report
	// (router.Worker.AheadReport).
	reportAcked uint64
	// kept: workers of a previous epoch held while the current epoch warms
	// up, each until this epoch lists it healthy or removes it, all until
	// keepUntil (keepTimer).
	kept      map[string]heldWorker
	keepUntil time.Time
	keepTimer *time.Timer
	// carried: the running window and share a worker had under the
	// previous epoch, used while the current epoch has sent none for it
	// yet (a new leader before its allocator ran), until carryUntil.
	carried    map[string]carry
	carryUntil time.Time

	ackSignal chan struct{} // buffered 1: the sender acks the latest revision
}

// window is what a router gates a worker on: its running window (a decode
// worker's MaxRunning, a regular worker's AdmissionRooms) and this router's
// share of it.
type window struct {
	decode                   bool
	maxRunning, rooms, share int64
	tokens, tokenShare       int64 // the token budget and this router's share, carried with the window
}

func windowOf(w router.Worker) window {
	return window{w.Type == router.TypeDecode, w.MaxRunning, w.AdmissionRooms, w.WindowShare, w.TokenBudget, w.TokenShare}
}

// known reports whether the control plane said anything about the window
// the router gates the worker on.
func (v window) known() bool {
	if v.decode {
		return v.maxRunning > 0 || v.share != 0
	}
	return v.rooms > 0 || v.share != 0
}

// granted reports whether the window is the control plane's word: a share
// granted, or a window without shares.
func (v window) granted() bool { return v.share > 0 || (v.known() && v.share == 0) }

// tokensKnown and tokensGranted are known and granted for the token budget.
func (v window) tokensKnown() bool   { return v.tokens > 0 || v.tokenShare != 0 }
func (v window) tokensGranted() bool { return v.tokenShare > 0 || (v.tokens > 0 && v.tokenShare == 0) }

// carry is a window held from before, in the dimensions still carried
// (rooms, tokens): each ends on its own grant.
type carry struct {
	window
	rooms, tokens bool
}

// applyTo puts the carried dimensions into w.
func (cr carry) applyTo(w *router.Worker) {
	if cr.rooms {
		w.MaxRunning, w.AdmissionRooms, w.WindowShare = max(w.MaxRunning, cr.maxRunning), cr.window.rooms, cr.share
	}
	if cr.tokens {
		w.TokenBudget, w.TokenShare = cr.window.tokens, cr.tokenShare
	}
}

// heldWorker is a worker as last sent, converted once for the router.
type heldWorker struct {
	w          router.Worker
	contactSeq uint64
}

// New returns a client that watches over conn and feeds target.
func New(conn grpc.ClientConnInterface, target Target, opts Options, log *slog.Logger) *Client {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Client{
		stub:       smgv1.NewWatchServiceClient(conn),
		target:     target,
		opts:       opts.withDefaults(),
		staleAfter: opts.StaleAfter,
		log:        log,
		workers:    make(map[string]heldWorker),
		ackSignal:  make(chan struct{}, 1),
	}
}

// Revision returns the epoch and revision held.
func (c *Client) Revision() (epoch string, rev uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.epoch, c.revision
}

// Connected reports whether a stream is up and has delivered a message.
func (c *Client) Connected() bool { return c.connected.Load() }

// errGoodbye ends a session the control plane closed on purpose.
var errGoodbye = errors.New("control plane said goodbye")

// Run watches until ctx ends, reconnecting as needed. It returns ctx's error.
func (c *Client) Run(ctx context.Context) error {
	defer c.stopStale()
	retry := backoff.New(c.opts.Backoff, c.opts.Rand)
	var redirects cpconn.Redirects
	for {
		heard, err := c.session(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if heard {
			retry.Reset() // the link worked: start over
			if errors.Is(err, errGoodbye) {
				// A deliberate shutdown: reconnect at once (a replica or the
				// restarted control plane answers). A goodbye with nothing
				// before it is a control plane still closing: back off.
				c.log.Info("Control plane said goodbye; reconnecting now")
				continue
			}
		}
		if leader := redirects.AtOnce(err); leader != "" { // a follower named the leader
			c.log.Info("Sent to the leader; reconnecting now", "leader", leader)
			continue
		}
		wait := retry.Next()
		c.log.Warn("Watch stream lost; reconnecting", "err", err, "in", wait)
		if !backoff.Sleep(ctx, wait) {
			return ctx.Err()
		}
	}
}

// session runs one stream. heard says whether the control plane sent
// anything besides a goodbye.
func (c *Client) session(ctx context.Context) (heard bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer c.connected.Store(false)
	if c.opts.Token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.opts.Token)
	}
	stream, err := c.stub.Watch(ctx)
	if err != nil {
		return false, err
	}
	epoch, rev := c.Revision()
	hello := &smgv1.WatchHello{RouterId: c.opts.RouterID, Epoch: epoch, Revision: rev}
	if err := stream.Send(&smgv1.WatchRequest{Msg: &smgv1.WatchRequest_Hello{Hello: hello}}); err != nil {
		if errors.Is(err, io.EOF) {
			_, err = stream.Recv() // the stream ended; Recv tells why (a refused token, say)
		}
		return false, err
	}
	c.applyMu.Lock()
	c.reportAcked = 0 // acks are per stream: this control plane has acked nothing yet
	c.applyMu.Unlock()
	var wg sync.WaitGroup
	wg.Go(func() { c.send(ctx, stream) })
	defer wg.Wait()
	defer cancel() // runs before wg.Wait: stops the sender

	for {
		resp, err := stream.Recv()
		if err != nil {
			return heard, err
		}
		if resp.GetGoodbye() != nil {
			return heard, errGoodbye
		}
		heard = true
		if err := c.handle(resp); err != nil {
			return heard, err
		}
	}
}

// send acks applied revisions and sends observations every ReportInterval,
// and early when the target asks (EarlyReportTarget). It is the stream's
// only sender after the hello. Acks feed the control plane's lag display,
// not correctness (a resume names its revision), so at most one goes out
// per ReportInterval on its own; the rest ride with the next report.
func (c *Client) send(ctx context.Context, stream grpc.BidiStreamingClient[smgv1.WatchRequest, smgv1.WatchResponse]) {
	tick := time.NewTicker(c.opts.ReportInterval)
	defer tick.Stop()
	var soon <-chan struct{}
	if t, ok := c.target.(EarlyReportTarget); ok {
		soon = t.ReportSoon()
	}
	var acked uint64
	var lastAck, lastReport time.Time
	ack := func() error {
		_, rev := c.Revision()
		if rev == acked && !lastAck.IsZero() {
			return nil
		}
		acked, lastAck = rev, c.opts.Now()
		return stream.Send(&smgv1.WatchRequest{Msg: &smgv1.WatchRequest_Ack{Ack: &smgv1.WatchAck{Revision: rev}}})
	}
	pending := false
	var held <-chan time.Time // an early report waiting out MinEarlyReport
	sendReport := func() error {
		if pending {
			pending = false
			if err := ack(); err != nil {
				return err
			}
		}
		held, lastReport = nil, c.opts.Now()
		return stream.Send(&smgv1.WatchRequest{Msg: &smgv1.WatchRequest_Report{Report: report(c.withCarried(c.target.Observations()))}})
	}
	for {
		var err error
		select {
		case <-ctx.Done():
			return
		case <-c.ackSignal:
			if !lastAck.IsZero() && c.opts.Now().Sub(lastAck) < c.opts.ReportInterval {
				pending = true
				continue
			}
			err = ack()
		case <-soon:
			if held != nil {
				continue // one is due already
			}
			if d := MinEarlyReport - c.opts.Now().Sub(lastReport); d > 0 {
				held = time.After(d)
				continue
			}
			err = sendReport()
		case <-held:
			err = sendReport()
		case <-tick.C:
			err = sendReport()
		}
		if err != nil {
			return // Recv sees the same failure and ends the session
		}
	}
}

// handle applies one message from the control plane.
func (c *Client) handle(resp *smgv1.WatchResponse) error {
	c.applyMu.Lock()
	defer c.applyMu.Unlock()
	c.lastHeard = c.opts.Now()
	c.armStale()
	c.connected.Store(true)

	epoch, _ := c.Revision()
	expired := c.carryExpired()
	var contacts []string
	var changed []string // the workers a delta changed; nil: publish them all
	switch m := resp.Msg.(type) {
	case *smgv1.WatchResponse_Snapshot:
		settings := c.settings
		c.adoptSettings(m.Snapshot.GetSettings())
		if sameSettings(settings, c.settings) {
			// Published as the change from the workers held: a resync or
			// a failover changes few of them, and so costs the router few.
			changed = c.heldIDs(make([]string, 0, len(c.workers)+len(c.kept)+len(m.Snapshot.GetWorkers())))
		}
		c.keepPrevious(resp.Epoch != epoch, time.Duration(m.Snapshot.GetWarmingSecs())*time.Second)
		next := make(map[string]heldWorker, len(m.Snapshot.GetWorkers()))
		for _, w := range m.Snapshot.GetWorkers() {
			contacts = c.noteContact(contacts, w)
			next[w.GetWorkerId()] = heldWorker{c.routerWorker(w), w.GetContactSeq()}
			c.judged(w)
			c.carryWindow(w.GetWorkerId(), next[w.GetWorkerId()].w, resp.Epoch != epoch)
		}
		for id := range c.carried {
			if _, ok := next[id]; !ok {
				delete(c.carried, id)
			}
		}
		c.workers, c.order = next, nil
		if changed != nil {
			changed = c.heldIDs(changed)
		}
	case *smgv1.WatchResponse_Delta:
		if resp.Epoch != epoch {
			c.setRevision("", 0) // ask for a snapshot on reconnect
			return fmt.Errorf("delta under epoch %q while holding %q", resp.Epoch, epoch)
		}
		changed = make([]string, 0, len(m.Delta.GetUpserts())+len(m.Delta.GetRemoved()))
		for _, w := range m.Delta.GetUpserts() {
			changed = append(changed, w.GetWorkerId())
			contacts = c.noteContact(contacts, w)
			if _, ok := c.workers[w.GetWorkerId()]; !ok {
				c.order = nil
			}
			rw := c.routerWorker(w)
			c.carryWindow(w.GetWorkerId(), rw, false)
			c.workers[w.GetWorkerId()] = heldWorker{rw, w.GetContactSeq()}
			c.judged(w)
		}
		for _, id := range m.Delta.GetRemoved() {
			changed = append(changed, id)
			if _, ok := c.workers[id]; ok {
				delete(c.workers, id)
				c.order = nil
			}
			if _, ok := c.kept[id]; ok { // deleted on the new control plane
				delete(c.kept, id)
				c.order = nil
			}
			delete(c.carried, id)
		}
	case *smgv1.WatchResponse_ReportAck:
		c.reportAcked = max(c.reportAcked, m.ReportAck.GetSeq())
		return nil
	case *smgv1.WatchResponse_Tenants:
		if ft, ok := c.target.(FleetTenantsTarget); ok {
			ft.FleetTenants(fleetTenants(m.Tenants))
		}
		return nil
	case *smgv1.WatchResponse_Heartbeat:
		if c.failedOpen || expired {
			c.publish(epoch, c.heldRevision()) // the control plane is back: verdicts return
		}
		c.signalAck()
		return nil
	default:
		return nil
	}
	// Publish before recording the revision: an ack then always names a
	// revision the router has applied (window shares rely on it).
	if changed == nil || expired || !c.publishChanges(resp.Epoch, resp.Revision, changed) {
		c.publish(resp.Epoch, resp.Revision)
	}
	c.setRevision(resp.Epoch, resp.Revision)
	for _, id := range contacts {
		c.target.ContactSeen(id)
	}
	c.signalAck()
	return nil
}

func (c *Client) heldRevision() uint64 {
	_, rev := c.Revision()
	return rev
}

// noteContact lists w when its contact sequence moved past the one held:
// the control plane heard from it after a failure.
func (c *Client) noteContact(ids []string, w *smgv1.RoutingWorker) []string {
	if old, ok := c.workers[w.GetWorkerId()]; ok && w.GetContactSeq() > old.contactSeq {
		ids = append(ids, w.GetWorkerId())
	}
	return ids
}

func (c *Client) setRevision(epoch string, rev uint64) {
	c.mu.Lock()
	c.epoch, c.revision = epoch, rev
	c.mu.Unlock()
}

func (c *Client) signalAck() {
	select {
	case c.ackSignal <- struct{}{}:
	default: // an ack is already due; it reads the latest revision
	}
}

// publish hands the router an immutable snapshot of the map, with the kept
// workers of a previous epoch in place of those the current one lacks or
// has not judged healthy yet. Caller holds applyMu.
func (c *Client) publish(epoch string, rev uint64) {
	if c.order == nil {
		c.order = make([]string, 0, len(c.workers)+len(c.kept))
		for id := range c.workers {
			c.order = append(c.order, id)
		}
		for id := range c.kept {
			if _, ok := c.workers[id]; !ok {
				c.order = append(c.order, id)
			}
		}
		slices.Sort(c.order)
	}
	s := &router.Snapshot{Epoch: epoch, Revision: rev, Workers: make([]router.Worker, len(c.order)), Settings: c.settings}
	for i, id := range c.order {
		s.Workers[i], _ = c.published(id)
	}
	c.target.Apply(s)
	c.held, c.failedOpen = true, false
}

// published is worker id as the router is to hold it: the kept copy of a
// previous epoch while this epoch has not listed it healthy, else the
// current epoch's with any carried window; ok false when it holds neither.
// Caller holds applyMu.
func (c *Client) published(id string) (w router.Worker, ok bool) {
	if k, ok := c.kept[id]; ok {
		return k.w, true
	}
	h, ok := c.workers[id]
	if !ok {
		return router.Worker{}, false
	}
	w = h.w
	if v, ok := c.carried[id]; ok {
		v.applyTo(&w)
	}
	return w, true
}

// heldIDs appends the ids of the workers held, kept ones too. Caller holds
// applyMu.
func (c *Client) heldIDs(ids []string) []string {
	for id := range c.workers {
		ids = append(ids, id)
	}
	for id := range c.kept {
		ids = append(ids, id)
	}
	return ids
}

// sameSettings reports whether a and b hold the same values.
func sameSettings(a, b *router.FleetSettings) bool {
	return a == b || a != nil && b != nil && *a == *b
}

// deltaTarget is a target that takes a change to the snapshot it holds
// (the router does), so a delta costs what it changes, not the fleet.
type deltaTarget interface {
	ApplyDelta(*router.Delta)
}

// publishChanges hands the router only the workers a delta changed, and
// reports whether it could: the target must take deltas and hold the
// snapshot published last (not failed open, which a full publish ends).
// Caller holds applyMu.
func (c *Client) publishChanges(epoch string, rev uint64, ids []string) bool {
	t, ok := c.target.(deltaTarget)
	if !ok || !c.held || c.failedOpen {
		return false
	}
	d := &router.Delta{Epoch: epoch, Revision: rev}
	seen := make(map[string]bool, len(ids))
	for _, id := range ids {
		if seen[id] {
			continue
		}
		seen[id] = true
		if w, ok := c.published(id); ok {
			d.Upserts = append(d.Upserts, w)
		} else {
			d.Removed = append(d.Removed, id)
		}
	}
	t.ApplyDelta(d)
	return true
}

// keepPrevious decides at a snapshot which workers of the view held so far
// stay while the control plane warms up (warming > 0): on a new epoch, every
// worker of the view, vetoes dropped (the fail-open direction, as a new
// leader presumes its workers); on a re-sync, those already kept. A complete
// registry (warming 0) is the whole fleet: nothing is kept. Caller holds
// applyMu.
func (c *Client) keepPrevious(newEpoch bool, warming time.Duration) {
	if warming <= 0 {
		if len(c.kept) > 0 {
			c.log.Info("Control plane registry complete; dropping the workers kept from the previous epoch it does not list", "kept", len(c.kept))
		}
		c.dropKept()
		return
	}
	if newEpoch && c.held {
		kept := make(map[string]heldWorker, len(c.workers)+len(c.kept))
		maps.Copy(kept, c.kept)
		for id, w := range c.workers {
			if _, ok := kept[id]; !ok || w.w.Healthy {
				kw := keptWorker(w.w)
				if v, ok := c.carried[id]; ok { // as published: the window it held
					v.applyTo(&kw)
				}
				kept[id] = heldWorker{w: kw, contactSeq: w.contactSeq}
			}
		}
		c.kept, c.order = kept, nil
		c.log.Info("New control plane epoch still warming up; keeping the previous epoch's workers it does not list as healthy yet",
			"workers", len(kept), "for", warming)
	}
	if len(c.kept) == 0 {
		return
	}
	c.keepUntil = c.opts.Now().Add(warming)
	if c.keepTimer == nil {
		c.keepTimer = time.AfterFunc(warming, c.keepExpired)
		return
	}
	c.keepTimer.Reset(warming)
}

// carryWindow keeps the window and share the router held for a worker
// that the control plane lists without them: a new leader before its
// allocator ran or before the worker's first load report (no window), or
// while it has granted this router nothing yet (share -1, its warm-up); or a
// replica that stepped down and dropped its soft state in the instant
// before the router's stream to it ended (no window). A failover never gives
// a router more room than it held (an unknown window would not gate at all),
// and a router keeps serving within what it held until the new leader
// grants it a share (it adopts what the router reports holding). A granted
// share (or a window without shares) ends the carry; the stale bound ends
// them all. Within an epoch, a share of -1 is the allocator's word and
// applies at once. The running window and the token budget are carried
// each on its own, as the allocator grants them: a new leader learns a
// worker's KV capacity only from its next load report, and until then a
// budget it does not send must neither ungate the router (a burst) nor
// leave it at -1 (nothing). Caller holds applyMu; c.workers is the view as
// held.
func (c *Client) carryWindow(id string, next router.Worker, newEpoch bool) {
	v := windowOf(next)
	if cr, ok := c.carried[id]; ok {
		cr.rooms = cr.rooms && !v.granted()
		cr.tokens = cr.tokens && !v.tokensGranted()
		if !cr.rooms && !cr.tokens {
			delete(c.carried, id) // the control plane's window from now on
			return
		}
		c.carried[id] = cr
		return
	}
	old, ok := c.workers[id]
	if !ok {
		return
	}
	ov := windowOf(old.w)
	cr := carry{window: ov,
		rooms:  ov.known() && !v.granted() && (newEpoch || !v.known()),
		tokens: ov.tokensKnown() && !v.tokensGranted() && (newEpoch || !v.tokensKnown())}
	if !cr.rooms && !cr.tokens {
		return
	}
	if len(c.carried) == 0 {
		c.log.Info("Control plane sent no window or share for a worker yet; keeping the window and share held", "worker", id)
		c.carryUntil = time.Time{}
		if c.staleAfter > 0 {
			c.carryUntil = c.opts.Now().Add(c.staleAfter)
		}
	}
	if c.carried == nil {
		c.carried = make(map[string]carry)
	}
	c.carried[id] = cr
}

// withCarried reports, for each worker whose share is carried from a
// previous epoch, at least that share in flight (rooms and tokens): the new
// leader then counts them as held by this router (and grants them back to
// it) instead of handing them to another router meanwhile.
func (c *Client) withCarried(obs router.Observations) router.Observations {
	c.applyMu.Lock()
	defer c.applyMu.Unlock()
	if len(c.carried) == 0 {
		return obs
	}
	obs.Demand = slices.Clone(obs.Demand) // the router's own, not ours to change
	for i := range obs.Demand {
		cr, ok := c.carried[obs.Demand[i].WorkerID]
		if ok && cr.rooms && cr.share > 0 {
			obs.Demand[i].InFlight = max(obs.Demand[i].InFlight, cr.share)
		}
		if ok && cr.tokens && cr.tokenShare > 0 {
			obs.Demand[i].TokensInFlight = max(obs.Demand[i].TokensInFlight, cr.tokenShare)
		}
	}
	return obs
}

// carryExpired drops the carried windows once the stale bound has passed
// since the epoch began without the control plane sending them, and reports
// whether it did (the view must be published again). Caller holds applyMu.
func (c *Client) carryExpired() bool {
	if len(c.carried) == 0 || c.carryUntil.IsZero() || c.opts.Now().Before(c.carryUntil) {
		return false
	}
	c.log.Warn("Control plane sent no window for workers past the stale bound; dropping the windows held from the previous epoch", "workers", len(c.carried))
	c.carried = nil
	return true
}

// keptWorker is w as kept from a previous epoch: no veto, marked held.
func keptWorker(w router.Worker) router.Worker {
	w.Veto, w.VetoReason, w.Overloaded, w.OverloadReason, w.Held = router.VetoNone, "", false, "", true
	return w
}

// judged drops the kept copy of a worker the current epoch lists healthy:
// from then on its verdicts are the current epoch's alone. Caller holds
// applyMu.
func (c *Client) judged(w *smgv1.RoutingWorker) {
	if _, ok := c.kept[w.GetWorkerId()]; ok && w.GetHealthy() {
		delete(c.kept, w.GetWorkerId())
	}
}

// dropKept forgets every kept worker. Caller holds applyMu.
func (c *Client) dropKept() {
	if len(c.kept) > 0 {
		c.order = nil
	}
	c.kept = nil
	if c.keepTimer != nil {
		c.keepTimer.Stop()
	}
}

// keepExpired ends the warm-up hold: the kept workers the current epoch
// still lacks leave the view. While failed open the next message from the
// control plane publishes (publishing now would restore its vetoes).
func (c *Client) keepExpired() {
	c.applyMu.Lock()
	defer c.applyMu.Unlock()
	if len(c.kept) == 0 || c.opts.Now().Before(c.keepUntil) {
		return
	}
	c.log.Warn("Control plane warm-up over; dropping the workers kept from the previous epoch it did not list as healthy", "kept", len(c.kept))
	c.dropKept()
	if c.held && !c.failedOpen {
		epoch, rev := c.Revision()
		c.publish(epoch, rev)
	}
}

// adoptSettings takes the control plane's settings from a snapshot: its
// stale bound replaces --worker-stale-secs, and the router gets them with
// every snapshot published. Caller holds applyMu.
func (c *Client) adoptSettings(fs *smgv1.FleetSettings) {
	if fs == nil {
		return
	}
	c.settings = &router.FleetSettings{
		LoadMonitorIntervalSecs: int(fs.GetLoadMonitorIntervalSecs()),
		WorkerStaleSecs:         int(fs.GetWorkerStaleSecs()),
	}
	if d := time.Duration(max(0, fs.GetWorkerStaleSecs())) * time.Second; d != c.staleAfter {
		c.log.Info("Stale bound set by the control plane", "worker_stale_secs", fs.GetWorkerStaleSecs())
		c.staleAfter = d
		if d <= 0 && c.stale != nil {
			c.stale.Stop()
		}
		c.armStale()
	}
}

// armStale (re)starts the stale timer from now. Caller holds applyMu.
func (c *Client) armStale() {
	if c.staleAfter <= 0 {
		return
	}
	if c.stale == nil {
		c.stale = time.AfterFunc(c.staleAfter, c.staleFired)
		return
	}
	c.stale.Reset(c.staleAfter)
}

func (c *Client) stopStale() {
	c.applyMu.Lock()
	defer c.applyMu.Unlock()
	if c.stale != nil {
		c.stale.Stop()
	}
	if c.keepTimer != nil {
		c.keepTimer.Stop()
	}
}

// routerWorker converts w as received now: its sum ahead holds the latest
// report the control plane acknowledged on this stream. Called under applyMu.
func (c *Client) routerWorker(w *smgv1.RoutingWorker) router.Worker {
	rw := routerWorker(w)
	rw.AheadReport = c.reportAcked
	return rw
}

// staleFired fails open once per silence, unless a message arrived meanwhile.
func (c *Client) staleFired() {
	c.applyMu.Lock()
	defer c.applyMu.Unlock()
	if !c.held || c.failedOpen || c.staleAfter <= 0 || c.opts.Now().Sub(c.lastHeard) < c.staleAfter {
		return
	}
	c.failedOpen = true
	c.log.Warn("Control plane silent past the stale bound; dropping its vetoes", "silent_for", c.opts.Now().Sub(c.lastHeard))
	c.target.FailOpen()
}

func routerWorker(w *smgv1.RoutingWorker) router.Worker {
	return router.Worker{
		ID:             w.GetWorkerId(),
		URL:            w.GetUrl(),
		Model:          w.GetModel(),
		Type:           w.GetWorkerType(),
		Priority:       w.GetPriority(),
		Cost:           w.GetCost(),
		Healthy:        w.GetHealthy(),
		Veto:           routerVeto(w.GetVeto()),
		VetoReason:     w.GetVetoReason(),
		Overloaded:     w.GetOverloaded(),
		OverloadReason: w.GetOverloadReason(),
		Waiting:        w.GetWaitingRequests(),
		Running:        w.GetRunningRequests(),
		TokenUsage:     w.GetTokenUsage(),
		MaxRunning:     w.GetMaxRunningRequests(),
		LoadRevision:   w.GetLoadRevision(),
		BootstrapPort:  w.GetBootstrapPort(),
		APIKey:         w.GetApiKey(),
		WindowShare:    w.GetWindowShare(),

		AdmissionRooms:    w.GetAdmissionRooms(),
		Provider:          routerProvider(w.GetProvider()),
		PromptTokensAhead: w.GetPromptTokensAhead(),
		TokenBudget:       w.GetTokenBudget(),
		TokenShare:        w.GetTokenShare(),
	}
}

// routerProvider is an external worker's provider block (nil: an engine).
func routerProvider(p *smgv1.ProviderRoute) *router.Provider {
	if p == nil {
		return nil
	}
	out := &router.Provider{Model: p.GetModel(), KeyRef: p.GetApiKeyRef(),
		Timeout:             time.Duration(p.GetTimeoutSecs()) * time.Second,
		SpillRequestsPerSec: p.GetSpillRequestsPerSec(), SpillTokensPerSec: p.GetSpillTokensPerSec()}
	for _, h := range p.GetHeaders() {
		out.Headers = append(out.Headers, [2]string{h.GetName(), h.GetValue()})
	}
	return out
}

func routerVeto(v smgv1.Veto) router.Veto {
	switch v {
	case smgv1.Veto_VETO_OVERLOAD:
		return router.VetoOverload
	case smgv1.Veto_VETO_UNREACHABLE:
		return router.VetoUnreachable
	case smgv1.Veto_VETO_WEDGED:
		return router.VetoWedged
	}
	return router.VetoNone
}

// tokensByClass is d's token demand by class, or nil without a token budget
// (the report stays as it was).
func tokensByClass(d router.WindowDemand) []int64 {
	if d.TokensWaiting == 0 {
		return nil
	}
	return d.TokensWaitingByClass[:]
}

// report converts the router's observations.
func report(obs router.Observations) *smgv1.RouterReport {
	r := &smgv1.RouterReport{Seq: obs.Seq, Workers: make([]*smgv1.WorkerObservation, len(obs.Workers))}
	for i, o := range obs.Workers {
		wo := &smgv1.WorkerObservation{
			WorkerId:             o.WorkerID,
			StreamsInFlight:      int32(min(o.StreamsInFlight, math.MaxInt32)),
			PromptTokensInFlight: o.PromptTokensInFlight,
			ConnectionFailures:   int32(min(o.ConnectionFailures, math.MaxInt32)),
			PrefillTokensPerSec:  o.PrefillTokensPerSec,
			Contact:              o.Contact,
		}
		if !o.LastProgress.IsZero() {
			wo.LastProgress = timestamppb.New(o.LastProgress)
		}
		if !o.LastContact.IsZero() {
			wo.LastContact = timestamppb.New(o.LastContact)
		}
		r.Workers[i] = wo
	}
	for _, d := range obs.Demand {
		r.Demand = append(r.Demand, &smgv1.DecodeDemand{WorkerId: d.WorkerID, InFlight: d.InFlight, Waiting: d.Waiting,
			WaitingByClass: d.WaitingByClass[:], Queued: d.Queued,
			TokensInFlight: d.TokensInFlight, TokensWaiting: d.TokensWaiting, TokensWaitingByClass: tokensByClass(d)})
	}
	for _, t := range obs.Tenants {
		r.Tenants = append(r.Tenants, &smgv1.TenantUsage{Tenant: t.Tenant, Weight: t.Weight, InFlight: t.InFlight, Waiting: t.Waiting,
			Demand: t.Demand, Mean: t.Mean})
	}
	return r
}
