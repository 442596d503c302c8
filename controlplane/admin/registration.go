package admin

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/enginegrpc"
	"github.com/smg-project/smg/internal/identity"
)

// startRegistration runs a job in the background: resolve the overload
// block, reach the engine (discovering its model), then add or replace the
// worker. A failure leaves the registry as it was and the job failed.
func (s *Service) startRegistration(job *registry.Job) {
	s.wg.Go(func() {
		s.setJob(job, "processing", "contacting the engine")
		if err := s.register(job); err != nil {
			s.log.Warn("Worker registration failed", "worker_id", job.WorkerID, "url", job.URL, "reason", err.Error())
			s.setJob(job, "failed", err.Error())
		}
	})
}

func (s *Service) setJob(job *registry.Job, state, msg string) {
	c := &Change{Op: OpJob, WorkerID: job.WorkerID, Token: job.Token, State: state, Message: msg, At: s.opts.Now()}
	if _, err := s.opts.Commit(s.ctx, c); err != nil {
		s.log.Warn("Registration job state not stored", "worker_id", job.WorkerID, "state", state, "reason", err.Error())
	}
}

func (s *Service) register(job *registry.Job) error {
	spec := job.Spec
	if _, err := s.resolve(spec.GetOverload()); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.opts.RegistrationTimeout)
	defer cancel()
	var model string
	var stored *smgv1.WorkerSpec
	var err error
	switch {
	case spec.GetProvider() != nil:
		// A provider is never contacted by the control plane: its model is
		// the spec's and its key is read where requests are sent.
		model, stored = spec.GetModelId(), spec
	case enginegrpc.IsGRPC(spec.GetUrl()):
		if model, stored, err = s.reachGRPC(ctx, spec); err != nil {
			return err
		}
	default:
		if model, err = s.reachEngine(ctx, spec); err != nil {
			return err
		}
		stored = s.withBootstrapPort(ctx, spec)
	}
	b, err := proto.Marshal(stored)
	if err != nil {
		return err
	}
	old, err := s.opts.Commit(s.ctx, &Change{Op: OpRegister, WorkerID: job.WorkerID, Token: job.Token, Spec: b, Model: model, At: s.opts.Now()})
	if err != nil {
		return err
	}
	if old != nil {
		s.opts.OnRemove(old) // the replaced record's series and state go
	}
	s.log.Info("Worker registered", "worker_id", job.WorkerID, "url", spec.GetUrl(), "model", model, "kind", job.Kind)
	return nil
}

// ResumeJobs restarts every registration still pending or processing: a
// new leader finishes the jobs its predecessor accepted.
func (s *Service) ResumeJobs() {
	for _, j := range s.reg.Snapshot().Jobs() {
		if running(j) {
			s.log.Info("Resuming a registration accepted before the leader changed", "worker_id", j.WorkerID, "url", j.URL)
			s.startRegistration(j)
		}
	}
}

func workerType(spec *smgv1.WorkerSpec) string { return cmp.Or(spec.GetWorkerType(), "regular") }

// smgProbeTimeout bounds the synchronous check that a URL is not an smg port.
const smgProbeTimeout = 2 * time.Second

// refuseSMG answers 400 when url answers as an smg router or control plane:
// a worker there would send every request around a loop. An engine that does
// not answer yet passes; registration checks again once it answers.
func (s *Service) refuseSMG(ctx context.Context, spec *smgv1.WorkerSpec) error {
	url := spec.GetUrl()
	if enginegrpc.IsGRPC(url) || spec.GetProvider() != nil {
		// smg's ports speak HTTP: a gRPC registration there fails as
		// "answers HTTP"; a provider is never contacted by the control plane.
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, smgProbeTimeout)
	defer cancel()
	if c, _ := identity.Probe(ctx, s.client, url); c != "" {
		return errBadRequest("url", "url %s answers as an smg %s, not an engine: registering it would make a routing loop", url, c)
	}
	return nil
}

// reachEngine asks the engine for its models until it answers or ctx ends.
// A model id given in the spec needs only an answer; otherwise the first
// model the engine lists is the worker's.
func (s *Service) reachEngine(ctx context.Context, spec *smgv1.WorkerSpec) (model string, err error) {
	err = s.retry(ctx, "engine "+spec.GetUrl(), func() (bool, error) {
		m, err := DiscoverModel(ctx, s.client, spec.GetUrl(), spec.GetApiKey())
		if err != nil && (spec.GetModelId() == "" || !errors.Is(err, errNoModel)) {
			return false, err
		}
		// An smg router answers /v1/models too: a worker there is a routing loop.
		if c, _ := identity.Probe(ctx, s.client, spec.GetUrl()); c != "" {
			return true, fmt.Errorf("url %s answers as an smg %s, not an engine: registering it would make a routing loop", spec.GetUrl(), c)
		}
		model = cmp.Or(spec.GetModelId(), m)
		return true, nil
	})
	return model, err
}

