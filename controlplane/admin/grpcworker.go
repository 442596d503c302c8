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
	err = s.retry(ctx, "gRPC worker "+spec.GetUrl(), func() (bool, error) {
		info, err = s.readGRPC(ctx, c)
		var pe permanentErr
		if errors.As(err, &pe) {
			return true, pe.err
		}
		return err == nil, err
	})
	if err != nil {
		return "", nil, err
	}
	stored := spec
	if spec.GetWorkerType() == "prefill" && spec.BootstrapPort == nil && info.BootstrapPort > 0 {
		stored = proto.Clone(spec).(*smgv1.WorkerSpec)
		stored.BootstrapPort = proto.Int32(int32(info.BootstrapPort))
	}
	return cmp.Or(spec.GetModelId(), info.Model), stored, nil
}

// readGRPC is one attempt; an error that a retry cannot fix is a permanentErr.
func (s *Service) readGRPC(ctx context.Context, c *enginegrpc.Client) (enginegrpc.Info, error) {
	actx, cancel := context.WithTimeout(ctx, grpcAttemptTimeout)
	info, err := c.Info(actx)
	cancel()
	if err != nil {
		if enginegrpc.AnswersHTTP(err) || !(enginegrpc.IsConnectionFailure(err) || status.Code(err) == codes.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded)) {
			return info, permanent(err)
		}
		return info, err
	}
	// The archive may be large: the registration's own deadline bounds it.
	if _, err := c.Tokenizer(ctx, enginegrpc.MaxTokenizerBytes); err != nil {
		if enginegrpc.IsConnectionFailure(err) && !enginegrpc.AnswersHTTP(err) {
			return info, err
		}
		return info, permanent(fmt.Errorf("gRPC worker %s: tokenizer unusable: %w", c.URL(), err))
	}
	return info, nil
}

// permanentErr carries a failure no retry can fix.
type permanentErr struct{ err error }

func (e permanentErr) Error() string { return e.err.Error() }
func permanent(err error) error      { return permanentErr{err} }

// DiscoverGRPCModel returns the model a gRPC worker serves (GetModelInfo).
func DiscoverGRPCModel(ctx context.Context, url string, o enginegrpc.Options) (string, error) {
	c, err := enginegrpc.New(url, o)
	if err != nil {
		return "", err
	}
	defer c.Close()
	info, err := c.Info(ctx)
	return info.Model, err
}
