package admin

import (
	"context"
	"net/http"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

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
		if port, ok := readBootstrapPort(ctx, s.client, strings.TrimRight(spec.GetUrl(), "/")+path, spec.GetApiKey()); ok {
			c := proto.Clone(spec).(*smgv1.WorkerSpec)
			c.BootstrapPort = &port
			return c
		}
	}
	return spec
}

// readBootstrapPort reads disaggregation_bootstrap_port from one server-info
// route; ok only for a port number.
func readBootstrapPort(ctx context.Context, client *http.Client, url, apiKey string) (int32, bool) {
	var info struct {
		Port *int64 `json:"disaggregation_bootstrap_port"`
	}
	if code, err := getJSON(ctx, client, url, apiKey, &info); code != http.StatusOK || err != nil || info.Port == nil ||
		*info.Port < 1 || *info.Port > 65535 {
		return 0, false
	}
	return int32(*info.Port), true
}
