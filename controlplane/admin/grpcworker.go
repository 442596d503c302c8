package admin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/enginegrpc"
)

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
