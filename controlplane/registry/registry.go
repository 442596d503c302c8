// Package registry is the control plane's state store: workers, their resolved
// thresholds, latest load report and verdicts, with their URLs and
// registration jobs, in copy-on-write tables (tree.go). Every write transaction commits
// its changes under one new revision, kept in a bounded history so that
// watchers can ask for the changes since a revision they hold.
//
// It owns every worker record, revisions, the change history and the one
// place verdicts are decided (decide.go). It imports only judge among smg's
// packages and starts no goroutine: callers bring the transactions.
package registry

import (
	"maps"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/smg-project/smg/controlplane/judge"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// Health of a worker as the health checker sees it.
type Health string

const (
	HealthPending   Health = "pending"
	HealthHealthy   Health = "healthy"
	HealthUnhealthy Health = "unhealthy"
)

// Worker is one registered worker, in parts that change for different
// reasons: Registered (what registration decided; durable), State and
// Shares (what the control plane holds of it now and routers see: health,
// load, verdicts, window shares; soft, rebuilt by a new leader), Evidence
// (what the verdicts are decided from; never sent). A change to any part
// but Evidence is one routers see (sameVisible). Records are immutable
// once stored: writers copy, change and insert (Clone).
type Worker struct {
	Registered
	State
	Shares
	// Evidence is what the verdicts are decided from. It is stored with
	// the record so that a verdict commits in the same transaction as the
	// evidence it follows from (Insert decides it); it is not sent to
	// routers, and a change to it alone commits no new revision.
	Evidence Evidence

	Revision uint64 // revision of the last change to this record
}

// Registered is what registration decided about a worker: replicated, kept
// by a new leader.
type Registered struct {
	ID         string
	Spec       *smgv1.WorkerSpec // as registered, never mutated
	Model      string            // resolved model id
	Type       string            // regular, prefill or decode
	Thresholds judge.Thresholds
}

// State is a worker's soft state but its window shares: what the control
// plane holds of it now, rebuilt by each leader (Presumed). It is
// comparable, so a field added here is compared without being listed.
type State struct {
	Health Health

	Load         *smgv1.EngineLoad // latest report; nil: none
	LoadRevision uint64            // bumps with every ingested report

	Overloaded     bool
	OverloadReason string
	Liveness       smgv1.Veto // VETO_UNSPECIFIED, VETO_UNREACHABLE or VETO_WEDGED
	LivenessReason string
	ContactSeq     uint64 // bumps when contact ends a failure spell (routers close breakers)

	AgentNode string // agent feeding this worker's load, if any

	// PromptTokensAhead is the prompt tokens waiting for prefill on the
	// worker (judge.Liveness.PromptTokensAhead), for routers' TTFT
	// predictions; set with the verdicts from the evidence.
	PromptTokensAhead int64
	// AheadRevision bumps when a router's part of PromptTokensAhead
	// changes, even when the sum does not: the worker then reaches routers
	// again, paced as a load, so each learns which of its reports the sum
	// holds now (watch.proto's ReportAck).
	AheadRevision uint64
	// AheadJump bumps when one router's report moves PromptTokensAhead by
	// a jump (evidence.AheadJumpTokens or more, up or down, within the
	// inbox's fleet-wide bound): unlike AheadRevision it is not masked
	// by loadOnly, so the worker reaches routers at once, as a routing
	// change, instead of on the load grid.
	AheadJump uint64
}

// Shares are a worker's window, kept by the window allocator
// (controlplane/windows): soft state too, compared by value (Equal).
type Shares struct {
	WindowShare map[string]int64 // router id -> rooms of the worker's window (PD decode or admission)
	Admission   *Admission       // running window under --worker-admission-window (nil: off)
	TokenShare  map[string]int64 // router id -> tokens of the worker's token budget (--worker-token-budget)
	Budget      *Budget          // token budget under --worker-token-budget (nil: off)
}

// Equal reports whether s and o hold the same shares and windows (a nil
// map is not an empty one).
func (s *Shares) Equal(o *Shares) bool {
	return maps.Equal(s.WindowShare, o.WindowShare) && (s.WindowShare == nil) == (o.WindowShare == nil) &&
		(s.Admission == o.Admission || s.Admission != nil && o.Admission != nil && *s.Admission == *o.Admission) &&
		maps.Equal(s.TokenShare, o.TokenShare) && (s.TokenShare == nil) == (o.TokenShare == nil) &&
		(s.Budget == o.Budget || s.Budget != nil && o.Budget != nil && *s.Budget == *o.Budget)
}

// Budget is a worker's token budget under --worker-token-budget: the tokens
// (prompt plus expected output) routers may hold on it in all, kept by the
// window allocator (controlplane/windows).
type Budget struct {
	Tokens  int64  // the budget (0: none known: never gated by tokens)
	Source  string // "engine" (its reported KV capacity), "learned" or ""
	Learned int64  // learned KV capacity (0: not learned yet)
}

// TokenBudget is the budget in tokens (0: none).
func (b *Budget) TokenBudget() int64 {
	if b == nil || b.Tokens <= 0 {
		return 0
	}
	return b.Tokens
}

// Admission is a worker's running window under --worker-admission-window,
// kept by the window allocator (controlplane/windows).
type Admission struct {
	Window    int64  // running window (0: none known: never gated)
	Source    string // "spec", "engine", "learned" or ""
	Queue     int64  // requests allowed to wait in the engine beyond the window
	Learned   int64  // learned window (0: not learned yet)
	LearnedBy string // what fixed the learned window last (windows.Learned*)
}

// Rooms is the window plus the queue allowance: what routers may hold in
// total (0: no window).
func (a *Admission) Rooms() int64 {
	if a == nil || a.Window <= 0 {
		return 0
	}
	return a.Window + a.Queue
}

// Evidence is a worker's verdict evidence besides its latest load.
type Evidence struct {
	// NoReport: the latest poll produced no load report, so the overload
	// veto is off (fail open) while the last load stays visible.
	NoReport bool
	// Live is the liveness evidence and verdict (judge.Liveness is plain
	// data: a clone's copy is independent).
	Live judge.Liveness
	// Routers is each router's latest view of the worker; copy on write.
	Routers map[string]judge.RouterObservation
	// PushedAt is when an agent last pushed a record for the worker.
	PushedAt time.Time
	// ProbePasses and ProbeFailures count consecutive health probes.
	ProbePasses, ProbeFailures int
	// StartTime is the engine's process start time (seconds since the Unix
	// epoch) last trusted from its loads, 0 before one; StartIgnored counts
	// the reported ones not trusted (decide's restart rule).
	StartTime    float64
	StartIgnored int
	// RestartAt is the load time of the last restart the rule believed.
	RestartAt time.Time
}

// External reports whether the worker is an external provider (spec.provider
// set): never polled, probed, flagged nor judged by liveness.
func (r *Registered) External() bool { return r.Spec.GetProvider() != nil }

// SpillBudget reports whether w is an external worker with a spill-over
// budget: the window allocator splits it among routers (Shares.WindowShare,
// in millionths of the budget).
func SpillBudget(w *Worker) bool {
	p := w.Spec.GetProvider()
	return p.GetSpillRequestsPerSec() > 0 || p.GetSpillTokensPerSec() > 0
}

// MaxRunning is w's running window: the engine's report, else the
// registered one; 0 when neither gives one.
func (w *Worker) MaxRunning() int64 {
	if n := int64(w.Load.GetMaxRunningRequests()); n > 0 {
		return n
	}
	return int64(w.Spec.GetMaxRunningRequests())
}

// Ready reports whether the health checker has admitted the worker.
func (w *Worker) Ready() bool { return w.Health == HealthHealthy }

// Veto is the routing veto: a liveness veto outranks overload, because steering
// takes overloaded workers before those liveness doubts.
func (w *Worker) Veto() (smgv1.Veto, string) {
	if w.Liveness != smgv1.Veto_VETO_UNSPECIFIED {
		return w.Liveness, w.LivenessReason
	}
	if w.Overloaded {
		return smgv1.Veto_VETO_OVERLOAD, w.OverloadReason
	}
	return smgv1.Veto_VETO_UNSPECIFIED, ""
}

// Presumed returns a copy with the soft state of a worker nobody has judged
// yet under a new leader: Ready, no load, no veto, no shares (the fail-open
// direction), until its first probe or report says otherwise.
func (w *Worker) Presumed() *Worker {
	return &Worker{Registered: w.Registered, State: State{Health: HealthHealthy, ContactSeq: w.ContactSeq}}
}

// Clone returns a shallow copy to modify before Insert.
func (w *Worker) Clone() *Worker { return w.CloneInto(new(Worker)) }

// CloneInto is Clone into c, a record the caller allocated and no one else
// holds (never one that was stored), and returns c.
func (w *Worker) CloneInto(c *Worker) *Worker {
	*c = *w
	return c
}

// Job is a registration attempt (create or replace).
type Job struct {
	WorkerID  string
	URL       string
	Kind      string // create, replace
	State     string // pending, processing, done, failed
	Message   string
	UpdatedAt time.Time
	Spec      *smgv1.WorkerSpec
	// Token names this attempt, so that a later change of an older attempt
	// (on this replica or another) is recognised as superseded.
	Token string
}

// tables are the registry's state as one commit leaves it: a transaction
// writes its own copy, a snapshot reads a committed one.
type tables struct {
	workers *tree[*Worker] // by id; a load report (the hot path) writes it
	urls    *tree[*urlEntry]
	jobs    *tree[*Job] // by worker id
}

// Change is one committed change to a worker.
type Change struct {
	Revision uint64
	WorkerID string
	Deleted  bool
	// LoadOnly: only what loadOnly lists changed, so watchers may deliver
	// it at their own pace; any other change is a routing change.
	LoadOnly bool
}

// loadOnly reports whether b differs from a only where routers need not
// hear at once: its load report (and the overload reason quoting it), the
// prompt tokens ahead on it, or the agent that feeds it (a fleet of agents
// connecting sets it on every worker).
func loadOnly(a, b *Worker) bool {
	c := *a
	c.Load, c.LoadRevision, c.OverloadReason, c.AgentNode = b.Load, b.LoadRevision, b.OverloadReason, b.AgentNode
	c.PromptTokensAhead, c.AheadRevision = b.PromptTokensAhead, b.AheadRevision
	return sameVisible(&c, b)
}

// ring is a bounded history of changes, oldest first, revisions ascending.
type ring struct {
	buf     []Change
	head, n int
	evicted uint64 // highest revision with a change no longer retained
}

func newRing(capacity int) ring { return ring{buf: make([]Change, capacity)} }

func (h *ring) add(c Change) {
	if h.n == len(h.buf) {
		h.evicted = max(h.evicted, h.buf[h.head].Revision)
		h.buf[h.head] = c
		h.head = (h.head + 1) % len(h.buf)
		return
	}
	h.buf[(h.head+h.n)%len(h.buf)] = c
	h.n++
}

func (h *ring) at(i int) Change { return h.buf[(h.head+i)%len(h.buf)] }

// since returns the ids changed after rev, each once (latest state wins; a
// change is LoadOnly only if every merged change was), or ok=false when rev
// is older than the history retained. seen is an empty scratch index, left
// empty.
func (h *ring) since(rev uint64, seen map[string]int) ([]Change, bool) {
	if rev < h.evicted {
		return nil, false
	}
	// Revisions ascend: the first change after rev.
	lo := sort.Search(h.n, func(i int) bool { return h.at(i).Revision > rev })
	if lo == h.n {
		return nil, true
	}
	changes := make([]Change, 0, h.n-lo)
	if h.at(lo).Revision == h.at(h.n-1).Revision {
		// One commit's changes (a watcher keeping up): one per id already.
		for i := lo; i < h.n; i++ {
			changes = append(changes, h.at(i))
		}
		return changes, true
	}
	defer clear(seen)
	for i := lo; i < h.n; i++ {
		c := h.at(i)
		if j, dup := seen[c.WorkerID]; dup {
			c.LoadOnly = c.LoadOnly && changes[j].LoadOnly
			changes[j] = c
			continue
		}
		seen[c.WorkerID] = len(changes)
		changes = append(changes, c)
	}
	return changes, true
}

// DefaultHistory is how many revisions of changes are retained for resumes.
const DefaultHistory = 4096

// Registry is the state store.
type Registry struct {
	latest *latest // every worker's current record, for Get (latest.go)

	// mu serializes writers and guards cur and gen. Readers never
	// take it: a flush may hold it for milliseconds, and a thousand watch
	// streams reading behind it convoyed the whole control plane (make
	// bench-scale).
	mu    sync.Mutex
	cur   tables
	gen   uint64
	view  atomic.Pointer[Snapshot] // the latest commit's, published before anyone is woken
	epoch atomic.Pointer[string]

	// pub guards the fields below: a commit holds it only to publish (the
	// view, the history, the wake-ups), never while a transaction runs.
	pub      sync.Mutex
	revision uint64
	history  ring // the latest changes
	// routing holds the latest routing changes, so that watchers reach
	// further back than a flood of load reports leaves in history.
	routing ring
	// Changed's, MembershipChanged's and RoutingChanged's wake-ups, apart
	// so that loops tracking membership or pacing loads do not wake on
	// every flush.
	notify, members, routed signal
	seen                    map[string]int // ring.since's index, reused

	// changes (one per worker id, latest wins) and writes (nil: deleted)
	// are the running transaction's bookkeeping (under mu), reset after each.
	changes byID[Change]
	writes  byID[*Worker]
}

// New returns an empty registry under the given epoch (chosen at start, so that
// watchers can tell a restart from a resume).
func New(epoch string, historyCap int) *Registry {
	if historyCap <= 0 {
		historyCap = DefaultHistory
	}
	r := &Registry{latest: newLatest(), history: newRing(historyCap), routing: newRing(historyCap),
		notify: newSignal(), members: newSignal(), routed: newSignal(), seen: map[string]int{},
		cur: tables{&tree[*Worker]{}, &tree[*urlEntry]{}, &tree[*Job]{}}}
	r.epoch.Store(&epoch)
	r.view.Store(&Snapshot{tables: r.cur})
	return r
}

// Epoch identifies this registry's lifetime (or its leader's term).
func (r *Registry) Epoch() string { return *r.epoch.Load() }

// SetEpoch starts a new epoch: a replica that becomes leader names its term,
// so that a router never mixes revisions from two leaders.
func (r *Registry) SetEpoch(epoch string) { r.epoch.Store(&epoch) }

// Revision is the revision of the last commit.
func (r *Registry) Revision() uint64 { return r.view.Load().Revision }

// Changed returns a channel closed at the next commit.
func (r *Registry) Changed() <-chan struct{} { return r.take(&r.notify) }

// RoutingChanged returns a channel closed at the next commit with a routing
// change (one that is not LoadOnly).
func (r *Registry) RoutingChanged() <-chan struct{} { return r.take(&r.routed) }

// MembershipChanged returns a channel closed at the next commit that adds or
// removes a worker or changes its spec, model or health.
func (r *Registry) MembershipChanged() <-chan struct{} { return r.take(&r.members) }

// signal is a channel closed at the next commit of its kind.
type signal struct {
	ch    chan struct{}
	taken bool // handed out since the last commit: a commit closes it
}

func newSignal() signal { return signal{ch: make(chan struct{})} }

func (r *Registry) take(s *signal) <-chan struct{} {
	r.pub.Lock()
	defer r.pub.Unlock()
	s.taken = true
	return s.ch
}

// fire closes s if anyone holds it (caller holds pub).
func (s *signal) fire() {
	if s.taken {
		close(s.ch)
		*s = newSignal()
	}
}

// Txn is a write transaction. Insert and Delete record the workers changed.
type Txn struct {
	tables           // as this transaction leaves them, written in place once copied by gen
	r      *Registry // its latest records and this transaction's bookkeeping (changes, writes)
	gen    uint64
	rev    uint64 // the revision this transaction commits as
	// last is the stored record Get or Insert saw last, so that the usual
	// Get, Clone, Insert sequence looks the worker up once.
	last       *Worker
	membership bool // a worker came, went, or its spec, model or health changed
}

// Get returns a worker by id, or nil: this transaction's write (nil:
// deleted), else the latest committed record, both cheaper than a search
// of the tree.
func (t *Txn) Get(id string) *Worker {
	if t.last != nil && t.last.ID == id {
		return t.last
	}
	var w *Worker
	if i, mine := t.r.writes.find(id); mine {
		w = t.r.writes.vals[i]
	} else {
		w = t.r.latest.get(id)
	}
	if w != nil {
		t.last = w
	}
	return w
}

// Insert stores w (a fresh or cloned record, never a stored one) after
// deciding its verdicts from its evidence (decide). A change to the
// evidence alone keeps the record's revision and wakes nobody.
func (t *Txn) Insert(w *Worker) {
	old := t.Get(w.ID)
	decide(old, w)
	if old == nil || old.Spec.GetUrl() != w.Spec.GetUrl() {
		if old != nil {
			t.deleteURL(old)
		}
		t.urls = t.urls.put(&urlEntry{w.Spec.GetUrl(), w.ID}, t.gen)
	}
	if old == nil || old.Registered != w.Registered || old.Health != w.Health {
		t.membership = true
	}
	visible := old == nil || !sameVisible(old, w) // whatever the revisions
	w.Revision = t.rev
	if !visible {
		w.Revision = old.Revision
	}
	t.workers = t.workers.put(w, t.gen)
	t.last = w
	t.wrote(w.ID, w)
	if visible {
		t.mark(w.ID, false, old != nil && loadOnly(old, w))
	}
}

// Delete removes the worker with id.
func (t *Txn) Delete(id string) {
	if old := t.Get(id); old != nil {
		t.deleteURL(old)
		t.membership = true
	}
	t.last = nil
	t.workers = t.workers.del(id, t.gen)
	t.wrote(id, nil)
	t.mark(id, true, false)
}

// wrote records that id's record is now w (nil: deleted).
func (t *Txn) wrote(id string, w *Worker) {
	if i, ok := t.r.writes.find(id); ok {
		t.r.writes.vals[i] = w
		return
	}
	t.r.writes.add(id, w)
}

// deleteURL drops w's URL entry if it still points at w.
func (t *Txn) deleteURL(w *Worker) {
	if e := t.urls.get(w.Spec.GetUrl()); e != nil && e.id == w.ID {
		t.urls = t.urls.del(e.url, t.gen)
	}
}

// PutJob stores a registration job (jobs are not part of the watched state).
func (t *Txn) PutJob(j *Job) { t.jobs = t.jobs.put(j, t.gen) }

// DeleteJob removes a worker's job.
func (t *Txn) DeleteJob(id string) { t.jobs = t.jobs.del(id, t.gen) }

// mark records a changed worker.
func (t *Txn) mark(id string, deleted, loadOnly bool) {
	if i, found := t.r.changes.find(id); found {
		c := &t.r.changes.vals[i]
		c.Deleted = deleted
		c.LoadOnly = c.LoadOnly && loadOnly
		return
	}
	t.r.changes.add(id, Change{Revision: t.rev, WorkerID: id, Deleted: deleted, LoadOnly: loadOnly})
}

// Update runs fn in a write transaction. When fn returns nil and changed any
// worker, the transaction commits under a new revision; otherwise it aborts.
func (r *Registry) Update(fn func(*Txn) error) (uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gen++
	t := &Txn{tables: r.cur, r: r, gen: r.gen, rev: r.revision + 1}
	defer r.changes.reset() // after the history took copies
	defer r.writes.reset()  // after latest took the records
	if err := fn(t); err != nil {
		return r.revision, err
	}
	r.cur = t.tables
	r.latest.set(r.writes.ids, r.writes.vals)
	// Publish, then wake: a reader takes its wake-up channel before its
	// view, so it either sees this commit or holds a channel closed below.
	// With no change routers see, the records may still have changed
	// (evidence): readers get them under the same revision.
	r.pub.Lock()
	defer r.pub.Unlock()
	if len(r.changes.ids) > 0 {
		r.revision = t.rev
	}
	r.view.Store(&Snapshot{Revision: r.revision, tables: r.cur})
	if len(r.changes.ids) == 0 {
		return r.revision, nil
	}
	routed := false
	for _, c := range r.changes.vals {
		r.history.add(c)
		if !c.LoadOnly {
			r.routing.add(c)
			routed = true
		}
	}
	if routed {
		r.routed.fire()
	}
	r.notify.fire()
	if t.membership {
		r.members.fire()
	}
	return r.revision, nil
}

// Snapshot is a consistent read view at one revision.
type Snapshot struct {
	Revision uint64
	tables
}

// Get returns the current record of a worker, or nil, without a snapshot:
// a map lookup, for the hot paths.
func (r *Registry) Get(id string) *Worker { return r.latest.get(id) }

// Handle returns id's handle, or nil when no worker has id.
func (r *Registry) Handle(id string) *Handle { return r.latest.maps.Load().find(id) }

// Snapshot returns a read view of the current state.
// A read view is shared by every reader of its revision (it is read-only).
func (r *Registry) Snapshot() *Snapshot { return r.view.Load() }

// The reads below are a snapshot's and a transaction's (which has a Get of
// its own, and reads its own writes).

// Get returns a worker by id, or nil.
func (tb *tables) Get(id string) *Worker { return tb.workers.get(id) }

// GetByURL returns a worker by URL, or nil.
func (tb *tables) GetByURL(url string) *Worker {
	if e := tb.urls.get(url); e != nil {
		return tb.workers.get(e.id)
	}
	return nil
}

// Workers returns every worker, ordered by id.
func (tb *tables) Workers() []*Worker { return tb.workers.list() }

// Job returns a worker's registration job, or nil.
func (tb *tables) Job(id string) *Job { return tb.jobs.get(id) }

// Jobs returns every retained job, ordered by worker id.
func (tb *tables) Jobs() []*Job { return tb.jobs.list() }

// ChangesSince returns the ids changed after rev (each once, latest state
// wins), or ok=false when rev is older than the retained history.
func (r *Registry) ChangesSince(rev uint64) (changes []Change, current uint64, ok bool) {
	return r.since(&r.history, rev)
}

// RoutingChangesSince is ChangesSince for routing changes only (LoadOnly
// changes left out), retained apart so that it reaches back as many routing
// changes whatever the rate of load reports.
func (r *Registry) RoutingChangesSince(rev uint64) (changes []Change, current uint64, ok bool) {
	return r.since(&r.routing, rev)
}

func (r *Registry) since(h *ring, rev uint64) ([]Change, uint64, bool) {
	r.pub.Lock()
	defer r.pub.Unlock()
	switch {
	case rev > r.revision:
		return nil, r.revision, false
	case rev == r.revision:
		return nil, r.revision, true
	}
	changes, ok := h.since(rev, r.seen)
	return changes, r.revision, ok
}
