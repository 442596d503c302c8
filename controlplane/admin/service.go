// Package admin serves WorkerService, the control plane's admin API, over gRPC
// and (through grpc-gateway) over REST at the spec's paths.
//
// It owns registration, update and removal of workers and their jobs; it
// writes specs, never verdicts, loads or evidence.
package admin

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/enginegrpc"
	"github.com/smg-project/smg/internal/workerurl"
)

// ThresholdResolver resolves a worker's overload block against the gateway
// thresholds; an error names the out-of-range field.
type ThresholdResolver func(block *smgv1.OverloadBlock) (judge.Thresholds, error)

// Options configure the admin service.
type Options struct {
	// APIKey, when set, guards every route but /loads.
	APIKey string
	// RegistrationTimeout bounds how long registration tries to reach an
	// engine (> 0: every caller sets it).
	RegistrationTimeout time.Duration
	// URL relaxes the worker URL rules (--allow-link-local-workers).
	URL workerurl.Options
	// AllowInsecureProviderLoopback accepts an external worker at a plain
	// http:// loopback URL (--provider-allow-insecure-loopback, for tests
	// against a local fake provider).
	AllowInsecureProviderLoopback bool
	// Routers (nil: none listed) lists the routers watching the control plane.
	Routers func() []*smgv1.RouterInfo
	// OnRemove (nil: none) runs with the old record after a worker is
	// removed or replaced (its metric series, its per-worker state).
	OnRemove func(old *registry.Worker)
	// Now is the clock (nil: time.Now).
	Now func() time.Time
	// Commit makes a Change durable and applies it to the registry,
	// returning the worker record it removed or replaced, if any; nil
	// applies it to the registry at once (in memory).
	Commit func(context.Context, *Change) (old *registry.Worker, err error)
	// GRPC configures the channels registration opens to grpc:// and
	// grpcs:// workers (their TLS).
	GRPC enginegrpc.Options
}

