package judge

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
)

// The gateway overload flags, as the spec names them, and their defaults.
const (
	FlagWaitingRequests    = "worker-overload-waiting-requests"
	FlagTokenUsage         = "worker-overload-token-usage"
	FlagDisable            = "disable-worker-overload-protection"
	DefaultWaitingRequests = 8
	DefaultTokenUsage      = 0.8
)

// GatewayThresholds are the gateway-wide overload flags.
type GatewayThresholds struct {
	WaitingRequests int     // --worker-overload-waiting-requests, integer >= 1
	TokenUsage      float64 // --worker-overload-token-usage, number in (0, 1]
	Disabled        bool    // --disable-worker-overload-protection
}

// DefaultGatewayThresholds returns the spec's defaults: protection on, 8, 0.8.
func DefaultGatewayThresholds() GatewayThresholds {
	return GatewayThresholds{WaitingRequests: DefaultWaitingRequests, TokenUsage: DefaultTokenUsage}
}

// AddFlags registers the three gateway flags on fs, defaulting to g's values.
func (g *GatewayThresholds) AddFlags(fs *flag.FlagSet) {
	fs.IntVar(&g.WaitingRequests, FlagWaitingRequests, g.WaitingRequests,
		"take a worker out of routing while its load report shows at least this many waiting requests, summed over DP ranks (integer >= 1)")
	fs.Float64Var(&g.TokenUsage, FlagTokenUsage, g.TokenUsage,
		"take a worker out of routing while its mean KV token usage over DP ranks is at least this fraction (number in (0, 1])")
	fs.BoolVar(&g.Disabled, FlagDisable, g.Disabled,
		"turn off the gateway-wide overload thresholds; a worker's own overload block still applies")
}

// Validate reports the first out-of-range flag, naming it.
func (g GatewayThresholds) Validate() error {
	if g.WaitingRequests < 1 {
		return fmt.Errorf("--%s must be an integer >= 1, got %d", FlagWaitingRequests, g.WaitingRequests)
	}
	if !validTokenUsage(g.TokenUsage) {
		return fmt.Errorf("--%s must be a number in (0, 1], got %s", FlagTokenUsage, formatFloat(g.TokenUsage))
	}
	return nil
}

// Block is a worker spec's optional overload block; a nil field was omitted.
type Block struct {
	WaitingRequests *int64   `json:"waiting_requests,omitempty"`
	TokenUsage      *float64 `json:"token_usage,omitempty"`
}

// Validate reports the out-of-range fields as the worker spec names them
// (an error fails that worker's registration).
func (b Block) Validate() error {
	var errs []error
	if b.WaitingRequests != nil && *b.WaitingRequests < 1 {
		errs = append(errs, fmt.Errorf("overload.waiting_requests must be >= 1, got %d", *b.WaitingRequests))
	}
	if b.TokenUsage != nil && !validTokenUsage(*b.TokenUsage) {
		errs = append(errs, fmt.Errorf("overload.token_usage must be in (0, 1], got %s", formatFloat(*b.TokenUsage)))
	}
	return errors.Join(errs...)
}

// Thresholds are one worker's resolved ceilings. A zero field means "no
// threshold" for that signal, so it never trips.
type Thresholds struct {
	WaitingRequests int64
	TokenUsage      float64
}

// Resolve returns the thresholds of a worker with block b (nil: none,
// validated): a field set in the block wins, even under
// --disable-worker-overload-protection; an omitted one falls back to the
// gateway value, or to none when the gateway switch is off.
func (g GatewayThresholds) Resolve(b *Block) Thresholds {
	var t Thresholds
	if !g.Disabled {
		t = Thresholds{WaitingRequests: int64(g.WaitingRequests), TokenUsage: g.TokenUsage}
	}
	if b == nil {
		return t
	}
	if b.WaitingRequests != nil {
		t.WaitingRequests = *b.WaitingRequests
	}
	if b.TokenUsage != nil {
		t.TokenUsage = *b.TokenUsage
	}
	return t
}

// Check scores one load report: overloaded when either signal is at or
// above its threshold. waitingSum is num_waiting_reqs summed over DP ranks,
// tokenUsageMean token_usage averaged over them (a field left out reads 0
// and never trips). No hysteresis; no allocation.
func Check(waitingSum int64, tokenUsageMean float64, t Thresholds) (overloaded bool, reason OverloadReason) {
	reason = OverloadReason{
		Waiting: waitingSum, WaitingThreshold: t.WaitingRequests,
		TokenUsage: tokenUsageMean, TokenUsageThreshold: t.TokenUsage,
	}
	reason.WaitingTripped = t.WaitingRequests > 0 && waitingSum >= t.WaitingRequests
	reason.TokenUsageTripped = t.TokenUsage > 0 && tokenUsageMean >= t.TokenUsage
	return reason.WaitingTripped || reason.TokenUsageTripped, reason
}

// OverloadReason says why Check decided as it did: plain data, formatted by
// String only for logs.
type OverloadReason struct {
	WaitingTripped    bool
	TokenUsageTripped bool

	Waiting             int64
	WaitingThreshold    int64 // 0: none
	TokenUsage          float64
	TokenUsageThreshold float64 // 0: none
}

// String reads like "waiting_requests 9 >= 8" or
// "waiting_requests 3 < 8, token_usage 0.5 < 0.8".
func (r OverloadReason) String() string {
	if r.WaitingThreshold <= 0 && r.TokenUsageThreshold <= 0 {
		return "no thresholds"
	}
	tripped := r.WaitingTripped || r.TokenUsageTripped
	var parts []string
	if r.WaitingThreshold > 0 && (!tripped || r.WaitingTripped) {
		parts = append(parts, "waiting_requests "+itoa(r.Waiting)+compare(r.WaitingTripped)+itoa(r.WaitingThreshold))
	}
	if r.TokenUsageThreshold > 0 && (!tripped || r.TokenUsageTripped) {
		parts = append(parts, "token_usage "+formatFloat(r.TokenUsage)+compare(r.TokenUsageTripped)+formatFloat(r.TokenUsageThreshold))
	}
	return strings.Join(parts, ", ")
}

func compare(tripped bool) string {
	if tripped {
		return " >= "
	}
	return " < "
}

// validTokenUsage is (0, 1]; NaN fails.
func validTokenUsage(v float64) bool { return v > 0 && v <= 1 }

func formatFloat(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
