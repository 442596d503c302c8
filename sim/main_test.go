package sim

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that closed servers leave no goroutine behind (listeners,
// schedulers, handlers, duration timers). Idle keep-alive connections of the
// tests' HTTP clients are theirs, not the simulator's.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"))
}