// Service implements smgv1.WorkerServiceServer.
type Service struct {
	smgv1.UnimplementedWorkerServiceServer

	reg     *registry.Registry
	opts    Options
	resolve ThresholdResolver
	client  *http.Client
	log     *slog.Logger
	ctx     context.Context // cancels background registrations at shutdown
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// New returns the service. client reaches the engines during registration.
func New(reg *registry.Registry, opts Options, resolve ThresholdResolver, client *http.Client, log *slog.Logger) *Service {
	ctx, cancel := context.WithCancel(context.Background())
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.OnRemove == nil {
		opts.OnRemove = func(*registry.Worker) {}
	}
	if opts.Commit == nil {
		opts.Commit = func(_ context.Context, c *Change) (*registry.Worker, error) { return ApplyChange(reg, resolve, c) }
	}
	return &Service{reg: reg, opts: opts, resolve: resolve, client: client, log: log, ctx: ctx, cancel: cancel}
}

// Close stops background registrations and waits for them.
func (s *Service) Close() {
	s.cancel()
	s.wg.Wait()
}

// WorkerID derives a worker's id from its URL, so that ids are stable across
// restarts and a re-registration of the same engine gets the same id.
func WorkerID(url string) string {
	sum := sha256.Sum256([]byte(url))
	return "w-" + hex.EncodeToString(sum[:6])
}

// accepted sets the REST status (202) and the Location of a change to
// worker id, and returns the location.
func accepted(ctx context.Context, id string) string {
	loc := "/workers/" + id
	_ = grpc.SetHeader(ctx, metadata.Pairs("x-http-code", "202", "location", loc))
	return loc
}

func (s *Service) CreateWorker(ctx context.Context, req *smgv1.CreateWorkerRequest) (*smgv1.CreateWorkerResponse, error) {
	spec, id, err := s.start(ctx, "", "create", req.GetSpec(), true)
	if err != nil {
		return nil, err
	}
	loc := accepted(ctx, id)
	return &smgv1.CreateWorkerResponse{Status: "accepted", WorkerId: id, Url: spec.GetUrl(), Location: loc,
		Message: "registration of worker " + id + " started; follow it at " + loc}, nil
}

// Submit validates a spec and starts its registration in the background; it
// is what POST /workers and the static --worker-urls both run.
func (s *Service) Submit(spec *smgv1.WorkerSpec) (string, error) {
	_, id, err := s.start(s.ctx, "", "create", spec, false)
	return id, err
}

// start validates spec (a copy, its URL in canonical form) and starts a
// registration job of kind in the background: "create" (the id is the
// URL's) or "replace" (of worker id). probe first refuses a URL that
// answers as smg (the API's calls).
func (s *Service) start(ctx context.Context, id, kind string, spec *smgv1.WorkerSpec, probe bool) (*smgv1.WorkerSpec, string, error) {
	if spec == nil {
		return nil, "", errBadRequest("url", "url is required")
	}
	spec = proto.CloneOf(spec)
	var err error
	if spec.GetProvider() == nil {
		err = normalizeSpec(spec, s.opts.URL)
	} else if err = normalizeProvider(spec, s.opts.URL, s.opts.AllowInsecureProviderLoopback); err == nil {
		err = validateProvider(spec)
	}
	if err == nil {
		err = validateSpec(spec)
	}
	if err == nil && probe {
		err = s.refuseSMG(ctx, spec)
	}
	if err != nil {
		return nil, "", err
	}
	if kind == "create" {
		id = WorkerID(spec.GetUrl())
	}
	b, err := proto.Marshal(spec)
	if err != nil {
		return nil, "", errBadRequest("spec", "spec: %v", err)
	}
	c := &Change{Op: OpSubmit, WorkerID: id, Token: rand.Text(), Kind: kind, Spec: b, At: s.opts.Now()}
	if _, err := s.opts.Commit(ctx, c); err != nil {
		return nil, "", err
	}
	job := s.reg.Snapshot().Job(id)
	if job == nil || job.Token != c.Token {
		// Applied, then superseded already: run nothing, the later change wins.
		return nil, "", errInProgress(id)
	}
	s.startRegistration(job)
	return spec, id, nil
}

func (s *Service) ReplaceWorker(ctx context.Context, req *smgv1.ReplaceWorkerRequest) (*smgv1.ReplaceWorkerResponse, error) {
	spec, id, err := s.start(ctx, req.GetWorkerId(), "replace", req.GetSpec(), true)
	if err != nil {
		return nil, err
	}
	loc := accepted(ctx, id)
	return &smgv1.ReplaceWorkerResponse{Status: "accepted", WorkerId: id, Url: spec.GetUrl(), Location: loc,
		Message: "replacement of worker " + id + " started; follow it at " + loc}, nil
}

// Replace validates a complete spec and starts re-registering worker id with
// it in the background; it is what PUT /workers/{id} runs, and service
// discovery when a pod's role or annotations change.
func (s *Service) Replace(id string, spec *smgv1.WorkerSpec) error {
	_, _, err := s.start(s.ctx, id, "replace", spec, false)
	return err
}

func (s *Service) UpdateWorker(ctx context.Context, req *smgv1.UpdateWorkerRequest) (*smgv1.UpdateWorkerResponse, error) {
	u := req.GetUpdate()
	if u == nil {
		u = &smgv1.WorkerUpdate{}
	}
	if err := validateUpdate(u); err != nil {
		return nil, err
	}
	id := req.GetWorkerId()
	msg := "worker " + id + " updated"
	if u.GetOverload() != nil {
		// The spec: PATCH cannot change the block and keeps it as is; the
		// rest of the patch applies.
		u = proto.CloneOf(u)
		u.Overload = nil
		msg += "; the overload block was kept as is (PATCH cannot change it: send the complete spec with PUT /workers/{worker_id})"
	}
	b, err := proto.Marshal(u)
	if err != nil {
		return nil, errBadRequest("update", "update: %v", err)
	}
	if _, err := s.opts.Commit(ctx, &Change{Op: OpUpdate, WorkerID: id, Update: b, At: s.opts.Now()}); err != nil {
		return nil, err
	}
	var url string
	if w := s.reg.Get(id); w != nil {
		url = w.Spec.GetUrl()
	}
	loc := accepted(ctx, id)
	return &smgv1.UpdateWorkerResponse{Status: "accepted", WorkerId: id, Url: url, Location: loc, Message: msg}, nil
}

func (s *Service) DeleteWorker(ctx context.Context, req *smgv1.DeleteWorkerRequest) (*smgv1.DeleteWorkerResponse, error) {
	id := req.GetWorkerId()
	url, err := s.remove(ctx, id)
	if err != nil {
		return nil, err
	}
	loc := accepted(ctx, id)
	return &smgv1.DeleteWorkerResponse{Status: "accepted", WorkerId: id, Url: url, Location: loc, Message: "worker " + id + " removed"}, nil
}

// Remove deletes a worker, or cancels its registration under way, without
// the admin key: the control plane's own clean-up (the workers of an agent
// gone for good, of a discovered pod gone).
func (s *Service) Remove(id string) error {
	_, err := s.remove(s.ctx, id)
	return err
}

func (s *Service) remove(ctx context.Context, id string) (string, error) {
	job := s.reg.Snapshot().Job(id)
	old, err := s.opts.Commit(ctx, &Change{Op: OpDelete, WorkerID: id, At: s.opts.Now()})
	if err != nil {
		return "", err
	}
	if old == nil { // a registration under way, cancelled
		url := ""
		if job != nil {
			url = job.URL
		}
		s.log.Info("Worker registration cancelled", "worker_id", id, "url", url)
		return url, nil
	}
	s.opts.OnRemove(old)
	s.log.Info("Worker removed", "worker_id", id, "url", old.Spec.GetUrl())
	return old.Spec.GetUrl(), nil
}

func (s *Service) GetWorker(ctx context.Context, req *smgv1.GetWorkerRequest) (*smgv1.GetWorkerResponse, error) {
	snap := s.reg.Snapshot()
	id := req.GetWorkerId()
	job := snap.Job(id)
	if w := snap.Get(id); w != nil {
		return &smgv1.GetWorkerResponse{Worker: WorkerView(w, job)}, nil
	}
	if job != nil && s.jobVisible(job) {
		if job.State == "failed" {
			return nil, errNotFoundFailed(id, job.Message)
		}
		// Registration still running: show its progress on the worker-to-be.
		return &smgv1.GetWorkerResponse{Worker: &smgv1.Worker{WorkerId: id, Spec: redacted(job.Spec), Health: string(registry.HealthPending), JobStatus: jobStatus(job)}}, nil
	}
	return nil, errNotFound(id)
}

func (s *Service) ListWorkers(ctx context.Context, req *smgv1.ListWorkersRequest) (*smgv1.ListWorkersResponse, error) {
	snap := s.reg.Snapshot()
	resp := &smgv1.ListWorkersResponse{}
	for _, w := range snap.Workers() {
		if m := req.GetModel(); m != "" && w.Model != m && !slices.Contains(w.Spec.GetModels(), m) {
			continue
		}
		resp.Workers = append(resp.Workers, WorkerView(w, snap.Job(w.ID)))
	}
	resp.Total = int32(len(resp.Workers))
	return resp, nil
}

func (s *Service) GetLoads(ctx context.Context, _ *smgv1.GetLoadsRequest) (*smgv1.GetLoadsResponse, error) {
	snap := s.reg.Snapshot()
	resp := &smgv1.GetLoadsResponse{}
	for _, w := range snap.Workers() {
		veto, _ := w.Veto()
		resp.Workers = append(resp.Workers, &smgv1.WorkerLoad{
			WorkerId: w.ID, Url: w.Spec.GetUrl(), Model: w.Model, WorkerType: w.Type,
			EngineLoad: w.Load, Overloaded: w.Overloaded, Vetoed: veto != smgv1.Veto_VETO_UNSPECIFIED,
		})
	}
	return resp, nil
}

func (s *Service) ListJobs(ctx context.Context, _ *smgv1.ListJobsRequest) (*smgv1.ListJobsResponse, error) {
	jobs := s.reg.Snapshot().Jobs()
	slices.SortFunc(jobs, func(a, b *registry.Job) int { return b.UpdatedAt.Compare(a.UpdatedAt) }) // newest first
	resp := &smgv1.ListJobsResponse{}
	for _, j := range jobs {
		if s.jobVisible(j) {
			resp.Jobs = append(resp.Jobs, &smgv1.Job{WorkerId: j.WorkerID, Url: j.URL, Kind: j.Kind, Status: jobStatus(j)})
		}
	}
	return resp, nil
}

func (s *Service) ListRouters(ctx context.Context, _ *smgv1.ListRoutersRequest) (*smgv1.ListRoutersResponse, error) {
	resp := &smgv1.ListRoutersResponse{Revision: s.reg.Revision()}
	if s.opts.Routers != nil {
		resp.Routers = s.opts.Routers()
	}
	return resp, nil
}

// jobRetention is how long a finished registration job stays visible.
const jobRetention = 10 * time.Minute

// jobVisible hides finished jobs once their retention has passed.
func (s *Service) jobVisible(j *registry.Job) bool {
	return running(j) || s.opts.Now().Sub(j.UpdatedAt) < jobRetention
}

func jobStatus(j *registry.Job) *smgv1.JobStatus {
	if j == nil {
		return nil
	}
	return &smgv1.JobStatus{State: j.State, Message: j.Message, UpdatedAt: timestamppb.New(j.UpdatedAt)}
}

// WorkerView renders a registry record for the admin API. An external
// worker's spill shares are the parts of its spill-over budget the routers
// hold (the window allocator's, in millionths).
func WorkerView(w *registry.Worker, job *registry.Job) *smgv1.Worker {
	veto, reason := w.Veto()
	liveness := ""
	if w.Liveness != smgv1.Veto_VETO_UNSPECIFIED {
		liveness = VetoWord(w.Liveness)
	}
	var adm *smgv1.AdmissionWindow
	if a := w.Admission; a != nil {
		adm = &smgv1.AdmissionWindow{Window: a.Window, Source: a.Source, Queue: a.Queue, Learned: float64(a.Learned),
			LearnedBy: a.LearnedBy, Shares: w.WindowShare}
	}
	if b := w.Budget; b != nil {
		if adm == nil {
			adm = &smgv1.AdmissionWindow{}
		}
		adm.TokenBudget, adm.TokenSource, adm.TokenLearned, adm.TokenShares = b.Tokens, b.Source, b.Learned, w.TokenShare
	}
	kind, spill := "engine", map[string]int64(nil)
	if w.External() {
		kind, spill = "external", w.WindowShare
	}
	return &smgv1.Worker{
		Admission:  adm,
		WorkerId:   w.ID,
		Spec:       redacted(w.Spec),
		Thresholds: &smgv1.Thresholds{WaitingRequests: int32(w.Thresholds.WaitingRequests), TokenUsage: w.Thresholds.TokenUsage},
		Health:     string(w.Health),
		Ready:      w.Ready(),
		EngineLoad: w.Load,
		Model:      w.Model,
		Verdict: &smgv1.Verdict{
			Vetoed: veto != smgv1.Veto_VETO_UNSPECIFIED, Veto: VetoWord(veto), Reason: reason,
			Overloaded: w.Overloaded, OverloadReason: w.OverloadReason,
			Liveness: liveness, LivenessReason: w.LivenessReason,
		},
		JobStatus:   jobStatus(job),
		AgentNode:   w.AgentNode,
		Kind:        kind,
		SpillShares: spill,
	}
}

// VetoWord is how answers show a veto: "none", "overload", "unreachable"
// or "wedged".
func VetoWord(v smgv1.Veto) string {
	if v == smgv1.Veto_VETO_UNSPECIFIED {
		return "none"
	}
	return strings.ToLower(strings.TrimPrefix(v.String(), "VETO_"))
}

// redacted hides in answers a spec's api_key (the engine's secret: GET
// /workers may be open when no admin key is set) and the values of a
// provider's extra headers (one may carry a credential); the provider's key
// reference is shown: it says where the key is, not what it is.
func redacted(spec *smgv1.WorkerSpec) *smgv1.WorkerSpec {
	if spec.GetApiKey() == "" && len(spec.GetProvider().GetHeaders()) == 0 {
		return spec
	}
	c := proto.CloneOf(spec)
	if c.ApiKey != "" {
		c.ApiKey = "<redacted>"
	}
	for k := range c.GetProvider().GetHeaders() {
		c.Provider.Headers[k] = "<redacted>"
	}
	return c
}
