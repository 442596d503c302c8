package enginegrpc

import (
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
)

// MaxMessageFlag is the flag that sets the receive limit of gRPC workers'
// messages, in MiB, in every process that reads them (control plane, agent).
const MaxMessageFlag = "grpc-engine-max-message-mib"

// MaxMessageUsage is MaxMessageFlag's help.
const MaxMessageUsage = "largest message, in MiB, read from a gRPC worker (1-1024; a larger one fails its call, logged and counted in smg_grpc_engine_oversized_messages_total)"

// DefaultMaxMessageMiB is the receive limit's default, DefaultMaxRecvMsgSize in MiB.
const DefaultMaxMessageMiB = DefaultMaxRecvMsgSize >> 20

// maxMessageMiB bounds the flag: gRPC takes the limit as an int, and a
// single engine message of a GiB is already absurd.
const maxMessageMiB = 1024

// CheckMaxMessageMiB validates MaxMessageFlag's value.
func CheckMaxMessageMiB(mib int) error {
	if mib < 1 || mib > maxMessageMiB {
		return fmt.Errorf("--%s must be 1-%d, got %d", MaxMessageFlag, maxMessageMiB, mib)
	}
	return nil
}

// OversizedCounter registers smg_grpc_engine_oversized_messages_total on
// reg and returns the Options.Oversized hook that counts and logs each
// message refused over a limit of limitMiB.
func OversizedCounter(reg prometheus.Registerer, log *slog.Logger, limitMiB int) (func(url string, err error), error) {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "smg_grpc_engine_oversized_messages_total",
		Help: "Messages from gRPC workers refused for exceeding the receive limit (--" + MaxMessageFlag + ")."})
	if reg != nil {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return func(url string, err error) {
		c.Inc()
		log.Warn("gRPC worker sent a message over the receive limit", "url", url, "limit_mib", limitMiB, "error", err)
	}, nil
}
