package evidence

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
