package watch

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

func TestHeartbeatCarriesRevisionThroughQuietSpells(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := registry.New(testEpoch, 0)
		put(t, reg, newWorker("w1"))
		s := NewServer(reg, Options{HeartbeatInterval: time.Second}, nil, nil)
		fs := serveFake(t, s, &smgv1.WatchHello{RouterId: "r1"})
		<-fs.sent // snapshot

		time.Sleep(time.Second - time.Millisecond) // fake time: just short of the interval
		synctest.Wait()
		select {
		case m := <-fs.sent:
			t.Fatalf("sent %v before the heartbeat interval", m)
		default:
		}

		start := time.Now()
		m := <-fs.sent
		if m.GetHeartbeat() == nil || m.Revision != reg.Revision() || m.Epoch != testEpoch {
			t.Fatalf("got %v, want heartbeat at %s/%d", m, testEpoch, reg.Revision())
		}
		if waited := time.Since(start); waited != time.Millisecond {
			t.Fatalf("heartbeat came %v after the check, want 1ms", waited)
		}

		// A delta restarts the quiet spell.
		time.Sleep(500 * time.Millisecond)
		rev := setOverloaded(t, reg, "w1", true)
		if m := <-fs.sent; m.GetDelta() == nil || m.Revision != rev {
			t.Fatalf("got %v, want delta", m)
		}
		start = time.Now()
		if m := <-fs.sent; m.GetHeartbeat() == nil || m.Revision != rev {
			t.Fatalf("got %v, want heartbeat at %d", m, rev)
		}
		if waited := time.Since(start); waited != time.Second {
			t.Fatalf("heartbeat %v after the delta, want 1s", waited)
		}
	})
}