// retry runs try every half second until it is done or ctx ends; then the
// error says what was not reachable within the registration timeout, and
// the last try's error.
func (s *Service) retry(ctx context.Context, what string, try func() (done bool, err error)) error {
	for {
		done, err := try()
		if done {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not reachable within %s: %v", what, s.opts.RegistrationTimeout, err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

var errNoModel = errors.New("the engine answered /v1/models without a model")

// DiscoverModel returns the first model id the engine lists at /v1/models.
func DiscoverModel(ctx context.Context, client *http.Client, baseURL, apiKey string) (string, error) {
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	code, err := getJSON(ctx, client, strings.TrimRight(baseURL, "/")+"/v1/models", apiKey, &list)
	switch {
	case code == 0:
		return "", err
	case code != http.StatusOK:
		return "", fmt.Errorf("%w: status %d", errNoModel, code)
	case err != nil || len(list.Data) == 0 || list.Data[0].ID == "":
		return "", errNoModel
	}
	return list.Data[0].ID, nil
}

// getJSON GETs url from an engine, with its api_key when it has one, and
// decodes a 200 answer (at most 1 MiB) into v. code is 0 when no answer
// was read, with the error; else the answer's status, with the decoding's.
func getJSON(ctx context.Context, client *http.Client, url, apiKey string, v any) (code int, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, nil
	}
	return resp.StatusCode, json.Unmarshal(body, v)
}

// bootstrapProbeTimeout bounds the /server_info read of one registration.
const bootstrapProbeTimeout = 2 * time.Second

// withBootstrapPort returns spec with the bootstrap port of a prefill
// engine registered without one, read from what SGLang reports at
// /server_info (/get_server_info on older releases) as
// disaggregation_bootstrap_port. Without an answer the spec is returned as
// it is, and routers send bootstrap_port null (the engine's default).
func (s *Service) withBootstrapPort(ctx context.Context, spec *smgv1.WorkerSpec) *smgv1.WorkerSpec {
	if spec.GetWorkerType() != "prefill" || spec.BootstrapPort != nil {
		return spec
	}
	ctx, cancel := context.WithTimeout(ctx, bootstrapProbeTimeout)
	defer cancel()
	for _, path := range []string{"/server_info", "/get_server_info"} {
		var info struct {
			Port *int64 `json:"disaggregation_bootstrap_port"`
		}
		code, err := getJSON(ctx, s.client, strings.TrimRight(spec.GetUrl(), "/")+path, spec.GetApiKey(), &info)
		if code == http.StatusOK && err == nil && info.Port != nil && *info.Port >= 1 && *info.Port <= 65535 {
			c := proto.CloneOf(spec)
			c.BootstrapPort = proto.Int32(int32(*info.Port))
			return c
		}
	}
	return spec
}

// grpcAttemptTimeout bounds one attempt to read a gRPC worker, so that a
// servicer that never answers is retried (and then reported) within the
// registration timeout.
const grpcAttemptTimeout = 5 * time.Second

// reachGRPC reads a gRPC worker's model (GetModelInfo), window, DP size and
// PD role (GetServerInfo, GetLoads) and checks its tokenizer (GetTokenizer),
// retrying while the engine is not reachable yet. It returns the model and
// the spec to store (a prefill engine's bootstrap port filled in).
func (s *Service) reachGRPC(ctx context.Context, spec *smgv1.WorkerSpec) (string, *smgv1.WorkerSpec, error) {
	c, err := enginegrpc.New(spec.GetUrl(), s.opts.GRPC)
	if err != nil {
		return "", nil, err
	}
	defer c.Close()
	var info enginegrpc.Info
	err = s.retry(ctx, "gRPC worker "+spec.GetUrl(), func() (bool, error) { return s.readGRPC(ctx, c, &info) })
	if err != nil {
		return "", nil, err
	}
	stored := spec
	if spec.GetWorkerType() == "prefill" && spec.BootstrapPort == nil && info.BootstrapPort > 0 {
		stored = proto.CloneOf(spec)
		stored.BootstrapPort = proto.Int32(int32(info.BootstrapPort))
	}
	return cmp.Or(spec.GetModelId(), info.Model), stored, nil
}

// readGRPC is one attempt; done unless a retry may fix its error.
func (s *Service) readGRPC(ctx context.Context, c *enginegrpc.Client, info *enginegrpc.Info) (done bool, err error) {
	actx, cancel := context.WithTimeout(ctx, grpcAttemptTimeout)
	*info, err = c.Info(actx)
	cancel()
	if err != nil {
		transient := enginegrpc.IsConnectionFailure(err) || status.Code(err) == codes.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded)
		return enginegrpc.AnswersHTTP(err) || !transient, err
	}
	// The archive may be large: the registration's own deadline bounds it.
	if _, err := c.Tokenizer(ctx, enginegrpc.MaxTokenizerBytes); err != nil {
		if enginegrpc.IsConnectionFailure(err) && !enginegrpc.AnswersHTTP(err) {
			return false, err
		}
		return true, fmt.Errorf("gRPC worker %s: tokenizer unusable: %w", c.URL(), err)
	}
	return true, nil
}

// Discover returns the model the engine at url serves: GetModelInfo for a
// gRPC worker, else the first model at /v1/models.
func (s *Service) Discover(ctx context.Context, url string) (string, error) {
	if !enginegrpc.IsGRPC(url) {
		return DiscoverModel(ctx, s.client, url, "")
	}
	c, err := enginegrpc.New(url, s.opts.GRPC)
	if err != nil {
		return "", err
	}
	defer c.Close()
	info, err := c.Info(ctx)
	return info.Model, err
}
