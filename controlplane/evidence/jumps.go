package evidence

// A router's report that moves a worker's prompt tokens ahead by
// AheadJumpTokens or more (about 25 ms of prefill) is a jump: the other
// routers mispredict the worker until they hear of it, so it goes to them
// at once, not on the load grid; at most AheadJumpsPerSec over the fleet (a
// burst of as many), as each reaches every router.
const (
	AheadJumpTokens  = 512
	AheadJumpsPerSec = 20
)
