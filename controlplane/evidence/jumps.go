package evidence

import (
	"sync"
	"time"
)

// A router's report that moves a worker's prompt tokens ahead by
// AheadJumpTokens or more (about 25 ms of prefill), up or down, is a jump:
// until they hear of it the other routers mispredict every request they
// send there, so the worker goes to them at once instead of on the load
// grid (--watch-load-interval). Each such send reaches every router, so
// at most AheadJumpsPerSec go at once over the fleet (a burst of as many);
// the rest wait for the grid.
const (
	AheadJumpTokens  = 512
	AheadJumpsPerSec = 20
)

// jumpBucket bounds the jumps sent at once: a token bucket of
// AheadJumpsPerSec tokens a second, holding at most as many.
type jumpBucket struct {
	mu     sync.Mutex
	tokens float64
	at     time.Time // when tokens was last filled
}

// take spends a token at now, if one is left.
func (b *jumpBucket) take(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.at.IsZero() {
		b.tokens = AheadJumpsPerSec
	} else if dt := now.Sub(b.at); dt > 0 {
		b.tokens = min(b.tokens+dt.Seconds()*AheadJumpsPerSec, AheadJumpsPerSec)
	}
	if now.After(b.at) {
		b.at = now
	}
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
